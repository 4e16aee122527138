"""Podman (Debian 12's 4.3.1): the app image from a `docker save` archive (`podman load`), 2 ranks on one node.

Rootful podman, on a private store under the session directory: rootless podman needs subordinate uid/gid ranges
(/etc/subuid, /etc/subgid) for the image's two owners (root and uid 1000) and for --userns=keep-id; this host has
none, and a test must not write them. Without them rootless podman maps the caller to root only, and the image's user
tfhpc cannot exist. The container processes still run as the image's unprivileged user (uid 1000, no capabilities).
"""
import subprocess

from runtimes.runtime_helpers import SMOKE, podman_run_args
from support.collectives import check_collectives


def podman_run(podman_image, command, timeout=300):
    base, name = podman_image
    return subprocess.run([*base, "run", *podman_run_args(), name, *command], capture_output=True, text=True,
                          timeout=timeout)


def test_loaded_image_is_the_docker_image(podman_image, app_image):
    base, name = podman_image
    done = subprocess.run([*base, "image", "inspect", "--format", "{{.Id}} {{.User}}", name], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [app_image.id.removeprefix("sha256:"), app_image.attrs["Config"]["User"]]


def test_runs_as_the_images_unprivileged_user(podman_image):
    done = podman_run(podman_image, ["sh", "-c", "id -u; grep CapEff /proc/self/status"])
    assert done.returncode == 0, done.stderr
    uid, capabilities = done.stdout.splitlines()[-2:]
    assert uid == "1000" and capabilities.split() == ["CapEff:", "0000000000000000"]


def test_two_ranks_with_the_images_mpirun(podman_image):
    done = podman_run(podman_image, SMOKE)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    check_collectives(done.stdout, controller="mpi")
