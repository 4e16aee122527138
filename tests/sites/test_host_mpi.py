"""The bind model: a host MPI of the MPICH ABI family in place of the MPICH image's own, as Cray-style sites run
images (docs/host-mpi.md, "Host MPI in the image"). Host MPIs: PyPI's MPICH 5 (`mpich`) and Intel MPI (`impi-rt`), at
versions.toml's [site_mpi] pins, each launched by its own hydra `mpiexec`, with TFHPC_HOST_MPI=<prefix>:

- in Docker: `docker run -e TFHPC_HOST_MPI=P -v P:P:ro IMAGE P/bin/mpiexec -n 2 CMD`;
- from the SIF: `P/bin/mpiexec -n 2 apptainer run -B P --env TFHPC_HOST_MPI=P IMAGE.sif CMD` (the hybrid launch).

Checked on every rank: the doctor names the host library as the one loaded (by path and MPI_Get_library_version);
Horovod's collectives exact, float16 (a user-defined op on a derived datatype in Horovod's MPI path) included; 2-rank
Keras training ends with equal weights on both ranks and a falling loss. Bad input: another ABI's library, a missing
prefix: one line, non-zero exit, no rank left running.
"""
import shlex
import subprocess

import pytest

from site_helpers import DTYPES, HOST_MPIS, SIZES, SMOKE, check, doctor_reports
from support.collectives import check_collectives
from support.results import results
from support.site_mpi import MOUNT, SITE_MPI_DIR, in_containers
TRAIN = ("tfhpc-train-hvd-fit --epochs 2 --train-samples 1000 --test-samples 200 --model mlp --verbose 0 "
         "--intra-threads 1")


def docker_run(image, prefix, command, timeout=300, environment=None):
    """`command` (a list) in the MPICH image with the host MPI at `prefix` (a build/site-mpi directory)."""
    env = {"TFHPC_HOST_MPI": in_containers(prefix), **(environment or {})}
    argv = ["docker", "run", "--rm", "--label", "io.tfhpc.test-runtime=sites", "-v", f"{SITE_MPI_DIR}:{MOUNT}:ro",
            *[a for k, v in env.items() for a in ("-e", f"{k}={v}")], image, *command]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return result.returncode, result.stdout + result.stderr


def in_docker(image, prefix, command, **options):
    return docker_run(image, prefix, [f"{in_containers(prefix)}/bin/mpiexec", "-n", "2", *shlex.split(command)],
                      **options)


def in_sif(helper, sif, prefix, command, timeout=300, environment=None):
    inside = in_containers(prefix)
    env = ",".join(f"{k}={v}" for k, v in {"TFHPC_HOST_MPI": inside, **(environment or {})}.items())
    return helper(f"{inside}/bin/mpiexec -n 2 apptainer run -B {MOUNT} --env {env} {sif} {command}", timeout=timeout)


def check_host_library(output, prefix, banner):
    reports = doctor_reports(output)
    assert sorted(reports) == [0, 1], output[-3000:]
    for report in reports.values():
        library = check(report, "mpi", "library")
        assert library["status"] == "ok", library
        paths = report["facts"]["mpi_library"]["paths"]
        assert paths and all(p.startswith(in_containers(prefix) + "/") for p in paths), paths
        assert report["facts"]["mpi_library"]["version"].startswith(banner), report["facts"]["mpi_library"]
        assert check(report, "launcher", "world size")["status"] == "ok"


def check_training(output):
    found = results(output)
    assert sorted(r["rank"] for r in found) == [0, 1], output[-3000:]
    for result in found:
        assert not result["failures"], result
        assert result["max_weight_difference_across_ranks"] == 0.0, result
        losses = result["losses"]
        assert losses[-1] < losses[0], losses


# The doctor's and the collectives' runs with a host MPI in Docker are the full tier's, as in test_abi_host_mpi.py:
# the SIF's runs load the same library by the same code; Docker's: the training below.
IN_DOCKER = pytest.mark.full("the same host library from the SIF; in Docker: test_keras_training_on_the_host_mpi")
WHERE = [pytest.param("docker", marks=IN_DOCKER), "sif"]


@pytest.fixture(scope="module", params=sorted(HOST_MPIS))
def host_mpi(request, site_mpis):
    return request.param, site_mpis[request.param]


@pytest.mark.parametrize("where", WHERE)
def test_the_host_mpi_is_the_one_loaded(host_mpi, where, mpich_image, mpich_sif, helper):
    name, prefix = host_mpi
    if where == "docker":
        rc, out = in_docker(mpich_image, prefix, "tfhpc-doctor --json")
    else:
        rc, out = in_sif(helper, mpich_sif, prefix, "tfhpc-doctor --json")
    assert rc == 0, out[-3000:]
    check_host_library(out, prefix, HOST_MPIS[name])


@pytest.mark.parametrize("where", WHERE)
def test_horovod_collectives_are_exact_on_the_host_mpi(host_mpi, where, mpich_image, mpich_sif, helper):
    name, prefix = host_mpi
    if where == "docker":
        rc, out = in_docker(mpich_image, prefix, SMOKE)
    else:
        rc, out = in_sif(helper, mpich_sif, prefix, SMOKE)
    assert rc == 0, out[-3000:]
    check_collectives(out, 2, SIZES, DTYPES, controller="mpi")


def test_keras_training_on_the_host_mpi(host_mpi, mpich_image):
    name, prefix = host_mpi
    rc, out = in_docker(mpich_image, prefix, TRAIN, timeout=600)
    assert rc == 0, out[-3000:]
    check_training(out)


@pytest.mark.parametrize("where", [pytest.param("docker", marks=pytest.mark.full(
    "the same TFHPC_HOST_LIBS code (tfhpc_runtime/hostenv.py) from the SIF")), "sif"])
def test_a_host_libfabric_replaces_the_images(where, site_mpis, mpich_image, mpich_sif, helper):
    """The CXI-hook model: a host libfabric (here PyPI MPICH's libfabric 2.x, lib/mpich/) mounted and put first with
    TFHPC_HOST_LIBS; Intel MPI over OFI (tcp provider) loads it, and Horovod's collectives stay exact."""
    prefix, fabric = site_mpis["impi-rt"], in_containers(site_mpis["mpich"]) + "/lib/mpich"
    environment = {"TFHPC_HOST_LIBS": fabric, "I_MPI_FABRICS": "ofi", "FI_PROVIDER": "tcp"}
    for command, checks in (("tfhpc-doctor --json", "doctor"), (SMOKE, "collectives")):
        if where == "docker":
            rc, out = in_docker(mpich_image, prefix, command, environment=environment)
        else:
            rc, out = in_sif(helper, mpich_sif, prefix, command, environment=environment)
        assert rc == 0, out[-3000:]
        if checks == "collectives":
            check_collectives(out, 2, SIZES, DTYPES, controller="mpi")
            continue
        for report in doctor_reports(out).values():
            transport = check(report, "mpi", "transport")["detail"]
            assert f"libfabric (OFI) ({fabric}/libfabric.so.1" in transport, transport
            providers = check(report, "fabric", "providers")
            assert "tcp" in providers["detail"] and f"{fabric}/libfabric.so.1" in providers["detail"], providers


def test_another_abis_library_is_refused_in_one_line(mpich_image, site_mpis):
    prefix = site_mpis["openmpi"]
    rc, out = docker_run(mpich_image, prefix, ["tfhpc-smoke-collectives"], timeout=120)
    lines = [line for line in out.splitlines() if line.strip()]
    assert rc != 0 and len(lines) == 1, out[-3000:]
    assert "libmpi.so.40" in lines[0] and "MPI=openmpi" in lines[0], lines


def test_a_missing_prefix_is_refused_in_one_line(mpich_image, site_mpis, helper, mpich_sif):
    rc, out = docker_run(mpich_image, site_mpis["mpich"], ["tfhpc-smoke-collectives"], timeout=120,
                         environment={"TFHPC_HOST_MPI": "/opt/cray/pe/mpich/8.1.28/ofi/gnu/12.3"})
    lines = [line for line in out.splitlines() if line.strip()]
    assert rc != 0 and len(lines) == 1 and "no such directory" in lines[0], out[-3000:]
    # Under the host's mpiexec: every rank stops, and the launcher returns (no rank left running).
    inside = in_containers(site_mpis["mpich"])
    rc, out = helper(f"{inside}/bin/mpiexec -n 2 apptainer run --env TFHPC_HOST_MPI=/nonexistent {mpich_sif} "
                     "tfhpc-smoke-collectives", timeout=120)
    assert rc not in (0, 124, 137) and "no such directory" in out, out[-3000:]
