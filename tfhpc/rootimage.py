"""The OS root image under the base layer: from a registry, or made with debootstrap and `docker import`.

BASE_SOURCE=registry   the distribution's image (versions.toml: registry_image), pulled when not present locally.
BASE_SOURCE=debootstrap a minimal root file system from the Debian mirror, imported as tfhpc-root:<distro>-<release>;
                        for machines that reach no container registry (air-gapped sites, this project's CI).
BASE_SOURCE=auto        the registry image when it is present or can be pulled, else debootstrap; says which.

Another architecture than the default (ARCH=arm64) takes its root from debootstrap --arch, run under emulation where
the host is another machine (emulation.py), imported as tfhpc-root:<distro>-<release>-<arch>. Its registry image is
not pulled: the registry's tag names a multi-platform index, and pulling another platform under the same local tag
would move that tag away from the default architecture's image.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import docker.errors

from .common import REPO_ROOT, UserError, log
from .dockerhost import build_cli, client
from .manifest import Config, check_base_source

ROOTFS_WORKDIR = REPO_ROOT / "build" / "rootfs"


def _local_image(name: str):
    try:
        return client().images.get(name)
    except docker.errors.ImageNotFound:
        return None


def _pull(name: str) -> str | None:
    """Pull `name`; None (and the reason, logged) when the registry cannot be reached."""
    repository, _, tag = name.partition(":")
    try:
        client().images.pull(repository, tag=tag or "latest")
        return name
    except (docker.errors.APIError, OSError) as error:
        reason = str(error).splitlines()[0][:200]
        log(f"cannot pull {name}: {reason}")
        return None


def debootstrap_root(config: Config, mirror: str | None = None) -> str:
    """Make (once) the root image with debootstrap from the Debian mirror and import it into docker."""
    name = config.debootstrap_root_image
    if _local_image(name):
        return name
    if config.os["distro"] != "debian":
        raise UserError(f"BASE_SOURCE=debootstrap supports Debian roots only, not {config.os['distro']}: use BASE_SOURCE=registry")
    if shutil.which("debootstrap") is None:
        raise UserError("debootstrap not found: install it (apt-get install debootstrap) or use BASE_SOURCE=registry")
    if os.geteuid() != 0:
        raise UserError("debootstrap needs root: run 'make image' as root, or use BASE_SOURCE=registry")
    mirror = mirror or config.os["apt_mirror"]
    ROOTFS_WORKDIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=ROOTFS_WORKDIR) as workdir:
        rootfs = Path(workdir) / "rootfs"
        log(f"debootstrap {config.os_release} ({config.arch}) from {mirror} (a few minutes; longer emulated)")
        # --arch: Debian's architecture name is the docker platform's (amd64, arm64). On another host, debootstrap's
        # second stage runs the target's programs in the chroot through the binfmt_misc handler that build_stack
        # checked (qemu-debootstrap is no longer needed: Debian 12's debootstrap does this itself).
        result = subprocess.run(["debootstrap", "--variant=minbase", f"--arch={config.arch}", config.os_release,
                                 str(rootfs), mirror],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if result.returncode != 0:
            tail = " | ".join(result.stderr.strip().splitlines()[-2:])
            raise UserError(f"debootstrap of {config.os_release} from {mirror} failed ({tail}): check APT_MIRROR")
        # Package lists and caches are not part of an image root; the base layer fetches fresh lists.
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (rootfs / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        archive = Path(workdir) / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(rootfs, arcname=".")
        repository, _, tag = name.partition(":")
        if config.arch_suffix:
            import_foreign_root(config, archive, name)
        else:
            client().api.import_image(src=str(archive), repository=repository, tag=tag,
                                      changes=['CMD ["/bin/bash"]'])
    log(f"imported the debootstrap root as {name}")
    return name


# The root of another architecture, from the debootstrap archive, as a one-step BuildKit build: an imported image
# claims the daemon's architecture whatever `docker import --platform` says (that flag needs an experimental daemon
# before Docker 23), and BuildKit then refuses it as the base of a --platform linux/arm64 build, looking for it in a
# registry instead.
FOREIGN_ROOT_DOCKERFILE = """FROM scratch
ADD rootfs.tar /
CMD ["/bin/bash"]
"""


def import_foreign_root(config: Config, archive: Path, name: str) -> None:
    """Make `name`, for `config`'s platform, from the root file system `archive` (a tar named rootfs.tar)."""
    (archive.parent / "Dockerfile").write_text(FOREIGN_ROOT_DOCKERFILE)
    context = archive.parent
    (context / ".dockerignore").write_text("*\n!rootfs.tar\n")  # the debootstrap tree beside it stays out
    status = build_cli().run(["--quiet", "--platform", config.platform, "--tag", name, str(context)])
    if status != 0:
        raise UserError(f"making {name} from the {config.arch} debootstrap root failed (build log above)")


def resolve_root(config: Config, base_source: str) -> str:
    base_source = check_base_source(base_source)
    registry_image = config.registry_root_image
    if config.arch_suffix:
        if base_source == "registry":
            raise UserError(f"BASE_SOURCE=registry is not supported for ARCH={config.arch} (pulling it would move the "
                            f"local tag {registry_image} to another platform): use BASE_SOURCE=debootstrap or auto")
        if base_source == "auto":
            log(f"BASE_SOURCE=auto chose debootstrap for ARCH={config.arch} (registry roots: default arch only)")
        return debootstrap_root(config)
    if base_source == "registry":
        if _local_image(registry_image) or _pull(registry_image):
            return registry_image
        raise UserError(f"cannot get {registry_image} from its registry: use BASE_SOURCE=debootstrap (or auto)")
    if base_source == "debootstrap":
        return debootstrap_root(config)
    if _local_image(registry_image) or _pull(registry_image):
        log(f"BASE_SOURCE=auto chose the registry image {registry_image}")
        return registry_image
    log("BASE_SOURCE=auto chose debootstrap (no registry image available)")
    return debootstrap_root(config)
