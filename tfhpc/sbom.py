"""The CycloneDX SBOM of every built image, in build/sbom/<image>.cdx.json.

One generator for all: containers/app/tfhpc-sbom run by cyclonedx-bom's venv, the app Dockerfile's stage
"sbom-tools". The app image carries its SBOM at IMAGE_SBOM (written by its last RUN) and that file is copied out; the
layers below carry none (one there would change their image ids with every generator update), so theirs is made by
running each image with the tools on a docker volume. Every SBOM, the merged document (cyclonedx-py checks only its
Python part), is checked against the CycloneDX 1.6 JSON schema here, on the build host, before it is written
(cyclonedx-python-lib's strict validator, with the schemas it ships: no network).
"""
from __future__ import annotations

import io
import tarfile
from contextlib import contextmanager
from pathlib import Path

import docker.errors
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from .common import REPO_ROOT, UserError, write_atomically
from .dockerhost import client
from .imagebuild import build_image
from .manifest import IMAGE_PREFIX, Config

SBOM_DIR = REPO_ROOT / "build" / "sbom"
IMAGE_SBOM = "/opt/tfhpc/sbom.cdx.json"
MEDIA_TYPE = "application/vnd.cyclonedx+json"
TOOLS_STAGE = "sbom-tools"
TOOLS_DIR = "/tmp/sbom-tools"  # where the app Dockerfile's stage puts the venv, and where it is mounted
APP_DOCKERFILE = REPO_ROOT / "containers" / "app" / "Dockerfile"


def file_name(image: str) -> str:
    """tfhpc-app:latest-cpu-openmpi -> tfhpc-app_latest-cpu-openmpi (as the SIF is named)."""
    return image.replace(":", "_").replace("/", "_")


def sbom_path(image: str) -> Path:
    return SBOM_DIR / f"{file_name(image)}.cdx.json"


def read_image_file(image: str, path: str) -> bytes:
    """One file of an image, from a created (never started) container."""
    container = client().containers.create(image, ["true"], entrypoint=[])
    try:
        stream, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
            member = archive.extractfile(archive.getmembers()[0])
            return member.read()
    except docker.errors.NotFound:
        raise UserError(f"{image} has no {path}: rebuild it with `make image`") from None
    finally:
        container.remove(force=True)


@contextmanager
def tools_volume(config: Config, ca_bundle: Path | None, pip_index_url: str | None):
    """A docker volume holding the sbom-tools stage's venv (built on the stack's first layer), removed at the end. A
    named volume mounted empty takes the content the image has at the mount point (docker's volume documentation,
    "Populate a volume using a container")."""
    engine = client()
    tools = build_image(config, APP_DOCKERFILE, f"{IMAGE_PREFIX}-sbom-tools:{config.tag}",
                        config.image(config.layers.names[0]), ca_bundle, pip_index_url, target=TOOLS_STAGE)
    volume = engine.volumes.create()
    try:
        engine.containers.run(tools, ["true"], entrypoint=[], remove=True,
                              volumes={volume.name: {"bind": TOOLS_DIR, "mode": "rw"}})
        yield volume.name
    finally:
        volume.remove(force=True)


def generate(config: Config, image: str, volume: str, epoch: int) -> bytes:
    """The SBOM of `image`, made inside it with the tools on `volume`, timestamped `epoch`."""
    command = [f"{TOOLS_DIR}/bin/python", f"{TOOLS_DIR}/tfhpc-sbom", "--image", image,
               "--source-epoch", str(epoch), "--horovod-patches", " ".join(config.horovod_patches)]
    return client().containers.run(image, command, entrypoint=[], remove=True, stdout=True, stderr=False,
                                   volumes={volume: {"bind": TOOLS_DIR, "mode": "ro"}})


def validated(image: str, data: bytes) -> bytes:
    """`data` when it is a valid CycloneDX 1.6 JSON document, else a one-line UserError (and nothing is written)."""
    try:
        error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(data.decode())
    except ValueError as not_json:  # json's JSONDecodeError, or bytes that are not UTF-8
        reason = f"not JSON: {' '.join(str(not_json).split())[:200]}"
    else:
        if error is None:
            return data
        found = error.data  # jsonschema's ValidationError: its message and where in the document
        reason = " ".join(f"{getattr(found, 'message', found)} at {getattr(found, 'json_path', '$')}".split())[:300]
    raise UserError(f"the SBOM of {image} is not valid CycloneDX 1.6 ({reason}): containers/app/tfhpc-sbom "
                    "wrote it; fix it there and run `make image` again")


def leaf_sbom(image: str) -> Path:
    """build/sbom/<image>.cdx.json of the leaf image: the SBOM its last RUN wrote into it."""
    return write_atomically(sbom_path(image), validated(image, read_image_file(image, IMAGE_SBOM)))


def generate_sboms(config: Config, epochs: dict[str, int], ca_bundle: Path | None,
                   pip_index_url: str | None) -> list[Path]:
    """build/sbom/<image>.cdx.json for each image of `epochs` (image -> the SBOM's timestamp), generated with one
    tools volume for all; every one validated before any is written."""
    with tools_volume(config, ca_bundle, pip_index_url) as volume:
        sboms = {image: validated(image, generate(config, image, volume, epoch)) for image, epoch in epochs.items()}
    return [write_atomically(sbom_path(image), data) for image, data in sboms.items()]
