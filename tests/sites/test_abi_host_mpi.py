"""The MPI=abi image (the MPI 5.0 standard ABI: its mpi4py and Horovod load libmpi_abi.so.1) with its own MPI and with
a site's: PyPI's MPICH 5 and Intel MPI, and Open MPI 6 (Debian sid's release candidate packages; versions.toml's
[site_mpi] pins), three implementations whose libmpi_abi.so.1 the same binaries run on, each launched by its own
launcher (hydra `mpiexec -n 2`; Open MPI 6's `prterun -n 2`) with TFHPC_HOST_MPI=<prefix>:

- in Docker: `docker run -e TFHPC_HOST_MPI=P -v P:P:ro IMAGE P/bin/mpiexec -n 2 CMD`;
- from the SIF: `P/bin/mpiexec -n 2 apptainer run -B P --env TFHPC_HOST_MPI=P IMAGE.sif CMD` (the launcher finds
  its own libraries by LD_LIBRARY_PATH=P/lib, as a site's module sets it);
- the image's own MPI (the wheel's libmpi_abi.so.1 in /opt/venv/lib): `mpirun -np 2 CMD` in Docker and in the SIF.

One run per case (module-scoped: the doctor, Horovod's collectives, then a 2-rank Keras training); checked on every
rank: the doctor names the library the rank loaded (the host's by path under its prefix, with its
MPI_Get_library_version; the image's as the image's), Horovod's collectives are exact, float16 included (a
user-defined op on a derived datatype: handles of the standard ABI, pointers, in Horovod's MPI path), and the
training's loss falls with equal weights on both ranks. Intel MPI runs over shared memory (I_MPI_FABRICS=shm): its
wheel has no libfabric and the MPI=abi image carries none outside the MPICH wheel's directory. Bad input: a prefix
of another ABI, or of the standard ABI under an earlier soname, is refused in one line.
"""
import os
import shutil
import subprocess

import pytest

from site_helpers import DTYPES, SIZES, SMOKE, check, doctor_reports
from support.collectives import check_collective_reports
from support.results import results
from support.site_mpi import LIBRARY_VERSIONS, MOUNT, SITE_MPI_DIR, in_containers, install_host_mpi

IMAGE_LIBRARY = "/opt/venv/lib/libmpi_abi.so.1"
# The host MPIs of the standard ABI, with how MPI_Get_library_version begins in each.
ABI_HOST_MPIS = LIBRARY_VERSIONS
# Each host MPI's launcher under its prefix, and what it needs beside TFHPC_HOST_MPI here (see the docstring;
# PMIx 7 warns on every rank that its compression plugins, outside the prefix, are missing).
LAUNCHERS = {"mpich": "bin/mpiexec -n 2", "impi-rt": "bin/mpiexec -n 2", "openmpi6": "bin/prterun -n 2"}
HOST_ENVIRONMENT = {"mpich": {}, "impi-rt": {"I_MPI_FABRICS": "shm"},
                    "openmpi6": {"PMIX_MCA_pcompress_base_silence_warning": "1"}}
# A host MPI in Docker is the full tier's: the SIF's case loads the same library by the same code
# (tfhpc_runtime/hostenv.py) under the launcher a site runs, and Docker's own run is the image's MPI.
IN_DOCKER = pytest.mark.full("the same host library from the SIF; Docker: the image's own MPI")
# The image's own MPI from the SIF likewise: the same library and code as its Docker run, and the SIF's start of the
# MPI=abi image is every host MPI's run from it.
OWN_IN_SIF = pytest.mark.full("the image's own MPI: its Docker run; the SIF: each host MPI's run from it")
CASES = [pytest.param(mpi, where, marks=[IN_DOCKER] if mpi != "image" and where == "docker" else
                      [OWN_IN_SIF] if mpi == "image" and where == "sif" else [])
         for mpi in ("image", *sorted(ABI_HOST_MPIS)) for where in ("docker", "sif")]


TRAIN = "tfhpc-smoke-train --epochs 3"


def commands(launch):
    """The doctor, the collectives, then a 2-rank Keras training, each under one launch (one PMI wire-up each)."""
    return " && ".join(f"{launch} {command}" for command in ("tfhpc-doctor --json", SMOKE, TRAIN))


def docker_run(image, environment, command, timeout=600):
    argv = ["docker", "run", "--rm", "--label", "io.tfhpc.test-runtime=sites", "-v", f"{SITE_MPI_DIR}:{MOUNT}:ro",
            *[a for k, v in environment.items() for a in ("-e", f"{k}={v}")], image, *command]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return result.returncode, result.stdout + result.stderr


def run_case(mpi, where, image, sif, helper, site_mpis):
    if mpi == "image":
        if where == "docker":
            return docker_run(image, {}, ["bash", "-c", commands("mpirun -np 2")])
        return helper(f"apptainer run {sif} bash -c {commands('mpirun -np 2')!r}", timeout=600)
    inside = in_containers(site_mpis[mpi])
    environment = {"TFHPC_HOST_MPI": inside, **HOST_ENVIRONMENT[mpi]}
    launcher = f"{inside}/{LAUNCHERS[mpi]}"
    if where == "docker":
        return docker_run(image, environment, ["bash", "-c", commands(launcher)])
    env = ",".join(f"{k}={v}" for k, v in environment.items())
    outside = " ".join(f"{k}={v}" for k, v in {"LD_LIBRARY_PATH": f"{inside}/lib", **HOST_ENVIRONMENT[mpi]}.items())
    return helper(commands(f"env {outside} {launcher} apptainer run -B {MOUNT} --env {env} {sif}"), timeout=600)


@pytest.fixture(scope="module")
def abi_site_mpis(site_mpis):
    """site_mpis and Open MPI 6's prefix (built from Debian sid's packages on the MPI=abi image's OS root)."""
    return {**site_mpis, "openmpi6": install_host_mpi("openmpi6")}


@pytest.fixture(scope="module")
def runs(abi_image, abi_sif, helper, abi_site_mpis):
    """{(mpi, where): (exit status, output)}, each case run once, on first use."""
    done = {}

    def get(mpi, where):
        if (mpi, where) not in done:
            done[mpi, where] = run_case(mpi, where, abi_image, abi_sif, helper, abi_site_mpis)
        return done[mpi, where]
    return get


@pytest.mark.parametrize("mpi, where", CASES)
def test_the_doctor_names_the_library_each_rank_loaded(runs, abi_site_mpis, mpi, where):
    rc, out = runs(mpi, where)
    assert rc == 0, out[-3000:]
    reports = doctor_reports(out)
    assert sorted(reports) == [0, 1], out[-3000:]
    for report in reports.values():
        library = check(report, "mpi", "library")
        assert library["status"] == "ok", library
        facts = report["facts"]["mpi_library"]
        if mpi == "image":
            assert facts["paths"] == [IMAGE_LIBRARY], facts
            assert facts["version"].startswith("MPICH Version:"), facts
            assert library["detail"].startswith("the image's MPI"), library
        else:
            prefix = in_containers(abi_site_mpis[mpi])
            assert facts["paths"] and all(p.startswith(prefix + "/") and p.endswith("/libmpi_abi.so.1")
                                          for p in facts["paths"]), facts
            assert facts["version"].startswith(ABI_HOST_MPIS[mpi]), facts
            assert library["detail"].startswith(f"host MPI from TFHPC_HOST_MPI={prefix}"), library
        assert facts["abi"] == "1.0" and library["detail"].endswith("(MPI standard ABI 1.0)"), library
        assert check(report, "launcher", "world size")["status"] == "ok"


@pytest.mark.parametrize("mpi, where", CASES)
def test_horovod_collectives_are_exact(runs, mpi, where):
    rc, out = runs(mpi, where)
    assert rc == 0, out[-3000:]
    collectives = [r for r in results(out) if "losses" not in r]  # beside the training's RESULT lines
    assert [r["rank"] for r in collectives] == [0, 1], out[-3000:]
    check_collective_reports(collectives, 2, SIZES, DTYPES, controller="mpi")


@pytest.mark.parametrize("mpi, where", CASES)
def test_two_rank_training_ends_with_equal_weights(runs, mpi, where):
    rc, out = runs(mpi, where)
    assert rc == 0, out[-3000:]
    trained = [r for r in results(out) if "losses" in r]  # tfhpc-smoke-train's RESULT lines
    assert [(r["rank"], r["size"]) for r in trained] == [(0, 2), (1, 2)], out[-3000:]
    for report in trained:
        assert report["max_weight_difference_across_ranks"] == 0.0, report
        assert report["losses"][-1] < 0.5 * report["losses"][0], report["losses"]


@pytest.fixture
def earlier_soname_prefix(site_mpis):
    """A prefix (under build/site-mpi, mounted in the containers) whose standard-ABI library has MPICH 5.0.0/5.0.1's
    soname, libmpi_abi.so.0: the MPICH wheel's library under that name."""
    prefix = SITE_MPI_DIR / ".abi-soname-0"
    shutil.rmtree(prefix, ignore_errors=True)
    (prefix / "lib").mkdir(parents=True)
    shutil.copy(site_mpis["mpich"] / "lib" / "libmpi_abi.so.1", prefix / "lib" / "libmpi_abi.so.0")
    try:
        yield prefix
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


@pytest.mark.parametrize("prefix_of, words", [
    ("openmpi", ["libmpi.so.40", "Open MPI", "MPI=openmpi", "libmpi_abi.so.1"]),
    ("earlier", ["libmpi_abi.so.0", "MPICH 5.0.0 or 5.0.1", "libmpi_abi.so.1", "MPICH 5.0 after 5.0.1"]),
])
def test_a_library_of_another_abi_or_soname_is_refused_in_one_line(abi_image, site_mpis, earlier_soname_prefix,
                                                                   prefix_of, words):
    prefix = earlier_soname_prefix if prefix_of == "earlier" else site_mpis[prefix_of]
    rc, out = docker_run(abi_image, {"TFHPC_HOST_MPI": f"{MOUNT}/{os.path.basename(prefix)}"},
                         ["tfhpc-smoke-collectives"], timeout=120)
    lines = [line for line in out.splitlines() if line.strip()]
    assert rc != 0 and len(lines) == 1, out[-3000:]
    assert all(word in lines[0] for word in words), lines
