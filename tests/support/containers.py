"""The container an image test runs in (tests/images, tests/arm64): started with the docker SDK on any layer's image,
with the repository's scripts/ where the app layer does not ship them yet."""
import contextlib

import testinfra

from support import oversubscription
from support.stack import MANIFEST, REPO_ROOT

SCRIPTS = "/opt/tfhpc/scripts"


def start_container(docker_client, image_name, **kwargs):
    layer = docker_client.images.get(image_name).labels.get("io.tfhpc.layer")
    volumes, environment = {}, dict(oversubscription.ENVIRONMENT)
    if layer != MANIFEST.layers.leaf:
        # The mounted scripts import tfhpc_runtime, which the app layer installs: here it is read from the mount.
        volumes = {str(REPO_ROOT / "scripts"): {"bind": SCRIPTS, "mode": "ro"}}
        environment["PYTHONPATH"] = f"{SCRIPTS}/runtime"
    # init: Docker's init as PID 1 reaps the processes that tests start in the background (TensorBoard), as a real
    # container's entrypoint would; `sleep` as PID 1 would leave them as zombies.
    return docker_client.containers.run(image_name, ["sleep", "infinity"], entrypoint=[], detach=True, init=True,
                                        volumes=volumes, environment=environment, **kwargs)


@contextlib.contextmanager
def running(docker_client, image_name):
    """start_container's container for the time of a `with` block (a module fixture's life), always removed."""
    container = start_container(docker_client, image_name)
    try:
        yield container
    finally:
        container.remove(force=True)


def testinfra_host(container, user=""):
    """testinfra's host for a running container, as the image's user or as `user` (e.g. "root")."""
    return testinfra.get_host(f"docker://{user + '@' if user else ''}{container.id}")
