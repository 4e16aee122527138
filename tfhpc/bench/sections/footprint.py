"""Footprint and build: image, SIF and host venv sizes and inodes, the GPU image against NGC's, the recorded stack
builds and SIF conversion, and the app layer rebuilt warm and after touching one script."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from ...common import REPO_ROOT, default_ca_bundle, resolve_ca_bundle
from ...dockerhost import build_cli, client
from ...manifest import Config, Manifest
from ...provenance import IMAGES_JSON
from ...sif import sif_path
from .. import hostvenv
from ..context import BENCH_DIR, AppContainer, Context, now
from ..stats import Figure, unmeasured

BUILD_TIMES = BENCH_DIR / "build-times.jsonl"


def footprint_ids(config: Config) -> list[tuple[str, str, str, str]]:
    ids = [(f"size.{layer}", "footprint", f"image tfhpc-{layer} (with its parents)", "MB")
           for layer in config.layers.names]
    ids += [("size.sif", "footprint", "SIF file", "MB"), ("size.host_venv", "footprint", "host venv directory", "MB"),
            ("inodes.image", "footprint", "files and directories in the app image", "inodes"),
            ("size.ratio.ngc", "footprint", "app image / the NVIDIA NGC TensorFlow image it replaces", "ratio"),
            ("inodes.host_venv", "footprint", "files and directories in the host venv", "inodes"),
            ("inodes.sif", "footprint", "files the SIF puts on the shared file system", "inodes"),
            ("build.cold", "build", "cold build of the whole stack (recorded)", "s"),
            ("build.warm", "build", "warm build of the whole stack (recorded)", "s"),
            ("build.app_warm", "build", "app layer build, nothing changed (cache hit)", "s"),
            ("build.rebuild_one_script", "build", "app layer rebuild after touching one script", "s"),
            ("build.sif_conversion", "build", "SIF conversion (make sif, recorded)", "s")]
    return ids


def recorded_builds(path: Path, tag: str) -> list[dict]:
    """build-times.jsonl entries of one configuration whose every layer was built (a full `make image`)."""
    entries = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("config") == tag and "total" in entry.get("seconds", {}):
            entries.append(entry)
    return entries


def cold_and_warm(entries: list[dict]) -> tuple[dict | None, dict | None]:
    """The slowest recorded build is the coldest the cache has seen, the fastest the warmest; the two are told
    apart only when there are at least two records."""
    if len(entries) < 2:
        return (entries[0] if entries else None), None
    ordered = sorted(entries, key=lambda e: e["seconds"]["total"])
    return ordered[-1], ordered[0]


def context_paths(dockerignore: Path) -> list[str]:
    """The directories a .dockerignore that excludes everything ("*") lets back in with "!path/" lines."""
    return [line[1:].strip().rstrip("/") for line in dockerignore.read_text().splitlines()
            if line.startswith("!") and line.strip().endswith("/")]


def _time_app_build(ctx: Context, context_dir: Path, tag: str) -> float:
    """`docker build` of the leaf layer as `make image` runs it (same build arguments and secrets; see
    tfhpc/build.py's build_layer, which always builds from the repository itself), from `context_dir`."""
    leaf = ctx.config.layers.leaf
    parent = ctx.config.image(ctx.config.layers.get(leaf).parent)
    args = ["--progress=plain", "--file", str(context_dir / "containers" / leaf / "Dockerfile"),
            "--build-arg", f"BASE_IMAGE={parent}", "--tag", tag]
    for key, value in ctx.config.build_args().items():
        args += ["--build-arg", f"{key}={value}"]
    bundle = resolve_ca_bundle(default_ca_bundle())
    if bundle:
        args += ["--secret", f"id=ca_bundle,src={bundle}"]
    logfile = ctx.out / "rebuild.log"
    started = time.monotonic()
    cli = build_cli()
    with logfile.open("a") as handle:
        status = subprocess.call([*cli.argv, *args, str(context_dir)], env={**os.environ, **cli.env}, stdout=handle,
                                 stderr=handle)
    seconds = time.monotonic() - started
    if status != 0:
        raise RuntimeError(f"app layer build failed (exit {status}, see {logfile})")
    return seconds


def ngc_ratio(ctx: Context, app_bytes: int, measured, not_measured) -> None:
    """The GPU flavour's size goal: its app image against NVIDIA's NGC TensorFlow image. NGC_IMAGE names a locally
    pulled NGC image to measure; otherwise the published figure in versions.toml's [bench.ngc_reference]."""
    if ctx.config.flavor != "gpu":
        not_measured(f"the {ctx.config.flavor} flavour replaces no NGC image (the goal is the GPU flavour's: "
                     "`make bench FLAVOR=gpu`)")
        return
    local = os.environ.get("NGC_IMAGE")
    if local:
        ngc_bytes = client().images.get(local).attrs["Size"]  # checked before the bench started
        source = f"docker image inspect {local} (measured here)"
    else:
        reference = Manifest().data.get("bench", {}).get("ngc_reference")
        if not reference:
            not_measured("no NGC_IMAGE pulled locally and no [bench.ngc_reference] in versions.toml")
            return
        local, ngc_bytes, source = reference["image"], reference["bytes"], reference["source"]
    measured(app_bytes / ngc_bytes, f"{app_bytes / 1e9:.2f} GB vs {local} {ngc_bytes / 1e9:.1f} GB", source)


def bench_footprint(ctx: Context, app: AppContainer) -> None:
    engine = client()
    ids = {id: (label, unit) for id, _s, label, unit in footprint_ids(ctx.config)}

    def add(id, value, note="", source=""):
        ctx.add(Figure(id, ctx_section(id), *ids[id], samples=[value], note=note, source=source))

    def ctx_section(id):
        return "build" if id.startswith("build.") else "footprint"

    parent_size = 0
    for layer in ctx.config.layers.names:
        size = engine.images.get(ctx.config.image(layer)).attrs["Size"]
        add(f"size.{layer}", size / 1e6, note=f"this layer adds {(size - parent_size) / 1e6:.0f} MB")
        parent_size = size
    sif = sif_path(ctx.config, ctx.config.layers.leaf)
    if sif.is_file():
        add("size.sif", sif.stat().st_size / 1e6, note="squashfs-compressed")
        add("inodes.sif", 1, note="one file: the image's inodes live inside it")
    else:
        for id in ("size.sif", "inodes.sif"):
            ctx.add(unmeasured(id, "footprint", *ids[id], f"{sif.relative_to(REPO_ROOT)} is missing: run `make sif`"))
    ngc_ratio(ctx, parent_size, lambda value, note, source: add("size.ratio.ngc", value, note, source),
              lambda reason: ctx.add(unmeasured("size.ratio.ngc", "footprint", *ids["size.ratio.ngc"], reason)))
    count = int(app.run("find / -xdev 2>/dev/null | wc -l", check=False).strip().splitlines()[-1])
    add("inodes.image", count, note="find / -xdev in the running app container")
    if hostvenv.ready(ctx.config):
        total = inodes = 0
        for path in hostvenv.HOST_VENV.rglob("*"):
            inodes += 1
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        add("size.host_venv", total / 1e6, note="sum of file sizes (TensorFlow not stripped, headers kept)")
        add("inodes.host_venv", inodes + 1)
    else:
        for id in ("size.host_venv", "inodes.host_venv"):
            ctx.add(unmeasured(id, "footprint", *ids[id], "the host venv is not built"))

    cold, warm = cold_and_warm(recorded_builds(BUILD_TIMES, ctx.config.tag))
    for id, entry in (("build.cold", cold), ("build.warm", warm)):
        if entry is None:
            ctx.add(unmeasured(id, "build", *ids[id], "build/bench/build-times.jsonl has "
                               + ("no record" if id == "build.cold" else "a single record")
                               + f" of {ctx.config.tag}: cold and warm cannot be told apart"))
        else:
            layers = ", ".join(f"{k} {v}" for k, v in entry["seconds"].items() if k != "total")
            add(id, entry["seconds"]["total"], note=f"per layer (s): {layers}",
                source=f"build/bench/build-times.jsonl, `make image` of {entry['when']}")
    try:
        record = json.loads(IMAGES_JSON.read_text())["images"][f"sif:{sif.name}"]
        add("build.sif_conversion", record["conversion_seconds"],
            source=f"build/images.json, make sif of image {record['image_id'][:19]}")
    except (FileNotFoundError, KeyError, ValueError) as error:
        ctx.add(unmeasured("build.sif_conversion", "build", *ids["build.sif_conversion"],
                           f"no SIF conversion recorded in build/images.json ({type(error).__name__})"))

    # The app layer, rebuilt from a copy of its build context (so that the working tree and the tagged images stay
    # as they are): first as it is (a warm build: every step cached), then after touching one script.
    tag = f"tfhpc-bench-rebuild:{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="tfhpc-bench-context-") as tmp:
        context_dir = Path(tmp)
        # What .dockerignore lets into the build context (its "!path/" lines).
        for part in context_paths(REPO_ROOT / ".dockerignore"):
            if (REPO_ROOT / part).is_dir():
                shutil.copytree(REPO_ROOT / part, context_dir / part, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(REPO_ROOT / ".dockerignore", context_dir / ".dockerignore")
        try:
            _time_app_build(ctx, context_dir, tag)  # fills the cache for this exact context
            add("build.app_warm", _time_app_build(ctx, context_dir, tag), note="second build of the same context")
            with (context_dir / "scripts" / "info.py").open("a") as handle:
                handle.write(f"# touched by make bench at {now()}\n")
            add("build.rebuild_one_script", _time_app_build(ctx, context_dir, tag),
                note="scripts/info.py changed: COPY scripts/ and the layers after it rebuild")
        finally:
            try:
                engine.images.remove(tag)
            except Exception:  # noqa: BLE001 -- nothing to remove when the build failed
                pass
