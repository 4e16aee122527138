"""Site tests: the images run with an MPI that is not the image's, as sites run them.

- Host MPIs are PyPI wheels at the versions of versions.toml's [site_mpi], installed with pip into
  build/site-mpi/<name>-<version>/ (a prefix with bin/ and lib/, as a site's module would have) and reused across runs.
- The bind model (an MPICH-ABI host library in place of the image's): the MPICH stack's app image and SIF, which
  `make test` builds (`make site-images`), with TFHPC_HOST_MPI=<prefix> and the prefix mounted at the same path.
- The Open MPI hybrid launch: the Open MPI SIF started by a host `mpirun` of other Open MPI releases.
Apptainer runs in the SIF builder helper container as the unprivileged user, the site MPIs and SIFs mounted read-only.
"""
import subprocess

import pytest

from site_helpers import ABI_CONFIG, MPICH_CONFIG, OPENMPI_CONFIG
from support.markers import mark_directory
from support.site_mpi import MOUNT, SITE_MPI_DIR, install_site_mpi
from support.stack import CONFIG, LEAF, MANIFEST
from tfhpc.apptainer import helper_image_name, start_helper
from tfhpc.sif import SIF_DIR, sif_path


def pytest_collection_modifyitems(items):
    mark_directory(items, __file__, pytest.mark.image, pytest.mark.sif)


@pytest.fixture(scope="session")
def site_mpis():
    """{name: host prefix} of every site MPI the tests use."""
    SITE_MPI_DIR.mkdir(parents=True, exist_ok=True)
    return {"mpich": install_site_mpi("mpich"), "impi-rt": install_site_mpi("impi-rt"),
            "openmpi": install_site_mpi("openmpi"), "openmpi_orte": install_site_mpi("openmpi_orte", "openmpi")}


def _sif(config):
    path = sif_path(config, LEAF)
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make site-images` (the MPICH stack's SIF) or `make sif MPI=...` first")
    return f"/sif/{path.name}"


@pytest.fixture(scope="session")
def mpich_sif():
    return _sif(MPICH_CONFIG)


@pytest.fixture(scope="session")
def openmpi_sif():
    return _sif(OPENMPI_CONFIG)


def _image(config):
    from tfhpc.dockerhost import client
    import docker.errors
    name = config.image(LEAF)
    try:
        client().images.get(name)
    except docker.errors.ImageNotFound:
        pytest.fail(f"{name} is missing: run `make site-images` first")
    return name


@pytest.fixture(scope="session")
def mpich_image():
    return _image(MPICH_CONFIG)


@pytest.fixture(scope="session")
def abi_image():
    if ABI_CONFIG is None:
        pytest.skip(f"{CONFIG.tag}'s stack and flavour have no MPI=abi image (versions.toml)")
    return _image(ABI_CONFIG)


@pytest.fixture(scope="session")
def abi_sif():
    if ABI_CONFIG is None:
        pytest.skip(f"{CONFIG.tag}'s stack and flavour have no MPI=abi image (versions.toml)")
    return _sif(ABI_CONFIG)


@pytest.fixture(scope="session")
def helper(site_mpis):
    """The apptainer helper container (SIFs and site MPIs mounted) and a function running a shell command in it as the
    unprivileged user: run(command, timeout) -> (exit status, stdout + stderr)."""
    container = start_helper(helper_image_name(MANIFEST, CONFIG), ["sleep", "infinity"],
                             {str(SIF_DIR): "/sif:ro", str(SITE_MPI_DIR): f"{MOUNT}:ro"})
    container.exec_run(["chmod", "0666", "/dev/fuse"], user="root")

    def run(command, timeout=300):
        result = subprocess.run(["docker", "exec", "-u", "tfhpc", "-w", "/tmp", container.id, "timeout", "-k", "10",
                                 str(timeout), "bash", "-c", command], capture_output=True, text=True)
        return result.returncode, result.stdout + result.stderr
    try:
        yield run
    finally:
        container.remove(force=True)
