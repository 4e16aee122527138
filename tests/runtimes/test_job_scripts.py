"""The pyxis and Container Engine job scripts (scripts/slurm/horovod-pyxis.sbatch, horovod-edf.sbatch), run with a
stand-in `srun` that records its arguments: neither pyxis nor the Container Engine can run here. No docker."""
import subprocess

import pytest

from support.stack import MANIFEST, REPO_ROOT
from tfhpc.edf import write_edf

SLURM = REPO_ROOT / "scripts" / "slurm"


@pytest.fixture
def fake_srun(tmp_path):
    """A bin directory whose `srun` writes its arguments, one a line, to srun.args."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path / 'srun.args'}\n")
    srun.chmod(0o755)
    return tmp_path


def run_job(script, fake_srun, environment, *arguments):
    env = {"PATH": f"{fake_srun / 'bin'}:/usr/bin:/bin", "HOME": str(fake_srun), "SLURM_JOB_NUM_NODES": "2",
           "SLURM_NTASKS": "2", "SLURM_CPUS_PER_TASK": "2", **environment}
    done = subprocess.run(["bash", str(SLURM / script), *arguments], capture_output=True, text=True, env=env,
                          cwd=fake_srun, timeout=60)
    args_file = fake_srun / "srun.args"
    return done, args_file.read_text().splitlines() if args_file.exists() else None


def test_pyxis_job_runs_the_squashfs_with_pmix(fake_srun):
    sqsh = fake_srun / "tfhpc-app.sqsh"
    sqsh.write_bytes(b"hsqs")
    scratch = fake_srun / "scratch"
    done, args = run_job("horovod-pyxis.sbatch", fake_srun, {"TFHPC_SQSH": str(sqsh), "SCRATCH": str(scratch)})
    assert done.returncode == 0, done.stderr
    assert args == ["--mpi=pmix", f"--container-image={sqsh}", f"--container-mounts={scratch}:{scratch}",
                    f"--container-workdir={scratch}", "--no-container-entrypoint", "tfhpc-smoke-collectives"]


def test_pyxis_job_takes_the_command_and_pmi2(fake_srun):
    sqsh = fake_srun / "x.sqsh"
    sqsh.write_bytes(b"hsqs")
    done, args = run_job("horovod-pyxis.sbatch", fake_srun, {"TFHPC_SQSH": str(sqsh), "TFHPC_SRUN_MPI": "pmi2"},
                         "tfhpc-train-hvd-fit", "--epochs", "2")
    assert done.returncode == 0, done.stderr
    assert args[0] == "--mpi=pmi2" and args[-3:] == ["tfhpc-train-hvd-fit", "--epochs", "2"]


def test_pyxis_job_without_image_says_what_to_set(fake_srun):
    done, args = run_job("horovod-pyxis.sbatch", fake_srun, {})
    assert done.returncode != 0 and args is None
    assert "TFHPC_SQSH" in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("mpi, plugin", [("openmpi", "pmix"), ("mpich", "pmi2")])
def test_edf_job_takes_srun_mpi_from_the_edf(fake_srun, mpi, plugin):
    edf = write_edf(MANIFEST, MANIFEST.config(mpi=mpi), output=fake_srun / "tfhpc.toml")
    done, args = run_job("horovod-edf.sbatch", fake_srun, {"TFHPC_EDF": str(edf)})
    assert done.returncode == 0, done.stderr
    assert args == [f"--mpi={plugin}", f"--environment={edf}", "tfhpc-smoke-collectives"]
