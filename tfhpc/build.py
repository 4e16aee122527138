"""Build the layers of one stack configuration in order, tag each only when its build succeeded, and record
what every image reports about itself in build/images.json."""
from __future__ import annotations

import datetime
import json
import os
import re
import tempfile
import time
from pathlib import Path

import docker.errors

from .common import REPO_ROOT, UserError, git_revision, log, resolve_ca_bundle, source_date, source_epoch
from .dockerhost import build_cli, client
from .lock import check_locks
from .manifest import Config, check_base_source
from .provenance import probe_image, update_images_json
from .rootimage import resolve_root


# Docker's predefined proxy arguments: forwarded from the environment of `make image` so a site behind an HTTP proxy
# builds as it runs its other tools. Docker keeps predefined arguments out of the image's history and configuration
# unless a Dockerfile declares them (none does; tests/images/base/test_no_secrets.py scans every image).
PROXY_VARIABLES = tuple(name for base in ("http_proxy", "https_proxy", "ftp_proxy", "no_proxy", "all_proxy")
                        for name in (base, base.upper()))


def proxy_build_args(environ: dict[str, str] | None = None) -> list[str]:
    """`--build-arg NAME` (the value is read from the environment, so it is not on the command line) for each proxy
    variable that is set."""
    environ = os.environ if environ is None else environ
    return [arg for name in PROXY_VARIABLES if environ.get(name) for arg in ("--build-arg", name)]


def build_image(config: Config, dockerfile: Path, image: str, parent_image: str, ca_bundle: Path | None,
                pip_index_url: str | None = None, labels: dict[str, str] | None = None,
                extra_args: dict[str, str] | None = None, shown_as: str | None = None,
                target: str | None = None, no_cache: bool = False) -> str:
    """Build `dockerfile` (context: the checkout) on `parent_image` (its BASE_IMAGE) with the configuration's build
    arguments and tag it `image` only if the build succeeds, so a failed build leaves the previous image in place.
    `shown_as`: the name to report when `image` is a staging tag (see build_stack); `target`: a stage to stop at;
    `no_cache`: run every step again (docker build --no-cache; cache mounts such as pip's downloads stay)."""
    with tempfile.TemporaryDirectory(prefix="tfhpc-build-") as tmp:
        iidfile = Path(tmp) / "iid"
        args = ["--progress=plain", "--file", str(dockerfile), "--iidfile", str(iidfile),
                "--build-arg", f"BASE_IMAGE={parent_image}"]
        if target:
            args += ["--target", target]
        if no_cache:
            args.append("--no-cache")
        for key, value in {**config.build_args(), **(extra_args or {})}.items():
            args += ["--build-arg", f"{key}={value}"]
        for key, value in (labels or {}).items():
            args += ["--label", f"{key}={value}"]
        args += proxy_build_args()
        if ca_bundle:
            args += ["--secret", f"id=ca_bundle,src={ca_bundle}"]
        if pip_index_url:
            secret = Path(tmp) / "pip_index_url"
            secret.write_text(pip_index_url)
            secret.chmod(0o600)
            args += ["--secret", f"id=pip_index_url,src={secret}"]
        log(f"building {shown_as or image}")
        status = build_cli().run([*args, str(REPO_ROOT)])
        if status != 0 or not iidfile.is_file():
            raise UserError(f"building {shown_as or image} from {dockerfile} failed (build log above); "
                            f"{shown_as or image} was left as it was")
        image_id = iidfile.read_text().strip()
    repository, _, tag = image.partition(":")
    client().images.get(image_id).tag(repository, tag)
    return image


def layer_sources(config: Config, layer: str) -> tuple[str, ...]:
    """What the layer `layer` alone is built from (git pathspecs): its folder under containers/ and its lock files."""
    return f"containers/{layer}", f"{config.locks}/{layer}*.txt"


def declares_source_date_epoch(layer: str) -> bool:
    dockerfile = REPO_ROOT / "containers" / layer / "Dockerfile"
    return re.search(r"^ARG SOURCE_DATE_EPOCH\b", dockerfile.read_text(), re.MULTILINE) is not None


def layer_inputs(config: Config, layer: str) -> tuple[dict[str, str], dict[str, str]]:
    """The labels and the build arguments beyond the manifest's of the stack's layer `layer`. Only the leaf carries
    per-commit values (revision, creation time, its SBOM's name and timestamp): on the layers below they would change
    the image id at every commit and void the cache of everything built on top. The time is the source's
    (source_epoch), so a warm rebuild of the same commit gives the same image id and `make sif` does not convert
    again. A layer whose Dockerfile declares SOURCE_DATE_EPOCH gets the time of the last commit that changed that
    layer's own sources (layer_sources): it changes only when the layer rebuilds anyway, so a script edit does not
    reinstall TensorFlow."""
    extra_args = {}
    if declares_source_date_epoch(layer):
        extra_args["SOURCE_DATE_EPOCH"] = str(source_epoch(sources=layer_sources(config, layer)))
    if layer != config.layers.leaf:
        return config.labels(layer), extra_args
    return (config.labels(layer, git_revision(), source_date()),
            {**extra_args, "SBOM_IMAGE": config.image(layer), "SBOM_SOURCE_EPOCH": str(source_epoch())})


def build_layer(config: Config, layer: str, parent_image: str, ca_bundle: Path | None,
                pip_index_url: str | None, image: str | None = None, shown_as: str | None = None) -> str:
    """Build the stack's layer `layer` (containers/<layer>/Dockerfile) as `image` (default: its stack name)."""
    image = image or config.image(layer)
    labels, extra_args = layer_inputs(config, layer)
    try:
        return build_image(config, REPO_ROOT / "containers" / layer / "Dockerfile", image, parent_image, ca_bundle,
                           pip_index_url, labels, extra_args, shown_as=shown_as)
    except UserError:
        raise UserError(f"building layer '{layer}' failed (build log above); {shown_as or image} was left as it "
                        "was") from None


def build_stack(config: Config, target: str, base_source: str, ca_bundle: str | None,
                pip_index_url: str | None = None) -> list[str]:
    """Build `target` and its ancestors (root first). Returns the image names built."""
    check_base_source(base_source)
    check_locks(config)  # before any build: the layers install from the locks only
    bundle = resolve_ca_bundle(ca_bundle)
    client()  # fail early, in one line, when the daemon is not there
    log(f"CA bundle for the build: {bundle or 'none'}")
    chain = config.layers.chain(target)
    started = time.monotonic()
    parent = root = resolve_root(config, base_source)
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
                                     image=f"{final}-{staging}", shown_as=final)
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
    records = [probe_image(config, image) for image in built]
    for image, record in zip(built, records):
        update_images_json(image, record)
    record_sbom_and_provenance(config, dict(zip(chain, [None, *built[:-1]])), root, bundle, pip_index_url)
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


def record_sbom_and_provenance(config: Config, parents: dict[str, str | None], root_image: str | None,
                               ca_bundle: Path | None, pip_index_url: str | None) -> None:
    """build/sbom/ and build/provenance/ for the built layers `parents` (layer -> the stack image it was built on,
    None for the first layer). `root_image`: the OS root under the first layer; None: as the first layer's
    statement in build/provenance/ recorded it (CI builds one layer per job)."""
    from .sbom import file_name, sbom_path, write_sboms
    from .slsa import image_statement, recorded_root, root_material, statement_path, write_statement
    write_sboms(config, [config.image(layer) for layer in parents], ca_bundle, pip_index_url)
    root = root_material(config, root_image) if root_image else recorded_root(config)
    for layer, parent in parents.items():
        image = config.image(layer)
        build_args = {**config.build_args(), **layer_inputs(config, layer)[1]}
        write_statement(statement_path(file_name(image)),
                        image_statement(config, image, parent, root, build_args, sbom_path(image)))
    log(f"provenance: {statement_path('*').relative_to(REPO_ROOT)}")
