"""Charliecloud (Debian 12's 0.31): the app image converted by ch-convert into a directory image and run by ch-run in
an unprivileged user namespace, as the non-root uid 1000, one node, 2 ranks of the image's own mpirun; and `make
sqsh`'s squashfs run by ch-run directly."""
import os
import shlex
import subprocess

from runtimes.runtime_helpers import SMOKE, USER_UID, as_user, expected_uid, user_environment
from support.collectives import check_collectives


def ch_run(image, command, set_env=True, timeout=300):
    argv = as_user(["ch-run", *(["--set-env"] if set_env else []), str(image), "--", *command])
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=user_environment())


def test_directory_image_carries_the_image_environment(ch_image, app_image):
    assert (ch_image / "ch" / "environment").read_text().splitlines() == app_image.attrs["Config"]["Env"]
    assert (ch_image / "opt" / "venv" / "bin" / "python").exists()
    assert not any((ch_image / "dev").iterdir()), "ch-convert leaves /dev empty (ch-run binds the host's)"


def test_runs_as_the_calling_unprivileged_user_on_a_read_only_image(ch_image):
    done = ch_run(ch_image, ["sh", "-c", "id -u; touch /opt/venv/intruder && echo writable || echo read-only"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(expected_uid()), "read-only"]


def test_set_env_gives_the_image_path_and_mpi_settings(ch_image, app_image):
    """Without --set-env ch-run passes the caller's environment only: the image's PATH (/opt/venv/bin) and its
    TFHPC_* settings come from /ch/environment."""
    done = ch_run(ch_image, ["env"])
    assert done.returncode == 0, done.stderr
    environment = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    for line in app_image.attrs["Config"]["Env"]:
        key, _, value = line.partition("=")
        assert environment.get(key) == value, key
    bare = ch_run(ch_image, ["sh", "-c", 'echo "$PATH ${TFHPC_MPI:-unset}"'],
                  set_env=False)
    assert bare.stdout.split() == [user_environment()["PATH"], "unset"]


def test_two_ranks_with_the_images_mpirun(ch_image):
    done = ch_run(ch_image, SMOKE)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    check_collectives(done.stdout, controller="mpi")


def test_two_ranks_from_the_make_sqsh_squashfs(sqsh, work_dir):
    """ch-run 0.31 mounts a SquashFS image itself (SquashFUSE, linked into Debian's ch-run): `make sqsh`'s file runs
    as is, with the variables of its /etc/environment. Unprivileged when /dev/fuse is open to all users (udev's
    usual 0666); where it is root's only (0600, as on this test host) ch-run runs as root with --uid/--gid 1000."""
    fuse_for_all = os.stat("/dev/fuse").st_mode & 0o006 == 0o006
    mount_point = work_dir / "ch-squashfs-mount"
    mount_point.mkdir(exist_ok=True)
    mount_point.chmod(0o777)
    prefix = as_user(["ch-run"]) if fuse_for_all else ["ch-run", f"--uid={USER_UID}", f"--gid={USER_UID}"]
    base = [*prefix, f"--mount={mount_point}", str(sqsh[0]), "--"]
    listed = subprocess.run([*base, "cat", "/etc/environment"], capture_output=True, text=True, timeout=120,
                            env=user_environment())
    assert listed.returncode == 0, listed.stderr[-2000:]
    variables = [f"--set-env={line}" for line in listed.stdout.splitlines() if "=" in line]
    assert any(v.startswith("--set-env=PATH=/opt/venv/bin") for v in variables), variables
    done = subprocess.run([*prefix, *variables, f"--mount={mount_point}", str(sqsh[0]), "--", "sh", "-c",
                           f"id -u && exec {shlex.join(SMOKE)}"], capture_output=True, text=True, timeout=300,
                          env=user_environment())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.splitlines()[0] == str(USER_UID)
    check_collectives(done.stdout, controller="mpi")
