"""Build the layers of one stack configuration in order, move the stack's tags only when every layer built, and
record the built images (attest.py)."""
from __future__ import annotations

import datetime
import json
import os
import time

import docker.errors

from .attest import record_layers
from .common import REPO_ROOT, UserError, log, resolve_ca_bundle
from .dockerhost import client
from .cross import cross_args
from .emulation import ensure_emulation
from .imagebuild import build_layer
from .lock import check_locks
from .manifest import Config, check_base_source
from .rootimage import resolve_root


def build_stack(config: Config, target: str, base_source: str, ca_bundle: str | None,
                pip_index_url: str | None = None) -> list[str]:
    """Build `target` and its ancestors (root first). Returns the image names built."""
    check_base_source(base_source)
    check_locks(config)  # before any build: the layers install from the locks only
    bundle = resolve_ca_bundle(ca_bundle)
    client()  # fail early, in one line, when the daemon is not there
    ensure_emulation(config)  # another architecture than the host's: qemu-user-static, or the one-line fix
    log(f"CA bundle for the build: {bundle or 'none'}")
    chain = config.layers.chain(target)
    started = time.monotonic()
    parent = root = resolve_root(config, base_source)
    cross = cross_args(config, base_source)  # emulated: the host's own compilers for mpi4py and Horovod
    timings = {"root": round(time.monotonic() - started, 1)}
    # Each layer is built under a staging tag and the stack's tags move only once every layer has built: a failure
    # half-way would otherwise leave new lower layers tagged beside upper layers built on the old ones.
    staging = f"tfhpc-build-{os.getpid()}"
    staged: list[tuple[str, str]] = []
    try:
        for layer in chain:
            layer_started = time.monotonic()
            final = config.image(layer)
            try:
                parent = build_layer(config, layer, parent, bundle, pip_index_url,
                                     image=f"{final}-{staging}", shown_as=final, cross=cross)
            except UserError:
                raise UserError(f"building layer '{layer}' failed (build log above); no tag of the stack was moved, "
                                f"{config.image(chain[-1])} and its parents are as they were") from None
            staged.append((final, parent))
            timings[layer] = round(time.monotonic() - layer_started, 1)
        engine = client()
        for final, staged_name in staged:
            repository, _, tag = final.partition(":")
            engine.images.get(staged_name).tag(repository, tag)
    finally:
        for _, staged_name in staged:
            try:
                client().images.remove(staged_name, noprune=True)
            except docker.errors.DockerException:
                pass  # a staging tag left behind is harmless: `make clean-all` removes it with the rest
    built = [final for final, _ in staged]
    timings["total"] = round(time.monotonic() - started, 1)
    records = record_layers(config, dict(zip(chain, [None, *built[:-1]])), root, bundle, pip_index_url)
    record_build_benchmark(config, timings, records)
    return built


def record_build_benchmark(config: Config, timings: dict, records: list[dict]) -> None:
    """Append this build's per-layer wall times and image sizes to build/bench/build-times.jsonl: figures for the
    benchmark report, not for tests (a build is cold or warm depending on the docker cache it found)."""
    path = REPO_ROOT / "build" / "bench" / "build-times.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "config": config.tag, "seconds": timings,
             "size_bytes": {r["layer"]: r["size_bytes"] for r in records}}
    with path.open("a") as handle:
        handle.write(json.dumps(entry) + "\n")
    log("build times (s): " + ", ".join(f"{k} {v}" for k, v in timings.items()))
