"""make sif: convert a built Docker image into a SIF with apptainer (tfhpc/apptainer.py: the host's, or the helper's).

The SIF is written under a temporary name in build/sif/ and renamed when complete, so an interrupted conversion
neither leaves a truncated SIF nor replaces a good one.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import tomllib
from pathlib import Path

import docker.errors

from . import cache
from .apptainer import Apptainer, scratch_dir
from .common import REPO_ROOT, UserError, log, sha256_file
from .dockerhost import client
from .manifest import Config, Manifest
from .ocilayout import write_layout
from .provenance import IMAGES_JSON, update_images_json
from .slsa import sif_statement, statement_path, subject_sha256, write_statement

SIF_DIR = REPO_ROOT / "build" / "sif"
TEMPLATE = REPO_ROOT / "recipes" / "app.def.in"
ENTRYPOINTS = REPO_ROOT / "scripts" / "entrypoints.toml"


def sif_path(config: Config, layer: str) -> Path:
    return SIF_DIR / f"tfhpc-{layer}_{config.tag}.sif"


def render_definition(config: Config, layer: str, layout: str) -> str:
    labels = config.labels(layer)
    with ENTRYPOINTS.open("rb") as handle:
        entrypoints = tomllib.load(handle)
    apps = []
    for name, spec in entrypoints.items():
        apps.append(f"%apprun {name}\n    exec /usr/local/bin/tfhpc-{name} \"$@\"\n\n"
                    f"%apphelp {name}\n    {spec['help']}\n")
    components = ", ".join(f"{k} {v}" for k, v in config.component_versions().items())
    replacements = {
        "@FROM@": layout,
        "@LABELS@": "\n".join(f"    {key} {value}" for key, value in labels.items()),
        "@TITLE@": labels["org.opencontainers.image.title"],
        "@VERSION@": labels["org.opencontainers.image.version"],
        "@COMPONENTS@": components,
        "@APPS@": "\n".join(apps),
    }
    text = TEMPLATE.read_text()
    for key, value in replacements.items():
        text = text.replace(key, value)
    leftover = re.findall(r"@[A-Z]+@", text)
    if leftover:
        raise UserError(f"{TEMPLATE}: unknown placeholders {', '.join(sorted(set(leftover)))}: fix the template")
    return text


def _definition_digest(config: Config, layer: str) -> str:
    """Digest of the rendered definition, independent of the temporary layout's path."""
    return hashlib.sha256(render_definition(config, layer, "oci-layout").encode()).hexdigest()


SQUASHFS_COMPRESSORS = ("gzip", "lz4", "lzo", "xz", "zstd")  # what mksquashfs -comp takes
# mksquashfs's -Xcompression-level: the compressors that take one, and its range (mksquashfs's default: zstd 15, gzip 9).
COMPRESSION_LEVELS = {"gzip": range(1, 10), "zstd": range(1, 23)}


def squashfs_compression(manifest: Manifest, level: str | int | None = None) -> str:
    """What follows `-comp` in mksquashfs's arguments: versions.toml [sif] squashfs_compression, checked, and the
    level asked for (SQUASHFS_LEVEL; None or "": mksquashfs's default, the shipped SIF's). A level trades size
    for conversion time only: the SIF mounts where the compressor mounts, whatever its level."""
    compression = manifest.data["sif"].get("squashfs_compression", "gzip")
    if compression not in SQUASHFS_COMPRESSORS:
        raise UserError(f"{manifest.path}: [sif] squashfs_compression = {compression!r} is not one of "
                        f"{', '.join(SQUASHFS_COMPRESSORS)}: choose one (gzip mounts everywhere)")
    if level in (None, ""):
        return compression
    levels = COMPRESSION_LEVELS.get(compression)
    if levels is None or not str(level).isdigit() or int(level) not in levels:
        valid = f"{compression}'s levels are {levels.start}-{levels.stop - 1}" if levels else f"{compression} takes none"
        raise UserError(f"SQUASHFS_LEVEL={level}: {valid}: give one of them, or leave it empty for mksquashfs's "
                        "default")
    return f"{compression} -Xcompression-level {int(level)}"


def _up_to_date(target: Path, image_id: str, definition_digest: str, compression: str) -> bool:
    """The SIF exists, is the one recorded (same sha256), and was made from this image id, this definition and this
    squashfs compression."""
    if not target.is_file():
        return False
    try:
        record = json.loads(IMAGES_JSON.read_text())["images"][f"sif:{target.name}"]
    except (FileNotFoundError, KeyError, ValueError):
        return False
    return (record.get("image_id") == image_id and record.get("size_bytes") == target.stat().st_size
            and record.get("definition_sha256") == definition_digest and record.get("sha256") == sha256_file(target)
            and record.get("squashfs_compression", "gzip") == compression)


def build_sif(manifest: Manifest, config: Config, layer: str, base_source: str, ca_bundle: Path | None,
              sign_key: Path | None = None, compression_level: str | None = None) -> Path:
    if layer != manifest.layers.leaf:
        # The definition's %runscript, %test and apps are the leaf's commands; the layers below do not have them.
        raise UserError(f"make sif converts the {manifest.layers.leaf} layer (its commands are the SIF's runscript, "
                        f"test and apps), not LAYER={layer}: drop LAYER, or build the layers below natively with "
                        f"`make native-sif`")
    image = config.image(layer)
    try:
        client().images.get(image)
    except docker.errors.ImageNotFound:
        raise UserError(f"{image} is not built: run 'make image' first") from None
    if sign_key is not None and not sign_key.is_file():
        raise UserError(f"SIGN_KEY={sign_key}: no such file: give a PEM private key (openssl genpkey -algorithm RSA)")
    target = sif_path(config, layer)
    image_id = client().images.get(image).id
    definition_digest = _definition_digest(config, layer)
    compression = squashfs_compression(manifest, compression_level)
    if sign_key is None and _up_to_date(target, image_id, definition_digest, compression):
        log(f"{target} is up to date with {image} ({image_id[:19]})")
        if subject_sha256(statement_path(target.name)) == sha256_file(target):
            return target  # its statement too, signed or not as `make sif` left it
        return write_provenance(config, target, image, None)
    entry = cache.key("sif", image_id, definition=definition_digest, compression=compression)
    if sign_key is None and restore_from_cache(entry, target, image):
        log(f"{target} taken from the machine's cache ({cache.cache_root()}): converted before from {image_id[:19]}")
        return write_provenance(config, target, image, None)
    runtime = Apptainer.for_config(manifest, config, base_source, ca_bundle)
    log(f"converting {image} with {runtime.describe()}")
    started = time.monotonic()
    with scratch_dir(SIF_DIR, ".convert-") as workdir:
        layout = workdir / "layout"  # not a `docker save` archive: apptainer would compress every layer of it
        write_layout(client().images.get(image).save(chunk_size=8 << 20, named=True), layout)
        definition = workdir / "image.def"
        definition.write_text(render_definition(config, layer, str(layout)))
        for readable in (definition, layout, *layout.rglob("*")):  # for the helper's user
            readable.chmod(0o755 if readable.is_dir() else 0o644)
        partial = workdir / "image.sif"
        # --notest: the definition's %test (a 2-rank smoke test) is tests/sif's `apptainer test`, run on every SIF
        # that the tests use; at build time it would run the same ranks again.
        runtime.build(partial, definition, workdir, ["--notest", "--mksquashfs-args", f"-comp {compression}"])
        shutil.rmtree(layout)
        if sign_key is not None:
            shutil.copy(sign_key, workdir / "sign-key.pem")
            (workdir / "sign-key.pem").chmod(0o644)  # for the helper's user; no one else reaches scratch_dir
            runtime.sign(partial, workdir / "sign-key.pem", workdir)
        os.replace(definition, target.with_suffix(".def"))  # same file system: each file appears whole or not at all
        os.replace(partial, target)
    seconds = round(time.monotonic() - started, 1)
    record = {"image_id": image_id, "definition_sha256": definition_digest, "squashfs_compression": compression,
              "size_bytes": target.stat().st_size, "sha256": sha256_file(target), "signed": sign_key is not None,
              "conversion_seconds": seconds, "docker_image_size_bytes": client().images.get(image).attrs["Size"]}
    update_images_json(f"sif:{target.name}", {"path": str(target.relative_to(REPO_ROOT)), "image": image, **record})
    if sign_key is None:  # a signed SIF carries this checkout's key: it is not for other checkouts
        with scratch_dir(SIF_DIR, ".convert-") as workdir:
            (workdir / "record.json").write_text(json.dumps(record))
            cache.store(entry, image_id, {"image.sif": target, "image.def": target.with_suffix(".def"),
                                          "record.json": workdir / "record.json"})
    log(f"wrote {target} ({target.stat().st_size / 1e9:.2f} GB) in {seconds} s")
    return write_provenance(config, target, image, sign_key)


def restore_from_cache(entry: str, target: Path, image: str) -> bool:
    """Place the SIF (and its definition) that the machine's cache holds under `entry` at `target` and record it;
    False when the cache has no such entry. The record is checked against the file, as _up_to_date does."""
    with scratch_dir(SIF_DIR, ".convert-") as workdir:
        if not cache.fetch(entry, {"record.json": workdir / "record.json"}):
            return False
        record = json.loads((workdir / "record.json").read_text())
        if not cache.fetch(entry, {"image.sif": workdir / "image.sif", "image.def": workdir / "image.def"}):
            return False
        if sha256_file(workdir / "image.sif") != record["sha256"]:
            log(f"cache: {entry} does not match its record; converting again")
            return False
        os.replace(workdir / "image.def", target.with_suffix(".def"))
        os.replace(workdir / "image.sif", target)
    update_images_json(f"sif:{target.name}", {"path": str(target.relative_to(REPO_ROOT)), "image": image, **record})
    return True


def write_provenance(config: Config, sif: Path, image: str, sign_key: Path | None) -> Path:
    """build/provenance/<sif>.intoto.json (signed with `sign_key`); returns the SIF's path."""
    statement = write_statement(statement_path(sif.name), sif_statement(config, sif, image, sif.with_suffix(".def")),
                                sign_key)
    log(f"provenance: {statement.relative_to(REPO_ROOT)}")
    return sif
