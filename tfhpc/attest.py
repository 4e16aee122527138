"""What `make image` records about the images it built, beside them in build/: what each image reports about itself
(build/images.json), its CycloneDX SBOM (build/sbom/) and its provenance statement (build/provenance/).

Probing an image and writing its SBOM run containers (Horovod's check-build imports TensorFlow; the SBOM generator
reads every package): most of a warm `make image`. Both depend only on the image (and, for an SBOM, on the inputs
named in its key), so they are kept in the machine's cache (cache.py) and derived once per image id, on this
machine, whatever the checkout. Statements name the checkout's commit and files, so they are written each time:
they cost a few `docker inspect` calls.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from . import cache
from .common import REPO_ROOT, log, source_epoch
from .dockerhost import client
from .imagebuild import layer_inputs, layer_sources
from .manifest import Config
from .provenance import PROBE, probe_image, update_images_json
from .sbom import file_name, generate_sboms, leaf_sbom, sbom_path
from .slsa import image_statement, recorded_root, root_material, statement_path, write_statement


def sbom_epoch(config: Config, layer: str) -> int:
    """The timestamp of a lower layer's SBOM: the last commit that changed the sources of that layer or of a layer
    below it, so that the SBOM of an unchanged image stays the same bytes across commits (and cacheable)."""
    chain = config.layers.chain(layer)
    return source_epoch(sources=tuple(path for name in chain for path in layer_sources(config, name)))


def probe_records(config: Config, images: list[str]) -> list[dict]:
    """Each image's report (provenance.probe_image), from the cache when this image id was probed before."""
    records = []
    for image in images:
        attrs = client().images.get(image).attrs
        image_id = attrs["Id"]
        entry = cache.key("probe", image_id, probe=hashlib.sha256(PROBE.encode()).hexdigest())  # a new probe, anew
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "record.json"
            if cache.fetch(entry, {"record.json": path}):
                record = json.loads(path.read_text())
            else:
                record = probe_image(config, image)
                path.write_text(json.dumps(record, sort_keys=True))
                cache.store(entry, image_id, {"record.json": path})
        name, _, tag = image.partition(":")  # one image id may carry several stacks' names (a shared base layer)
        # the platform as the image's configuration states it (an emulated build's too), not as the manifest asks
        record.update(name=name, tag=tag, stack=config.stack, flavor=config.flavor, mpi=config.mpi,
                      platform=f"{attrs['Os']}/{attrs['Architecture']}")
        update_images_json(image, record)
        records.append(record)
    return records


def write_sboms(config: Config, layers: list[str], ca_bundle: Path | None, pip_index_url: str | None) -> list[Path]:
    """build/sbom/<image>.cdx.json for each of the built `layers`: the leaf's is the file it carries; the lower ones'
    come from the cache or are generated (sbom.generate_sboms) and kept there."""
    written, missing = [], {}
    for layer in layers:
        image = config.image(layer)
        if layer == config.layers.leaf:
            written.append(leaf_sbom(image))
            continue
        epoch = sbom_epoch(config, layer)
        entry = cache.key("sbom", client().images.get(image).id, epoch=str(epoch),
                          patches=" ".join(config.horovod_patches))
        if cache.fetch(entry, {"sbom.cdx.json": sbom_path(image)}):
            written.append(sbom_path(image))
        else:
            missing[image] = (entry, epoch)
    if missing:
        generated = generate_sboms(config, {image: epoch for image, (_, epoch) in missing.items()}, ca_bundle,
                                   pip_index_url)
        for image, path in zip(missing, generated):
            cache.store(missing[image][0], client().images.get(image).id, {"sbom.cdx.json": path})
        written += generated
    log(f"SBOMs: {', '.join(str(path.relative_to(REPO_ROOT)) for path in written)}")
    return written


def record_layers(config: Config, parents: dict[str, str | None], root_image: str | None,
                  ca_bundle: Path | None, pip_index_url: str | None) -> list[dict]:
    """Record the built layers `parents` (layer -> the stack image it was built on, None for the first layer):
    images.json, SBOMs and statements. `root_image`: the OS root under the first layer; None: as the first layer's
    statement in build/provenance/ recorded it (CI builds one layer per job). Returns the images' records."""
    records = probe_records(config, [config.image(layer) for layer in parents])
    write_sboms(config, list(parents), ca_bundle, pip_index_url)
    root = root_material(config, root_image) if root_image else recorded_root(config)
    for layer, parent in parents.items():
        image = config.image(layer)
        build_args = {**config.build_args(), **layer_inputs(config, layer)[1]}
        write_statement(statement_path(file_name(image)),
                        image_statement(config, image, parent, root, build_args, sbom_path(image)))
    log(f"provenance: {statement_path('*').relative_to(REPO_ROOT)}")
    return records
