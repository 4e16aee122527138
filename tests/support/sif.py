"""The app SIF used the way HPC users do, as a non-root user with apptainer: the fixtures of tests/sif and tests/arm64.

Where the host has no apptainer, the tests run it in the SIF builder helper container (recipes/builder), started
with FUSE and user-namespace permissions, the SIF directory mounted, commands run as the unprivileged user tfhpc.
The helper is of the host's architecture; a SIF of another one (ARCH=arm64) runs in it through binfmt_misc.
"""
import pytest
import testinfra

from support.stack import CONFIG, LEAF, MANIFEST
from tfhpc.apptainer import helper_image_name, start_helper
from tfhpc.sif import SIF_DIR, sif_path


@pytest.fixture(scope="session")
def sif():
    path = sif_path(CONFIG, LEAF)
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make sif{f' ARCH={CONFIG.arch}' if CONFIG.arch_suffix else ''}` first")
    return path


@pytest.fixture(scope="session")
def apptainer_container(sif):
    container = start_helper(helper_image_name(MANIFEST, CONFIG), ["sleep", "infinity"], {str(SIF_DIR): "/sif:ro"})
    # The device node keeps the host's mode (often 0600): the unprivileged user needs it for squashfuse.
    container.exec_run(["chmod", "0666", "/dev/fuse"], user="root")
    try:
        yield container
    finally:
        container.remove(force=True)


@pytest.fixture(scope="session")
def user_host(apptainer_container):
    """testinfra host: the helper container, as the unprivileged user tfhpc (uid 1000)."""
    return testinfra.get_host(f"docker://tfhpc@{apptainer_container.id}")


@pytest.fixture(scope="session")
def in_sif(sif):
    return f"/sif/{sif.name}"
