"""`python -m tfhpc ci-build-layer`: what each layer's job of the CI pipelines (tfhpc/ci.py renders them) runs: one
layer built on its parent image, which the parent job's artifact has loaded, and recorded as `make image` records."""
from __future__ import annotations

import docker.errors

from .attest import record_layers
from .common import UserError, log, resolve_ca_bundle
from .dockerhost import client
from .imagebuild import build_layer
from .lock import check_locks
from .manifest import Config, Manifest
from .rootimage import resolve_root


def build_one_layer(manifest: Manifest, config: Config, layer: str, base_source: str, ca_bundle: str | None) -> str:
    """Build `layer` on its parent image, which must already be loaded (CI: from the parent job's artifact)."""
    check_locks(config)
    parent_layer = manifest.layers.get(layer).parent
    if parent_layer:
        parent = config.image(parent_layer)
        try:
            client().images.get(parent)
        except docker.errors.ImageNotFound:
            raise UserError(f"{parent} is not loaded: load the '{parent_layer}' job's artifact first "
                            "(or run `make image LAYER=" + layer + "`)") from None
    else:
        parent = resolve_root(config, base_source)
    bundle = resolve_ca_bundle(ca_bundle)
    image = build_layer(config, layer, parent, bundle, None)
    record_layers(config, {layer: parent if parent_layer else None}, None if parent_layer else parent, bundle, None)
    log(f"built {image} on {parent}")
    return image
