"""The build host's own compilers for an emulated build (an arm64 image built on an x86_64 host).

Under emulation every program of a build runs through qemu-user: compiling mpi4py took 20 minutes, Horovod about an
hour (docs/arm64.md). The Dockerfiles that compile (containers/mpi, containers/horovod) have a `cross` stage built for
the build host's platform from its OS root of the same Debian release, with Debian's cross compilers for the image's
architecture; their builder stages run the compile through containers/cross/cross-env, which puts those compilers
first. This module gives those Dockerfiles the two build arguments: CROSS_IMAGE (the host's OS root) and
CROSS_TRIPLET (the image's GNU triplet). A native build passes neither, and the `cross` stage is then empty.
"""
from __future__ import annotations

import re

from .common import REPO_ROOT, log
from .emulation import host_arch, host_machine, needs_emulation
from .manifest import Config, Manifest
from .rootimage import resolve_root


def triplet(config: Config) -> str:
    """Debian's GNU triplet of the configuration's machine, as its cross compiler packages name it."""
    return f"{config.machine}-linux-gnu"


def uses_cross(layer: str) -> bool:
    """Whether containers/<layer>/Dockerfile has the `cross` stage (its compiles run through cross-env)."""
    dockerfile = REPO_ROOT / "containers" / layer / "Dockerfile"
    return re.search(r"^FROM .* AS cross$", dockerfile.read_text(), re.MULTILINE) is not None


def cross_args(config: Config, base_source: str, manifest: Manifest | None = None) -> dict[str, str]:
    """CROSS_IMAGE and CROSS_TRIPLET for an emulated build whose host is an architecture of versions.toml, else {}
    (a native build, or a host the manifest has no root for: the compile is then emulated too)."""
    if not needs_emulation(config):
        return {}
    manifest = manifest or Manifest()
    arch = host_arch(manifest)
    if arch is None:
        log(f"no architecture of versions.toml is this host's ({host_machine()}): the compiles are emulated too")
        return {}
    host_config = manifest.config(config.stack, config.flavor, config.mpi, arch=arch, host_tools=True)
    root = resolve_root(host_config, base_source)
    log(f"compiling with the host's {triplet(config)} cross compilers (on {root}), natively")
    return {"CROSS_IMAGE": root, "CROSS_TRIPLET": triplet(config)}
