"""An image's `docker save` stream written as an OCI image layout whose layers stay uncompressed, for `apptainer
build` from `Bootstrap: oci` (make sif).

Apptainer 1.4 reads a `docker save` archive of Docker before 25 through go-containerregistry's tarball image, which
compresses every layer to learn its digest and unpacks it again (apptainer/apptainer#2789): 70 of the 273 s that the app image's conversion took
(docs/measurements.md, build times). From a layout it copies the layers as they are. The OCI image specification
allows uncompressed layers (media type application/vnd.oci.image.layer.v1.tar) and names each by the sha256 of its
bytes, which for an uncompressed layer is its diff_id in the image's config: the layer files of the stream are written
once, under the names the config gives them, and only the config and the new manifest are hashed.

Both formats of `docker save` hold manifest.json (Docker 25 and later write an OCI layout beside it): it is the one
read, so either format gives the same layout.
"""
from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from .common import UserError

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
IN_MEMORY = 1 << 20  # members up to this size (the JSON files) are kept in memory, larger ones go to disk
CHUNK = 8 << 20


class _Stream:
    """A file-like reader over an iterable of byte chunks (the docker SDK's image.save()). tarfile reads its stream
    in records of 10 KiB: each read takes a view of the current chunk rather than copying what is left of it."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks: Iterator[bytes] = iter(chunks)
        self._chunk = memoryview(b"")
        self._offset = 0

    def read(self, size: int = -1) -> bytes:
        parts = []
        while size != 0:
            if self._offset == len(self._chunk):
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                self._chunk, self._offset = memoryview(chunk), 0
                continue
            end = len(self._chunk) if size < 0 else min(len(self._chunk), self._offset + size)
            parts.append(self._chunk[self._offset:end])
            if size > 0:
                size -= end - self._offset
            self._offset = end
        return b"".join(parts)


def write_layout(chunks: Iterable[bytes], directory: Path) -> str:
    """Write the `docker save` stream `chunks` as an OCI layout in `directory` (created; must not exist) with one
    image; returns its manifest's digest ("sha256:...")."""
    blobs = directory / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    small, large = {}, {}
    with tarfile.open(fileobj=_Stream(chunks), mode="r|") as archive:
        for number, member in enumerate(archive):
            if not member.isfile():
                continue
            source = archive.extractfile(member)
            if member.size <= IN_MEMORY:
                small[member.name] = source.read()
                continue
            spool = blobs / f".member-{number}"
            with spool.open("wb") as sink:
                while chunk := source.read(CHUNK):
                    sink.write(chunk)
            large[member.name] = spool
    try:
        (image,) = json.loads(small["manifest.json"])
        config = small[image["Config"]]
        diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    except (KeyError, ValueError, TypeError) as error:
        raise UserError(f"the image's `docker save` stream is not one image with manifest.json and a config "
                        f"({error!r}): save one image") from None
    if len(diff_ids) != len(image["Layers"]):
        raise UserError(f"the image's config lists {len(diff_ids)} layers, its manifest.json {len(image['Layers'])}")
    layers = []
    for name, diff_id in zip(image["Layers"], diff_ids):
        target = blobs / diff_id.removeprefix("sha256:")
        if name in large:
            large.pop(name).replace(target)
        else:
            target.write_bytes(small[name])
        layers.append({"mediaType": LAYER_MEDIA_TYPE, "digest": diff_id, "size": target.stat().st_size})
    for spool in large.values():  # members that are no layer of the image: not part of the layout
        spool.unlink()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE,
                           "config": _blob(blobs, config, CONFIG_MEDIA_TYPE), "layers": layers}).encode()
    descriptor = _blob(blobs, manifest, MANIFEST_MEDIA_TYPE)
    (directory / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (directory / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [descriptor]}))
    return descriptor["digest"]


def _blob(blobs: Path, data: bytes, media_type: str) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}
