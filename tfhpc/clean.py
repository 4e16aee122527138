"""make clean: free the disk that builds use up, without touching other projects' images."""
from __future__ import annotations

import shutil

import docker.errors

from . import REPO_ROOT, UserError
from .cluster import remove_leftovers
from .dockerhost import client
from .manifest import IMAGE_PREFIX
from .rootimage import log


def clean(remove_images: bool = False) -> None:
    engine = client()
    leftovers = remove_leftovers()  # nodes of a test cluster whose run was killed
    build = REPO_ROOT / "build"
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
    cache = engine.api.prune_builds()
    log(f"removed {leftovers} leftover test-cluster containers, "
        f"{len(pruned.get('ImagesDeleted') or [])} dangling images, "
        f"{(cache.get('SpaceReclaimed') or 0) / 1e9:.2f} GB of build cache")
    if in_use:
        users = sorted(c.name for c in engine.containers.list(all=True) if c.attrs["Config"]["Image"] in in_use)
        raise UserError(f"{len(in_use)} tfhpc images are still used by containers ({', '.join(users) or 'unknown'}): "
                        f"`docker rm` them, then run `make clean-all` again")
