"""make clean: free the disk that builds use up, without touching other projects' images."""
from __future__ import annotations

import shutil
from pathlib import Path

import docker.errors

from . import cache
from .common import REPO_ROOT, UserError, log
from .dockerhost import client
from .manifest import IMAGE_PREFIX

# The labels the tests put on what they start: every container and network of a test cluster
# (tests/cluster/harness.py), the publishing tests' registry (tests/support/registry.py), the runtime tests'
# containers (tests/runtimes/runtime_helpers.py).
TEST_LABELS = ("io.tfhpc.test-cluster", "io.tfhpc.test-registry", "io.tfhpc.test-runtime")


def remove_test_containers() -> int:
    """Remove the containers and networks that a killed test run left behind; returns the containers' count."""
    engine = client()
    removed = 0
    for label in TEST_LABELS:
        for container in engine.containers.list(all=True, filters={"label": label}):
            container.remove(force=True)
            removed += 1
        for network in engine.networks.list(filters={"label": label}):
            network.remove()
    return removed


def clean(remove_images: bool = False, build: Path = REPO_ROOT / "build") -> None:
    engine = client()
    leftovers = remove_test_containers()  # of a killed test run
    for partial in [*build.glob("*/.build-*"), *build.glob("*/.convert-*"), *build.glob(".push-*")]:
        shutil.rmtree(partial, ignore_errors=True)  # temporary directories of interrupted SIF builds and pushes
    in_use = []
    if remove_images:
        for image in engine.images.list():
            if any(tag.startswith(f"{IMAGE_PREFIX}-") for tag in image.tags):
                for tag in image.tags:
                    try:
                        engine.images.remove(tag, noprune=False)
                    except docker.errors.APIError as error:
                        if error.status_code != 409:  # 409: a container uses the image
                            raise
                        in_use.append(tag)
    pruned = engine.images.prune(filters={"dangling": True})
    dropped = cache.prune({image.id for image in engine.images.list(all=True)})
    build_cache = engine.api.prune_builds()
    log(f"removed {leftovers} leftover test containers, "
        f"{len(pruned.get('ImagesDeleted') or [])} dangling images, {dropped} cache entries of removed images, "
        f"{(build_cache.get('SpaceReclaimed') or 0) / 1e9:.2f} GB of build cache")
    if in_use:
        users = sorted(c.name for c in engine.containers.list(all=True) if c.attrs["Config"]["Image"] in in_use)
        raise UserError(f"{len(in_use)} tfhpc images are still used by containers ({', '.join(users) or 'unknown'}): "
                        f"`docker rm` them, then run `make clean-all` again")
