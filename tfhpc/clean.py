"""make clean: free the disk that builds use up, without touching other projects' images."""
from __future__ import annotations

import shutil

from . import REPO_ROOT
from .cluster import remove_leftovers
from .dockerhost import client
from .manifest import IMAGE_PREFIX
from .rootimage import log


def clean(remove_images: bool = False) -> None:
    engine = client()
    leftovers = remove_leftovers()  # nodes of a test cluster whose run was killed
    for partial in [*(REPO_ROOT / "build").glob("*/.build-*"), *(REPO_ROOT / "build").glob("*/.convert-*")]:
        shutil.rmtree(partial, ignore_errors=True)  # temporary directories of interrupted SIF builds
    if remove_images:
        for image in engine.images.list():
            if any(tag.startswith(f"{IMAGE_PREFIX}-") for tag in image.tags):
                for tag in image.tags:
                    engine.images.remove(tag, noprune=False)
    pruned = engine.images.prune(filters={"dangling": True})
    cache = engine.api.prune_builds()
    log(f"removed {leftovers} leftover test-cluster containers, "
        f"{len(pruned.get('ImagesDeleted') or [])} dangling images, "
        f"{(cache.get('SpaceReclaimed') or 0) / 1e9:.2f} GB of build cache")
