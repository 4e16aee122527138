"""The machine's cache of what was derived from an image id: the record an image reports, its SBOM, its SIF.

build/ belongs to a checkout, so a fresh clone on the same machine would probe, describe and convert images the docker
cache already holds; this cache, outside any checkout, lets it reuse them. An entry is a directory named by a key that
covers every input of what it holds (an image id, plus a digest of anything else that shaped the file), so an entry
is either right or absent: there is nothing to invalidate. Files are hard-linked in and out where the cache and the
checkout share a file system (a SIF costs no second copy), copied otherwise; every write is whole or absent.

Location: $TFHPC_CACHE, else $XDG_CACHE_HOME/tfhpc, else ~/.cache/tfhpc. `make clean` drops the entries of image ids
that the docker engine no longer has; `make clean-all` removes the cache.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from .common import log

ENTRY_META = "entry.json"  # in each entry: the image id it derives from, for `make clean`


def cache_root(environ: dict[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get("TFHPC_CACHE"):
        return Path(environ["TFHPC_CACHE"])
    base = Path(environ["XDG_CACHE_HOME"]) if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "tfhpc"


def key(kind: str, image_id: str, **inputs: str) -> str:
    """The entry name for `kind` (probe, sbom, sif) derived from `image_id` and the other `inputs`."""
    digest = hashlib.sha256(json.dumps({"kind": kind, "image_id": image_id, **inputs}, sort_keys=True).encode())
    return f"{kind}-{digest.hexdigest()[:32]}"


def _place(source: Path, target: Path) -> None:
    """`target` becomes `source`'s content, whole or not at all: linked where possible, else copied."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    os.unlink(tmp)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def fetch(entry: str, names: dict[str, Path], root: Path | None = None) -> bool:
    """Place the entry's files (name in the entry -> target path); False, with nothing placed, when any is missing."""
    directory = (root or cache_root()) / entry
    if not all((directory / name).is_file() for name in names):
        return False
    for name, target in names.items():
        _place(directory / name, target)
    return True


def store(entry: str, image_id: str, files: dict[str, Path], root: Path | None = None) -> None:
    """Keep `files` (name in the entry -> source path) under `entry`. A cache that cannot be written (read-only home,
    full disk) costs the next run its time, never this run's result: it is logged and passed over."""
    root = root or cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(dir=root, prefix=f".{entry}."))
        for name, source in files.items():
            _place(source, partial / name)
        (partial / ENTRY_META).write_text(json.dumps({"image_id": image_id}) + "\n")
        shutil.rmtree(root / entry, ignore_errors=True)
        os.replace(partial, root / entry)
    except OSError as error:
        log(f"cache: not kept ({error}); the next build derives {entry} again")


def prune(known_image_ids: set[str], root: Path | None = None) -> int:
    """Remove the entries (and leftovers of interrupted stores) whose image id is not in `known_image_ids`."""
    root = root or cache_root()
    removed = 0
    for directory in sorted(root.glob("*")) if root.is_dir() else []:
        try:
            image_id = json.loads((directory / ENTRY_META).read_text())["image_id"]
        except (OSError, ValueError, KeyError):
            image_id = None
        if image_id not in known_image_ids:
            shutil.rmtree(directory, ignore_errors=True)
            removed += 1
    return removed
