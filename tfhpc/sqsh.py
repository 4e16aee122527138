"""make sqsh: the app image as an enroot-compatible squashfs, build/sqsh/tfhpc-app_<tag>.sqsh, for enroot, pyxis
(`srun --container-image=/path/x.sqsh`) and the CSCS Container Engine (an EDF's `image = "/path/x.sqsh"`).

The layout is the one `enroot import dockerd://IMAGE` writes (NVIDIA/enroot, src/docker.sh: docker::daemon::import
and docker::configure):
  - the exported root file system of a container of the image, without the contents of /dev and without /.dockerenv,
    with every file and directory readable (and every directory writable) by its owner;
  - /etc/environment: the image's Env, one VAR=value a line;
  - /etc/fstab: one bind mount per image Volume ("${ENROOT_ROOTFS}/dir /dir none x-create=dir,bind,rw,nosuid,nodev");
  - /etc/rc: "# enroot-provenance: dockerd://IMAGE", the labels as comments, then `cd` to the WorkingDir and `exec`
    the Entrypoint with the given command, or with the image's Cmd when none is given; /etc/rc.local: empty;
  - squashed with `mksquashfs ROOTFS FILE -all-root` and enroot's default ENROOT_SQUASH_OPTIONS
    (-comp lzo -noD -exit-on-error); SOURCE_DATE_EPOCH, when set, fixes every time stamp, as enroot does.
mksquashfs is the host's when it has one (Debian: squashfs-tools), else the one in the apptainer helper image
(tfhpc/apptainer.py), run as root in a container of it (no network, no extra privileges) so that it reads every file.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import docker.errors

from .apptainer import build_helper_image, helper_image_name, scratch_dir
from .common import REPO_ROOT, UserError, log, sha256_file
from .dockerhost import client
from .manifest import Config, Manifest

SQSH_DIR = REPO_ROOT / "build" / "sqsh"
# enroot's defaults: mksquashfs's -all-root, then ENROOT_SQUASH_OPTIONS (NVIDIA/enroot enroot.in, doc/cmd/import.md).
SQUASH_OPTIONS = ("-all-root", "-comp", "lzo", "-noD", "-exit-on-error")
# Paths of the export that enroot leaves out (its tar --anchored --exclude patterns).
EXCLUDED = ("dev/*", ".dockerenv")
ENROOT_FILES = ("etc/fstab", "etc/environment", "etc/rc", "etc/rc.local")
RECORD_FORMAT = 1  # bump when the layout or the options change: an older .sqsh is then rebuilt
LABEL = "io.tfhpc.sqsh"  # on the short-lived containers: the exported one, the one running mksquashfs


def sqsh_path(config: Config, layer: str) -> Path:
    return SQSH_DIR / f"tfhpc-{layer}_{config.tag}.sqsh"


def _quoted(word: str) -> str:
    """One word for sh, single-quoted as bash's ${word@Q} writes it in enroot's rc."""
    return "'" + word.replace("'", "'\\''") + "'"


def enroot_files(image_config: dict, uri: str) -> dict[str, str]:
    """The four files enroot writes into the root file system, from an image's config (docker inspect's .Config)."""
    volumes = image_config.get("Volumes") or {}
    fstab = "".join(f"${{ENROOT_ROOTFS}}{path} {path} none x-create=dir,bind,rw,nosuid,nodev\n" for path in volumes)
    environment = "".join(f"{line}\n" for line in image_config.get("Env") or [])
    labels = image_config.get("Labels") or {}
    entrypoint = [_quoted(word) for word in image_config.get("Entrypoint") or []]
    command = [_quoted(word) for word in image_config.get("Cmd") or []]
    if not entrypoint and not command:
        command = [_quoted("/bin/sh")]
    workdir = image_config.get("WorkingDir") or "/"
    lines = [f"# enroot-provenance: {uri}"]
    lines += [f"# {key} {str(value).replace(chr(10), ' ')}" for key, value in labels.items()]
    with_arguments = " ".join([*entrypoint, '"$@"'])
    without_arguments = " ".join([*entrypoint, *command])
    lines += ["", f'mkdir -p "{workdir}" 2> /dev/null', f'cd "{workdir}" && unset OLDPWD || exit 1', "",
              "if [ -s /etc/rc.local ]; then", "    . /etc/rc.local", "fi", "",
              "if [ $# -gt 0 ]; then", f"    exec {with_arguments}", "else", f"    exec {without_arguments}", "fi"]
    rc_local = ("# This file is sourced by /etc/rc when the container starts.\n"
                "# It can be used to manipulate the entrypoint or the command of the container.\n")
    return {"etc/fstab": fstab, "etc/environment": environment, "etc/rc": "\n".join(lines) + "\n",
            "etc/rc.local": rc_local}


def _inside(rootfs: Path, relative: str) -> Path:
    """rootfs/relative, refusing a path whose directories leave rootfs through a symbolic link (the image's links
    point into the image, not into the host running this)."""
    path = rootfs / relative
    parent = os.path.realpath(path.parent)
    if parent != os.path.realpath(rootfs) and not parent.startswith(os.path.realpath(rootfs) + os.sep):
        raise UserError(f"{relative} of the image resolves outside its root file system: cannot write it")
    return path


def configure_rootfs(rootfs: Path, image_config: dict, uri: str) -> None:
    """Write enroot's files (a symbolic link in their place is replaced by the file) and create the WorkingDir."""
    workdir = (image_config.get("WorkingDir") or "/").lstrip("/")
    if workdir and not _inside(rootfs, workdir).exists():
        _inside(rootfs, workdir).mkdir(parents=True)
    for relative, text in enroot_files(image_config, uri).items():
        path = _inside(rootfs, relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or path.exists():
            path.unlink()
        path.write_text(text)
        path.chmod(0o644)


def fix_permissions(rootfs: Path) -> None:
    """enroot's common::fixperms (`chmod -R u+rX` and u+w on directories), so that an unprivileged user can read,
    squash and remove the tree. Symbolic links are left alone, as chmod -R does."""
    def fix(path: str, is_dir: bool) -> None:
        mode = os.lstat(path).st_mode
        wanted = mode | stat.S_IRUSR
        if is_dir:
            wanted |= stat.S_IXUSR | stat.S_IWUSR
        elif mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH):
            wanted |= stat.S_IXUSR
        if wanted != mode:
            os.chmod(path, stat.S_IMODE(wanted))

    fix(str(rootfs), True)
    for directory, dirnames, filenames in os.walk(rootfs):
        for name in dirnames:  # fixed before os.walk lists them
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                fix(path, True)
        for name in filenames:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                fix(path, False)


def export_rootfs(image: str, rootfs: Path) -> None:
    """`docker create` + `docker export | tar -x`, with enroot's exclusions; the container is removed afterwards."""
    rootfs.mkdir()
    container = client().containers.create(image, labels={LABEL: "export"})
    try:
        untar = subprocess.Popen(["tar", "-C", str(rootfs), "--warning=no-timestamp", "--anchored",
                                  *[f"--exclude={pattern}" for pattern in EXCLUDED], "-px"], stdin=subprocess.PIPE)
        try:
            for chunk in container.export():
                untar.stdin.write(chunk)
        finally:
            untar.stdin.close()
            status = untar.wait()
        if status != 0:
            raise UserError(f"extracting the file system of {image} failed (tar exit {status}): see above")
    finally:
        container.remove(force=True)


def mksquashfs_argv(rootfs: Path, target: Path) -> list[str]:
    argv = ["mksquashfs", str(rootfs), str(target), "-no-progress", "-processors", str(os.cpu_count() or 1)]
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        argv += ["-mkfs-time", epoch, "-all-time", epoch]
    return argv + list(SQUASH_OPTIONS)


def squash(argv: list[str], workdir: Path, helper: str | None) -> None:
    """Run mksquashfs on the host (helper None) or as root in the helper image, output to stderr."""
    if helper is None:
        done = subprocess.run(argv, stdout=sys.stderr)
        status = done.returncode
    else:
        # No extra privileges: mksquashfs only reads the tree (as root, whatever its modes) and writes one file.
        container = client().containers.run(helper, argv, entrypoint=[], user="root", working_dir=str(workdir),
                                            volumes={str(workdir): {"bind": str(workdir), "mode": "rw"}},
                                            labels={LABEL: "mksquashfs"}, network_mode="none", detach=True)
        try:
            for chunk in container.logs(stream=True, follow=True):
                os.write(2, chunk)
            status = container.wait()["StatusCode"]
        finally:
            container.remove(force=True)
    if status != 0:
        where = "" if helper is None else f" in {helper}"
        raise UserError(f"mksquashfs failed{where} (exit {status}): see its output above")


def choose_mksquashfs(manifest: Manifest, config: Config, where: str, base_source: str,
                      ca_bundle: Path | None) -> str | None:
    """None for the host's mksquashfs, else the helper image's name (built when missing)."""
    if where in ("auto", "host") and shutil.which("mksquashfs"):
        return None
    if where == "host":
        raise UserError("no mksquashfs on this host: install squashfs-tools, or use the helper image (--mksquashfs "
                        "helper, the default when the host has none)")
    name = helper_image_name(manifest, config)
    try:
        client().images.get(name)
        return name
    except docker.errors.ImageNotFound:
        return build_helper_image(manifest, config, base_source, ca_bundle)


def _record_path(target: Path) -> Path:
    return target.with_name(target.name + ".json")


def _up_to_date(target: Path, image_id: str) -> bool:
    try:
        record = json.loads(_record_path(target).read_text())
    except (FileNotFoundError, ValueError):
        return False
    return (target.is_file() and record.get("image_id") == image_id and record.get("format") == RECORD_FORMAT
            and record.get("size_bytes") == target.stat().st_size)


def build_sqsh(manifest: Manifest, config: Config, output: Path | None = None, where: str = "auto",
               base_source: str = "auto", ca_bundle: Path | None = None, force: bool = False) -> Path:
    """Write the squashfs of the leaf image (unless the one there was made from the same image id) and its record
    (<file>.json: image, image id, sha256, options). Written under a temporary name, renamed when complete."""
    layer = manifest.layers.leaf
    image = config.image(layer)
    try:
        image_attrs = client().images.get(image).attrs
    except docker.errors.ImageNotFound:
        raise UserError(f"{image} is not built: run `make image` (same STACK/FLAVOR/MPI) first") from None
    target = (output or sqsh_path(config, layer)).resolve()
    if not force and _up_to_date(target, image_attrs["Id"]):
        log(f"{target} is up to date (made from {image_attrs['Id'][:19]})")
        return target
    helper = choose_mksquashfs(manifest, config, where, base_source, ca_bundle)
    started = time.monotonic()
    with scratch_dir(target.parent, ".sqsh-") as workdir:
        rootfs = workdir / "rootfs"
        log(f"exporting the file system of {image}")
        export_rootfs(image, rootfs)
        fix_permissions(rootfs)
        configure_rootfs(rootfs, image_attrs["Config"], f"dockerd://{image}")
        argv = mksquashfs_argv(rootfs, workdir / "image.sqsh")
        log(f"squashing with {'the host' if helper is None else helper}: {' '.join(argv[3:])}")
        squash(argv, workdir, helper)
        os.replace(workdir / "image.sqsh", target)
    target.chmod(0o644)
    record = {"image": image, "image_id": image_attrs["Id"], "sha256": sha256_file(target),
              "size_bytes": target.stat().st_size, "format": RECORD_FORMAT, "layout": "enroot import dockerd://",
              "mksquashfs": argv[3:], "mksquashfs_from": "host" if helper is None else helper}
    _record_path(target).write_text(json.dumps(record, indent=2) + "\n")
    log(f"wrote {target} ({target.stat().st_size / 1e9:.2f} GB) in {time.monotonic() - started:.1f} s")
    return target
