"""One docker build of one layer: the build arguments, labels and secrets it takes, and the inputs of a layer
(its sources, its SOURCE_DATE_EPOCH). The primitive below both the stack's build (build.py) and what describes built
images (sbom.py's tools stage, attest.py's statements)."""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from .common import REPO_ROOT, UserError, git_revision, log, source_date, source_epoch
from .cross import uses_cross
from .dockerhost import build_cli, client
from .manifest import Config


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
                target: str | None = None, no_cache: bool = False, context: Path = REPO_ROOT) -> str:
    """Build `dockerfile` (context: the checkout, or `context`) for the configuration's platform on `parent_image`
    (its BASE_IMAGE) with the configuration's build arguments and tag it `image` only if the build succeeds, so a failed build leaves the
    previous image in place. `shown_as`: the name to report when `image` is a staging tag (see build_stack);
    `target`: a stage to stop at; `no_cache`: run every step again (docker build --no-cache; cache mounts such as
    pip's downloads stay)."""
    with tempfile.TemporaryDirectory(prefix="tfhpc-build-") as tmp:
        iidfile = Path(tmp) / "iid"
        args = ["--progress=plain", "--file", str(dockerfile), "--iidfile", str(iidfile),
                "--platform", config.platform, "--build-arg", f"BASE_IMAGE={parent_image}"]
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
        status = build_cli().run([*args, str(context)])
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
                pip_index_url: str | None, image: str | None = None, shown_as: str | None = None,
                cross: dict[str, str] | None = None) -> str:
    """Build the stack's layer `layer` (containers/<layer>/Dockerfile) as `image` (default: its stack name).
    `cross`: an emulated build's cross-compiler arguments (tfhpc/cross.py), for the layers that compile."""
    image = image or config.image(layer)
    labels, extra_args = layer_inputs(config, layer)
    if cross and uses_cross(layer):
        extra_args = {**extra_args, **cross}
    try:
        return build_image(config, REPO_ROOT / "containers" / layer / "Dockerfile", image, parent_image, ca_bundle,
                           pip_index_url, labels, extra_args, shown_as=shown_as, target=config.build_target(layer))
    except UserError:
        raise UserError(f"building layer '{layer}' failed (build log above); {shown_as or image} was left as it "
                        "was") from None
