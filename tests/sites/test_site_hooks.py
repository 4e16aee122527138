"""A site's own MPI hook, without TFHPC_HOST_MPI: what Sarus's and Shifter's MPI support and podman-hpc's mpich module
do, on the MPICH image and SIF, whose mpi4py and Horovod load their MPI by the MPICH ABI's name libmpi.so.12
(containers/mpi/Dockerfile). Host MPIs: PyPI's MPICH 5 and Intel MPI (versions.toml's [site_mpi]), each launched by its
own hydra `mpiexec -n 2`. Two forms:

- path: the host library directory first on LD_LIBRARY_PATH (Shifter, podman-hpc), in Docker;
- bind: the host's libmpi.so.12 bound over the image's, where its ld cache points (Sarus's hook reads the container's
  `ldconfig -p`): PyPI MPICH's /opt/venv/lib/libmpi.so.12, Debian's /usr/lib/x86_64-linux-gnu/libmpi.so.12, in Docker
  (`docker run -v host.so:container-path`) and from the SIF (`apptainer run -B host.so:container-path`), with what
  that library needs from its own directory (PyPI MPICH: libfabric and UCX in lib/mpich, its RUNPATH $ORIGIN/mpich)
  bound next to it, as such hooks bind a library's dependencies.

One run per form and MPI (module-scoped: the doctor, then Horovod's collectives, under the host's mpiexec); checked on
every rank: mpi4py's MPI_Get_library_version is the host MPI's, the doctor names the host library it loaded (by path,
or the host file mounted over the image's), and Horovod's collectives are exact.
"""
import subprocess

import pytest

from site_helpers import DTYPES, HOST_MPIS, MPICH_CONFIG, SIZES, SMOKE, check, doctor_reports
from support.collectives import check_collectives
from support.site_mpi import MOUNT, SITE_MPI_DIR, in_containers

# The directory of the MPICH image's libmpi.so.12 (containers/mpi/Dockerfile): PyPI's wheel in the venv, else Debian's.
IMAGE_LIBRARY_DIR = "/opt/venv/lib" if MPICH_CONFIG.mpi_wheel else "/usr/lib/x86_64-linux-gnu"
DEPENDENCIES = {"mpich": "mpich"}   # lib/<dir> that the host library's RUNPATH ($ORIGIN/<dir>) needs next to it
FORMS = [("path", "docker"), ("bind", "docker"), ("bind", "sif")]


def binds(name, prefix):
    """{host path: container path} of the bind form: the library over the image's, and its dependencies next to it."""
    inside = in_containers(prefix)
    mounts = {f"{inside}/lib/libmpi.so.12": f"{IMAGE_LIBRARY_DIR}/libmpi.so.12"}
    if name in DEPENDENCIES:
        mounts[f"{inside}/lib/{DEPENDENCIES[name]}"] = f"{IMAGE_LIBRARY_DIR}/{DEPENDENCIES[name]}"
    return mounts


def commands(launch):
    """The doctor, then the collectives, each under the host's mpiexec (one PMI wire-up each)."""
    return " && ".join(f"{launch} {command}" for command in ("tfhpc-doctor --json", SMOKE))


def run_in_docker(image, name, prefix, form):
    inside = in_containers(prefix)
    options = ["-v", f"{SITE_MPI_DIR}:{MOUNT}:ro"]
    if form == "path":
        options += ["-e", f"LD_LIBRARY_PATH={inside}/lib"]
    else:
        # docker -v takes host paths: the library's and its dependencies' under build/site-mpi
        for source, target in binds(name, prefix).items():
            options += ["-v", f"{SITE_MPI_DIR}{source[len(MOUNT):]}:{target}:ro"]
    argv = ["docker", "run", "--rm", "--label", "io.tfhpc.test-runtime=sites", *options, image,
            "bash", "-c", commands(f"{inside}/bin/mpiexec -n 2")]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    return result.returncode, result.stdout + result.stderr


def run_in_sif(helper, sif, name, prefix):
    bound = " ".join(f"-B {source}:{target}" for source, target in binds(name, prefix).items())
    launch = f"{in_containers(prefix)}/bin/mpiexec -n 2 apptainer run -B {MOUNT} {bound} {sif}"
    return helper(commands(launch), timeout=600)


# The bind form in Docker repeats the SIF's (the same library mounted over the image's, by another runtime's mount):
# the full tier's.
REPEATED = pytest.mark.full("the bind form from the SIF (apptainer -B), the same mounts; the path form in Docker")
# A hook's forms are the runtime's mounts and the loader's path, whichever library they put first: MPICH's proves them
# in the test tier; Intel MPI's library in the image, under its own mpiexec, is tests/sites/test_host_mpi.py's.
OTHER_LIBRARY = pytest.mark.full("the same forms with MPICH's library; Intel MPI's library in the image: "
                                 "test_host_mpi.py")
RUNS = [pytest.param((name, *form), id="-".join((name, *form)),
                     marks=[REPEATED] if form == ("bind", "docker") else [OTHER_LIBRARY] if name != "mpich" else [])
        for name in sorted(HOST_MPIS) for form in FORMS]


@pytest.fixture(scope="module", params=RUNS)
def hooked_run(request, site_mpis, mpich_image, mpich_sif, helper):
    """(host MPI name, its prefix, form, the output of the doctor's run and the collectives' run)."""
    name, form, where = request.param
    prefix = site_mpis[name]
    if where == "docker":
        rc, out = run_in_docker(mpich_image, name, prefix, form)
    else:
        rc, out = run_in_sif(helper, mpich_sif, name, prefix)
    assert rc == 0, out[-4000:]
    return name, prefix, form, out


def test_every_rank_loads_the_host_mpi_and_the_doctor_names_it(hooked_run):
    name, prefix, form, output = hooked_run
    reports = doctor_reports(output)
    assert sorted(reports) == [0, 1], output[-3000:]
    for report in reports.values():
        library = report["facts"]["mpi_library"]
        assert library["version"].startswith(HOST_MPIS[name]), library  # mpi4py's MPI_Get_library_version
        detail = check(report, "mpi", "library")
        assert detail["status"] == "ok", detail
        if form == "path":
            assert library["paths"] and all(p.startswith(in_containers(prefix) + "/") for p in library["paths"])
            assert "a host MPI, not the image's (first on LD_LIBRARY_PATH)" in detail["detail"], detail
        else:
            assert [o["origin"] for o in library["origins"]] == ["mounted"], library
            assert f"{prefix.name}/lib/libmpi.so.12" in library["origins"][0]["from"], library
            assert "a host MPI mounted over the image's library" in detail["detail"], detail
        assert check(report, "launcher", "world size")["status"] == "ok"


def test_horovod_collectives_are_exact_on_the_hooks_mpi(hooked_run):
    *_, output = hooked_run
    check_collectives(output, 2, SIZES, DTYPES, controller="mpi")

