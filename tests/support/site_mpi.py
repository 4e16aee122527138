"""Host MPIs for the site tests (tests/sites) and the Slurm cluster (tests/cluster): tfhpc/sitempi.py installs the
pinned wheels into build/site-mpi/, mounted at MOUNT in every test container. Open MPI 6, which has no wheel, comes
from Debian sid's packages (tests/sites/host-mpi/openmpi6.Dockerfile), copied out into a prefix beside them."""
import io
import os
import shutil
import tarfile
from pathlib import Path

from support.stack import MANIFEST, REPO_ROOT
from tfhpc import sitempi
from tfhpc.common import default_ca_bundle, resolve_ca_bundle
from tfhpc.dockerhost import client
from tfhpc.imagebuild import build_image
from tfhpc.rootimage import resolve_root
from tfhpc.sitempi import MOUNT, SITE_MPI_DIR, in_containers  # noqa: F401 (the tests import them from here)

OPENMPI6_DOCKERFILE = REPO_ROOT / "tests" / "sites" / "host-mpi" / "openmpi6.Dockerfile"


def install_site_mpi(name, package=None):
    return sitempi.install(MANIFEST, name, package)


def install_openmpi6(config):
    """build/site-mpi/openmpi6-<version>: bin/prterun, bin/prted and lib/libmpi_abi.so.1 with the libraries they
    load, from Debian sid's Open MPI 6 packages at versions.toml's [site_mpi] openmpi6, installed on the OS root of
    `config` (the MPI=abi image's); built once, written under a temporary name and renamed."""
    pinned = sitempi.version(MANIFEST, "openmpi6")

    def make(prefix):
        image = build_image(config, OPENMPI6_DOCKERFILE, f"tfhpc-test-openmpi6:{pinned.replace('~', '_')}",
                            resolve_root(config, os.environ.get("BASE_SOURCE") or "auto"),
                            resolve_ca_bundle(default_ca_bundle()),
                            extra_args={"OPENMPI6_PACKAGE_VERSION": pinned})
        staging = SITE_MPI_DIR / f".openmpi6-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        container = client().containers.create(image, command=["true"])
        try:
            stream, _ = container.get_archive("/prefix")
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
                archive.extractall(staging, filter="tar")
            shutil.rmtree(prefix, ignore_errors=True)
            Path(staging, "prefix").rename(prefix)
        finally:
            container.remove(force=True)
            shutil.rmtree(staging, ignore_errors=True)
        return prefix

    return sitempi.once(SITE_MPI_DIR / f"openmpi6-{pinned.replace('~', '_')}", make)
