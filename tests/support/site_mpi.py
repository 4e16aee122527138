"""Host MPIs for the site tests (tests/sites) and the Slurm cluster (tests/cluster): tfhpc/sitempi.py installs the
pinned wheels into build/site-mpi/, mounted at MOUNT in every test container."""
from support.stack import MANIFEST
from tfhpc import sitempi
from tfhpc.sitempi import MOUNT, SITE_MPI_DIR, in_containers  # noqa: F401 (the tests import them from here)


def install_site_mpi(name, package=None):
    return sitempi.install(MANIFEST, name, package)
