"""Runtime tests: the app image under runtimes other than Docker and Apptainer, as HPC sites run it.

- Charliecloud: the image's `docker export` archive (plus its environment as /ch/environment, as `ch-convert -i docker`
  adds it) converted with `ch-convert -i tar -o dir`, run with `ch-run` by the unprivileged uid 1000.
- Podman: `docker save` streamed into `podman load` into a private store (rootful: see test_podman.py), run there.
- enroot/pyxis squashfs (`make sqsh`): listed with unsquashfs and mounted with squashfuse in the apptainer helper
  image, then run chrooted as uid 1000 the way `enroot start` and pyxis do.
Everything is created under build/runtimes/session-<pid>/ and removed when the directory's tests are done (package
scope: its gigabytes do not outlive them), also on failure; every container carries the label
io.tfhpc.test-runtime=<pid>:<purpose>. Leftovers of a killed run (its pid gone) are removed first.
The tools are never installed here: a missing one fails its test with the install command.
"""
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from runtimes.runtime_helpers import (LABEL, SESSION, WORK_ROOT, label, podman_base, podman_runroot, run_in,
                                      user_environment)
from support.ch_images import directory_image
from support.markers import mark_directory
from support.stack import CONFIG, LEAF, MANIFEST

PURE_MODULES = {"test_edf.py", "test_job_scripts.py"}  # no docker, no image: not marked `image`


def pytest_collection_modifyitems(items):
    mark_directory(items, __file__, pytest.mark.image, except_modules=PURE_MODULES)


def _alive(pid):
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _remove_podman_store(store):
    if (store / "root").exists() and shutil.which("podman"):
        subprocess.run([*podman_base(store), "system", "reset", "--force"], capture_output=True, timeout=300)
    shutil.rmtree(podman_runroot(store), ignore_errors=True)


def _remove_session_dir(path):
    _remove_podman_store(path / "podman")
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="package")
def work_dir(docker_client):
    """build/runtimes/session-<pid>/ (mode 0755: the unprivileged user reads the images below it)."""
    # Only this directory's labels (<pid>:<purpose>): the site and getting-started tests label their containers
    # io.tfhpc.test-runtime=<purpose>, and those may be running in another pytest worker right now.
    for container in docker_client.containers.list(all=True, filters={"label": LABEL}):
        pid = container.labels[LABEL].split(":")[0]
        if pid.isdigit() and not _alive(pid):
            container.remove(force=True)
    WORK_ROOT.mkdir(parents=True, exist_ok=True)
    for stale in WORK_ROOT.glob("session-*"):
        if not _alive(stale.name.removeprefix("session-")):
            _remove_session_dir(stale)
    path = WORK_ROOT / f"session-{SESSION}"
    path.mkdir()
    path.chmod(0o755)
    try:
        yield path
    finally:
        _remove_session_dir(path)


@pytest.fixture(scope="package")
def app_image(docker_client):
    """The docker SDK image object of the app image of the selected configuration."""
    import docker.errors
    name = CONFIG.image(LEAF)
    try:
        return docker_client.images.get(name)
    except docker.errors.ImageNotFound:
        pytest.fail(f"{name} is not built: run `make image` first")


def require(*tools, package):
    missing = [tool for tool in tools if not shutil.which(tool)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: install it with `apt-get install {package}` (Debian 12)")


@pytest.fixture(scope="package")
def ch_image(docker_client, app_image, work_dir):
    """Directory image for ch-run (tests/support/ch_images.py), converted as the unprivileged user who runs it."""
    target = work_dir / "charliecloud" / "app"
    target.parent.mkdir()
    return directory_image(docker_client, app_image, work_dir, target, labels=label("export"),
                           env={**os.environ, **user_environment()})


@pytest.fixture(scope="package")
def podman_image(docker_client, app_image, work_dir):
    """podman base command and the image's name in its private store, `docker save` streamed into `podman load`
    (no archive on disk)."""
    require("podman", package="podman")
    if os.geteuid() != 0:
        pytest.fail("the podman tests use rootful podman: run them as root (rootless podman needs /etc/subuid and "
                    "/etc/subgid ranges for the user, see docs/site-reference.md)")
    store = work_dir / "podman"
    with tempfile.TemporaryFile() as output:
        load = subprocess.Popen([*podman_base(store), "load"], stdin=subprocess.PIPE, stdout=output,
                                stderr=subprocess.STDOUT)
        try:
            with contextlib.suppress(BrokenPipeError):  # podman stopped reading: its status and output say why
                for chunk in app_image.save(named=True, chunk_size=1 << 20):
                    load.stdin.write(chunk)
        finally:
            with contextlib.suppress(BrokenPipeError):
                load.stdin.close()
            status = load.wait(timeout=900)
        output.seek(0)
        printed = output.read().decode(errors="replace")
    assert status == 0, printed[-4000:]
    name = f"localhost/{CONFIG.image(LEAF)}"
    assert f"Loaded image: {name}" in printed, printed
    return podman_base(store), name


@pytest.fixture(scope="package")
def helper(docker_client, work_dir):
    """A container of the apptainer helper image (its apptainer, squashfs-tools, squashfuse), started like
    tfhpc/apptainer.py's start_helper (FUSE, user namespaces, unmasked /proc) with the test label, with the SIF
    directory at /sif and the session's sqsh directory at /sqsh (both read-only)."""
    import docker.errors
    from tfhpc.apptainer import helper_image_name, start_helper
    from tfhpc.sif import SIF_DIR
    name = helper_image_name(MANIFEST, CONFIG)
    try:
        docker_client.images.get(name)
    except docker.errors.ImageNotFound:
        pytest.fail(f"no helper image {name}: run `make sif` (it builds the helper)")
    sqsh_dir = work_dir / "sqsh"
    sqsh_dir.mkdir(exist_ok=True)
    SIF_DIR.mkdir(parents=True, exist_ok=True)
    container = start_helper(name, ["sleep", "infinity"], {str(SIF_DIR): "/sif:ro", str(sqsh_dir): "/sqsh:ro"},
                             labels=label("helper"))
    try:
        # The device node keeps the host's mode (often 0600): the unprivileged user needs it for squashfuse.
        container.exec_run(["chmod", "0666", "/dev/fuse"], user="root")
        yield container
    finally:
        container.remove(force=True)


@pytest.fixture(scope="package")
def sqsh(work_dir, app_image, helper):
    """`python -m tfhpc sqsh` (what `make sqsh` runs), forced through the helper image's mksquashfs (the path of a
    host without squashfs-tools), written into the session's sqsh directory: (host path, path in the helper)."""
    target = work_dir / "sqsh" / f"tfhpc-{LEAF}_{CONFIG.tag}.sqsh"
    done = subprocess.run([sys.executable, "-m", "tfhpc", "sqsh", "--output", str(target), "--mksquashfs",
                           "helper", "--force"], capture_output=True, text=True, timeout=900,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == str(target), done.stdout
    return target, f"/sqsh/{target.name}"


@pytest.fixture(scope="package")
def mounted_sqsh(helper, sqsh):
    """The squashfs mounted with squashfuse at /mnt/image in the helper (as root, readable by all), with /proc, /sys,
    /dev bound and a fresh /tmp: what enroot sets up before it enters the image."""
    status, output = run_in(helper, "set -e; mkdir -p /mnt/image; "
                                    f"squashfuse -o allow_other {sqsh[1]} /mnt/image; "
                                    "for d in proc sys dev; do mount --rbind /$d /mnt/image/$d; done; "
                                    "mount -t tmpfs -o mode=1777 tmpfs /mnt/image/tmp; "
                                    "findmnt -n -o FSTYPE /mnt/image", user="root")
    assert status == 0 and output.split()[-1] == "fuse.squashfuse", output
    try:
        yield "/mnt/image"
    finally:
        run_in(helper, "umount -R /mnt/image", user="root")

