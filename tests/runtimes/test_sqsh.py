"""`make sqsh`: the enroot-compatible squashfs of the app image (tfhpc/sqsh.py). enroot and pyxis cannot be installed
here; what they rely on is checked instead: the file list is the image's (as `enroot import dockerd://` leaves it),
the files enroot writes say what the image config says, and the image runs the 2-rank smoke test mounted with
squashfuse, entered by chroot as uid 1000 with only /etc/environment's variables, through /etc/rc (`enroot start`)
and without it (pyxis's default, no entrypoint)."""
import io
import json
import shlex
import tarfile

import pytest

from runtimes.runtime_helpers import SMOKE, USER_UID, label, run_in
from support.collectives import check_collectives
from support.stack import CONFIG

ENROOT_WRITES = {"etc/rc", "etc/rc.local", "etc/fstab", "etc/environment"}


class _Chunks(io.RawIOBase):
    """A file object over the docker SDK's chunk iterator (tarfile reads the export as a stream)."""

    def __init__(self, chunks):
        self.chunks, self.pending = iter(chunks), b""

    def readable(self):
        return True

    def readinto(self, buffer):
        while not self.pending:
            self.pending = next(self.chunks, b"")
            if not self.pending:
                return 0
        size = min(len(buffer), len(self.pending))
        buffer[:size], self.pending = self.pending[:size], self.pending[size:]
        return size


@pytest.fixture(scope="module")
def exported(docker_client, app_image):
    """{path: (type, size, link target)} of `docker export` of the image: d directory, - file, l symbolic link, h
    hard link."""
    container = docker_client.containers.create(app_image.id, labels=label("export-list"))
    entries = {}
    try:
        stream = io.BufferedReader(_Chunks(container.export(chunk_size=1 << 20)), 1 << 20)
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                kind = "d" if member.isdir() else "l" if member.issym() else "h" if member.islnk() else "-"
                entries[member.name.strip("/").removeprefix("./")] = (kind, member.size, member.linkname)
    finally:
        container.remove(force=True)
    return entries


@pytest.fixture(scope="module")
def squashed(helper, sqsh):
    """{path: (type, size, link target, owner)} from `unsquashfs -lln` (numeric owners) in the helper."""
    status, output = run_in(helper, f"unsquashfs -lln {sqsh[1]}")
    assert status == 0, output[-2000:]
    entries = {}
    for line in output.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 6 or not fields[5].startswith("squashfs-root"):
            continue
        name, _, target = fields[5].removeprefix("squashfs-root").lstrip("/").partition(" -> ")
        if name:
            entries[name] = (fields[0][0], int(fields[2]), target, fields[1])
    return entries


def test_the_record_names_the_image_and_enroots_options(sqsh, app_image):
    record = json.loads(sqsh[0].with_name(sqsh[0].name + ".json").read_text())
    assert record["image_id"] == app_image.id and record["size_bytes"] == sqsh[0].stat().st_size
    options = record["mksquashfs"]
    assert options[-5:] == ["-all-root", "-comp", "lzo", "-noD", "-exit-on-error"]  # enroot's defaults


def test_file_list_is_the_images(exported, squashed):
    """The same paths as `docker export` without /dev's contents and /.dockerenv (enroot's exclusions), plus the
    files enroot writes; same types, file sizes and link targets; every owner root (-all-root)."""
    kept = {path for path in exported if not path.startswith("dev/") and path != ".dockerenv"}
    assert "dev" in kept and len(exported) - len(kept) >= 2
    assert set(squashed) == kept | ENROOT_WRITES
    for path in kept - ENROOT_WRITES:
        kind, size, target = exported[path]
        got = squashed[path]
        if kind == "h":  # a hard link in the tar stream is a file with its target's size in the squashfs
            assert got[0] == "-" and got[1] == squashed[target][1], path
        else:
            assert got[:3] == (kind, size if kind == "-" else got[1], target), path
    assert {entry[3] for entry in squashed.values()} == {"0/0"}


def test_enroot_files_say_what_the_image_config_says(helper, sqsh, app_image):
    config = app_image.attrs["Config"]

    def cat(path):
        status, output = run_in(helper, f"unsquashfs -cat {sqsh[1]} {path}")
        assert status == 0, output
        return output

    assert cat("etc/environment").splitlines() == config["Env"]
    assert cat("etc/fstab") == "".join(f"${{ENROOT_ROOTFS}}{v} {v} none x-create=dir,bind,rw,nosuid,nodev\n"
                                       for v in config.get("Volumes") or {})
    rc = cat("etc/rc").splitlines()
    assert rc[0] == f"# enroot-provenance: dockerd://{CONFIG.image('app')}"
    assert f"# org.opencontainers.image.version {CONFIG.tag}" in rc
    assert f'cd "{config["WorkingDir"]}" && unset OLDPWD || exit 1' in rc
    assert not any("'" in word for word in config["Entrypoint"] + config["Cmd"])
    entrypoint = " ".join(f"'{word}'" for word in config["Entrypoint"])  # as bash's ${word@Q} quotes them
    command = " ".join(f"'{word}'" for word in config["Cmd"])
    assert rc[-5:] == ["if [ $# -gt 0 ]; then", f'    exec {entrypoint} "$@"', "else",
                      f"    exec {entrypoint} {command}", "fi"]


def chrooted(mounted, command, extra=""):
    """bash for: enter the mounted image as uid 1000 with only the variables of its /etc/environment (and `extra`)."""
    return (f"mapfile -t variables < {mounted}/etc/environment; "
            f"chroot --userspec={USER_UID}:{USER_UID} {mounted} /usr/bin/env -i \"${{variables[@]}}\" {extra} "
            f"{command}")


# enroot start (without ENROOT_MOUNT_HOME) passes /etc/environment's variables and no HOME: the entrypoint sets it
# from passwd. pyxis runs the command in the job's environment, HOME included (here the image user's home).
@pytest.mark.parametrize("how, command, extra", [
    ("enroot start (through /etc/rc, the entrypoint)", "/bin/sh /etc/rc", ""),
    ("pyxis default (no entrypoint: the command, found on the image's PATH)", "", "HOME=/home/tfhpc"),
], ids=["enroot-start", "pyxis-default"])
def test_two_ranks_in_the_mounted_squashfs(helper, mounted_sqsh, how, command, extra):
    status, output = run_in(helper, chrooted(mounted_sqsh, f"{command} id -u", extra), user="root")
    assert status == 0 and output.split()[-1] == str(USER_UID), output
    status, output = run_in(helper, chrooted(mounted_sqsh, f"{command} {shlex.join(SMOKE)}", extra), user="root")
    assert status == 0, output[-3000:]
    check_collectives(output, controller="mpi")
