"""`make native-sif`: every layer's SIF built with `apptainer build` from the committed native recipes
(recipes/native/, rendered by tfhpc/recipes.py), parent first, into build/native/; no Docker build."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from .apptainer import Apptainer, scratch_dir
from .common import REPO_ROOT, UserError, log
from .dockerhost import client
from .lock import check_locks
from .manifest import Config, Manifest
from .recipes import ARGS_DIR, NATIVE_DIR, check_committed
from .rootimage import resolve_root

NATIVE_SIF_DIR = REPO_ROOT / "build" / "native"


def sif_name(config: Config, layer: str) -> str:
    """A layer's SIF, as the recipes' `Bootstrap: localimage` lines name their parent's (tfhpc/recipes.py render)."""
    return f"build/native/tfhpc-{layer}_{config.tag}.sif"


def build_native(manifest: Manifest, config: Config, base_source: str, ca_bundle: Path | None,
                 pip_index_url: str | None = None) -> list[Path]:
    """Build every layer's SIF from the committed native recipes and the configuration's arguments file, parent first,
    into build/native/ (each written under a temporary name and renamed). The base recipe's registry header is swapped
    for the local root image (the `base_source` root, saved with docker) so that this also runs where no registry is
    reachable; the rest of every recipe is used as committed."""
    staged = [f"{layer} (stage `{config.build_target(layer)}`)" for layer in manifest.layers.names
              if config.build_target(layer)]
    if staged:
        raise UserError(f"{config.tag} has no native recipe: its {', '.join(staged)} is a Dockerfile stage of its own "
                        "(an MPI from a PyPI wheel), which the recipes leave out; use `make sif`, or a configuration "
                        "with Debian's MPI (STACK=conservative)")
    check_locks(config)  # the recipes install from the locks, as the Dockerfiles do
    recipes = {layer: NATIVE_DIR / f"{layer}.def" for layer in manifest.layers.names}
    args = ARGS_DIR / f"{config.tag}.args"
    check_committed(manifest, [*recipes.values(), args])
    runtime = Apptainer.for_config(manifest, config, base_source, ca_bundle)
    root = resolve_root(config, base_source)
    built, timings = [], {}
    with scratch_dir(NATIVE_SIF_DIR, ".build-") as workdir:
        build_args = ["--warn-unused-build-args", "--build-arg-file", str(args)]  # it holds every layer's arguments
        if ca_bundle is not None:
            shutil.copy(ca_bundle, workdir / "ca_bundle")
            (workdir / "ca_bundle").chmod(0o644)
            build_args += ["--build-arg", f"CA_BUNDLE={workdir / 'ca_bundle'}"]
        if pip_index_url:
            (workdir / "pip_index_url").write_text(pip_index_url)
            (workdir / "pip_index_url").chmod(0o644)  # read by the helper's user; the directory goes away after
            build_args += ["--build-arg", f"PIP_INDEX_URL_FILE={workdir / 'pip_index_url'}"]
        for layer, recipe in recipes.items():
            target = REPO_ROOT / sif_name(config, layer)
            parent = manifest.layers.get(layer).parent
            inputs = [recipe, args] + ([REPO_ROOT / sif_name(config, parent)] if parent else [])
            if target.is_file() and all(target.stat().st_mtime > p.stat().st_mtime for p in inputs):
                log(f"{layer}: {target.relative_to(REPO_ROOT)} is newer than its recipe, arguments and parent: kept")
                built.append(target)
                continue
            started = time.monotonic()
            definition = recipe
            if not manifest.layers.get(layer).parent:
                archive = workdir / "root.tar"
                with archive.open("wb") as handle:
                    for chunk in client().images.get(root).save(chunk_size=8 << 20, named=True):
                        handle.write(chunk)
                archive.chmod(0o644)
                text = recipe.read_text().replace("Bootstrap: docker\nFrom: {{ ROOT_IMAGE }}\n",
                                                  f"Bootstrap: docker-archive\nFrom: {archive}\n", 1)
                definition = workdir / recipe.name
                definition.write_text(text)
                definition.chmod(0o644)
                log(f"{layer}: {recipe.relative_to(REPO_ROOT)} with the root image {root} as docker-archive")
            partial = workdir / f"{layer}.sif"
            runtime.build(partial, definition, workdir, build_args, cwd=REPO_ROOT)
            partial.replace(target)
            timings[layer] = round(time.monotonic() - started, 1)
            log(f"{layer}: wrote {target.relative_to(REPO_ROOT)} ({target.stat().st_size / 1e6:.0f} MB) "
                f"in {timings[layer]} s")
            built.append(target)
    (NATIVE_SIF_DIR / f"build-{config.tag}.json").write_text(json.dumps(
        {"seconds": timings, "sizes": {p.name: p.stat().st_size for p in built}}, indent=2) + "\n")
    return built
