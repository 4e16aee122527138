"""Host MPIs for the site tests (tests/sites) and the Slurm cluster (tests/cluster): tfhpc/sitempi.py installs the
pinned wheels into build/site-mpi/, mounted at MOUNT in every test container, and Open MPI 6, which has no wheel,
from Debian sid's packages into a prefix beside them."""
from support.stack import CONFIG, MANIFEST
from tfhpc import sitempi
from tfhpc.sitempi import MOUNT, SITE_MPI_DIR, in_containers  # noqa: F401 (the tests import them from here)

# How MPI_Get_library_version begins in each host MPI the tests install.
LIBRARY_VERSIONS = {"mpich": "MPICH Version:", "impi-rt": "Intel(R) MPI Library", "openmpi6": "Open MPI v6."}


def install_site_mpi(name, package=None):
    return sitempi.install(MANIFEST, name, package)


def install_host_mpi(name):
    """The prefix of host MPI `name` of LIBRARY_VERSIONS (Open MPI 6 on the OS root of this stack's MPI=abi image)."""
    return sitempi.install_host(MANIFEST, name, MANIFEST.config(CONFIG.stack, CONFIG.flavor, "abi"))
