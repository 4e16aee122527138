"""Building and running another architecture's images on this host: qemu-user-static's binfmt_misc handler.

When the target machine (versions.toml [arches.<arch>].machine) is not the host's, the kernel must hand that
machine's programs to an emulator: a binfmt_misc handler named by the architecture's `emulator`, registered with the F
flag (the kernel opens the interpreter once, so it also runs inside containers, whose file systems do not have it).
Debian's qemu-user-static registers such handlers through binfmt-support. ensure_emulation mounts binfmt_misc if it is
not mounted, enables the handler if the package is installed but the handler is not registered, checks it, and says
that the build is emulated; where it cannot, it names the package and the command in one line.
"""
from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

from .common import UserError, log
from .manifest import Config, Manifest

BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
EMULATOR_PACKAGE = "qemu-user-static"
INSTALL_COMMAND = "apt-get install qemu-user-static binfmt-support"


def host_machine() -> str:
    """What `uname -m` says on this host (x86_64, aarch64)."""
    return platform.machine()


def host_arch(manifest: Manifest, machine: str | None = None) -> str | None:
    """The versions.toml architecture whose machine is this host's (x86_64: amd64), or None."""
    machine = machine or host_machine()
    for arch in manifest.arches:
        if manifest.data["arches"][arch]["machine"] == machine:
            return arch
    return None


def host_config(manifest: Manifest, config: Config) -> Config:
    """`config` for this host's architecture: what runs here natively beside an emulated build (the apptainer
    helper, the cross compilers' OS root). `config` itself when the host is none of versions.toml's architectures."""
    arch = host_arch(manifest)
    return config if arch is None else manifest.config(config.stack, config.flavor, config.mpi, arch,
                                                       host_tools=True)


def needs_emulation(config: Config, host: str | None = None) -> bool:
    return config.machine != (host or host_machine())


def parse_handler(text: str) -> dict[str, str]:
    """A binfmt_misc handler file (/proc/sys/fs/binfmt_misc/<name>) as {"enabled": "1"|"0", "interpreter": ...,
    "flags": ...}."""
    entry = {"enabled": "0", "interpreter": "", "flags": ""}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key == "enabled":
            entry["enabled"] = "1"
        elif key == "interpreter":
            entry["interpreter"] = value.strip()
        elif key == "flags:":
            entry["flags"] = value.strip()
    return entry


def handler_problem(entry: dict[str, str]) -> str:
    """Why a parsed handler cannot run a build's programs, or "" when it can."""
    if entry["enabled"] != "1":
        return "is disabled"
    if "F" not in entry["flags"]:
        return (f"lacks the F flag (flags: {entry['flags'] or 'none'}): its interpreter "
                f"{entry['interpreter']} is not found inside containers")
    return ""


def ensure_emulation(config: Config, binfmt_dir: Path = BINFMT_DIR, host: str | None = None, run=subprocess.run,
                     which=shutil.which) -> bool:
    """Make `config`'s architecture runnable here. False when the host is that machine (nothing to do); True when
    emulation is set up and checked. A UserError with the fix when it cannot be."""
    host = host or host_machine()
    if not needs_emulation(config, host):
        return False
    emulator = config.arch_spec.get("emulator", "")
    if not emulator:
        raise UserError(f"ARCH={config.arch} on a {host} host needs emulation, and versions.toml's "
                        f"[arches.{config.arch}] names no 'emulator': add it or build on a {config.machine} host")
    missing = f"{EMULATOR_PACKAGE} is not installed: run `{INSTALL_COMMAND}` as root"
    if not (binfmt_dir / "status").exists():
        result = run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(binfmt_dir)], capture_output=True, text=True)
        if result.returncode != 0 or not (binfmt_dir / "status").exists():
            reason = (result.stderr or "").strip().splitlines()[-1:] or ["no status file"]
            raise UserError(f"ARCH={config.arch} on a {host} host needs binfmt_misc, which cannot be mounted "
                            f"({reason[0]}): as root, `mount -t binfmt_misc binfmt_misc {binfmt_dir}`")
    handler = binfmt_dir / emulator
    if not handler.exists():
        if which(f"{emulator}-static") is None:
            raise UserError(f"ARCH={config.arch} on a {host} host needs emulation, and {missing}")
        if which("update-binfmts") is None:
            raise UserError(f"{emulator}-static is there but binfmt-support is not: run `{INSTALL_COMMAND}` as root")
        run(["update-binfmts", "--enable", emulator], capture_output=True, text=True)
    if not handler.exists():
        raise UserError(f"no binfmt_misc handler {handler} after `update-binfmts --enable {emulator}`: {missing} "
                        f"(or `update-binfmts --import {emulator}`)")
    entry = parse_handler(handler.read_text())
    problem = handler_problem(entry)
    if problem:
        raise UserError(f"the binfmt_misc handler {handler} {problem}: reinstall {EMULATOR_PACKAGE} "
                        f"(`{INSTALL_COMMAND}`), whose handlers have it")
    log(f"{config.platform} on this {host} host: emulated by {entry['interpreter']} ({EMULATOR_PACKAGE}, binfmt_misc); "
        "every RUN step is many times slower than natively (docs/arm64.md)")
    return True
