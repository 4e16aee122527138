"""make sif: convert a built Docker image into a SIF with apptainer (or singularity).

The host's apptainer/singularity is used when there is one; otherwise a helper container built from
recipes/builder/Dockerfile carries Debian sid's apptainer. The SIF is written under a temporary name in build/sif/
and renamed when complete, so an interrupted conversion neither leaves a truncated SIF nor replaces a good one.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import tomllib
from pathlib import Path

from . import REPO_ROOT, UserError
from .build import build_layer
from .dockerhost import client
from .manifest import Config, Manifest
from .provenance import IMAGES_JSON, update_images_json
from .rootimage import log, resolve_root

SIF_DIR = REPO_ROOT / "build" / "sif"
TEMPLATE = REPO_ROOT / "recipes" / "app.def.in"
ENTRYPOINTS = REPO_ROOT / "scripts" / "entrypoints.toml"
# What the helper container needs to build and run SIFs, without --privileged (which some hosts refuse): FUSE for
# the SIF's squashfs, user namespaces (seccomp/apparmor unconfined) and an unmasked /proc (the CLI's
# `--security-opt systempaths=unconfined`), so that an unprivileged user can mount a fresh proc in its namespace.
# Builds run as that unprivileged user (apptainer then builds with fakeroot): as root, apptainer's build engine asks
# for every capability the kernel knows, more than docker grants.
HELPER_HOST_CONFIG = dict(cap_add=["ALL"], cap_drop=["SYS_RESOURCE"], devices=["/dev/fuse:/dev/fuse:rwm"],
                          security_opt=["seccomp=unconfined", "apparmor=unconfined"])
HELPER_USER = "tfhpc"


def sif_path(config: Config, layer: str) -> Path:
    return SIF_DIR / f"tfhpc-{layer}_{config.tag}.sif"


def render_definition(config: Config, layer: str, archive: str) -> str:
    labels = config.labels(layer)
    with ENTRYPOINTS.open("rb") as handle:
        entrypoints = tomllib.load(handle)
    apps = []
    for name, spec in entrypoints.items():
        apps.append(f"%apprun {name}\n    exec /usr/local/bin/tfhpc-{name} \"$@\"\n\n"
                    f"%apphelp {name}\n    {spec['help']}\n")
    components = ", ".join(f"{k} {v}" for k, v in config.component_versions().items())
    replacements = {
        "@FROM@": archive,
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


def host_apptainer() -> str | None:
    return shutil.which("apptainer") or shutil.which("singularity")


def builder_image_name(manifest: Manifest, config: Config) -> str:
    """One helper per apptainer version and OS release: its Open MPI (outside the SIF, for the hybrid launch
    `mpirun -np N apptainer exec ...`) must be the one inside the image, and each OS release has its own."""
    version = manifest.data["sif"]["apptainer_package_version"].replace("+", "_")
    return f"tfhpc-sif-builder:{version}-{config.os_release}"


def builder_image(manifest: Manifest, config: Config, base_source: str, ca_bundle: Path | None) -> str:
    """The helper image with apptainer, built once per apptainer version and OS (BuildKit cache does the rest)."""
    version = manifest.data["sif"]["apptainer_package_version"]
    name = builder_image_name(manifest, config)
    root = resolve_root(config, base_source)
    dockerfile = REPO_ROOT / "recipes" / "builder" / "Dockerfile"
    args = {"APPTAINER_PACKAGE_VERSION": version,
            "OUTER_OPENMPI_VERSION": config.os["mpi"]["openmpi"]["package_version"]}
    return build_layer(config, "base", root, ca_bundle, None, {}, dockerfile=dockerfile, image=name,
                       extra_args=args)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def start_helper(image: str, command: list[str], volumes: dict[str, str], user: str = "",
                 environment: dict | None = None, working_dir: str | None = None):
    """Start the apptainer helper container (detached) with the options above; returns the SDK container.
    `volumes` maps host paths to "container-path" or "container-path:ro"."""
    api = client().api
    binds = [f"{src}:{dst}" if dst.endswith((":ro", ":rw")) else f"{src}:{dst}:rw" for src, dst in volumes.items()]
    host_config = api.create_host_config(binds=binds,
                                         **HELPER_HOST_CONFIG)
    host_config["MaskedPaths"] = []  # systempaths=unconfined: the SDK has no keyword for these two
    host_config["ReadonlyPaths"] = []
    created = api.create_container(image, command, user=user, environment=environment or {},
                                   volumes=[dst.split(":")[0] for dst in volumes.values()], host_config=host_config,
                                   working_dir=working_dir)
    api.start(created["Id"])
    return client().containers.get(created["Id"])


def _definition_digest(config: Config, layer: str) -> str:
    """Digest of the rendered definition, independent of the temporary archive path."""
    return hashlib.sha256(render_definition(config, layer, "docker-archive").encode()).hexdigest()


def _up_to_date(target: Path, image_id: str, definition_digest: str) -> bool:
    """The SIF exists, is the one recorded (same sha256), and was made from this image id and this definition."""
    if not target.is_file():
        return False
    try:
        record = json.loads(IMAGES_JSON.read_text())["images"][f"sif:{target.name}"]
    except (FileNotFoundError, KeyError, ValueError):
        return False
    return (record.get("image_id") == image_id and record.get("size_bytes") == target.stat().st_size
            and record.get("definition_sha256") == definition_digest and record.get("sha256") == _sha256(target))


@contextlib.contextmanager
def helper_workdir(parent: Path, prefix: str):
    """A scratch directory that the helper container's unprivileged user can write (mode 0777), inside a directory
    of mode 0700: the container reaches it through its bind mount, other users of the host not at all (a signing
    key and the SIF being signed sit there). Removed afterwards, also on failure."""
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent, prefix=prefix) as private:  # created with mode 0700
        workdir = Path(private) / "work"
        workdir.mkdir()
        workdir.chmod(0o777)
        yield workdir


def run_apptainer(helper: str | None, workdir: Path, args: list[str], cwd: Path | None = None) -> None:
    """Run `apptainer ARGS` on the host, or in the helper container with `workdir` (its temporary directory) and
    `cwd` (read-only; where relative paths resolve) mounted at the same paths."""
    if helper is None:
        status = subprocess.call([host_apptainer(), *args], env={**os.environ, "APPTAINER_TMPDIR": str(workdir)},
                                 cwd=cwd)
        if status != 0:
            raise UserError(f"apptainer {args[0]} failed (exit {status}, output above)")
        return
    volumes = {str(cwd): f"{cwd}:ro"} if cwd else {}
    volumes[str(workdir)] = str(workdir)
    container = start_helper(helper, ["apptainer", *args], volumes, user=HELPER_USER,
                             environment={"APPTAINER_TMPDIR": str(workdir)},
                             working_dir=str(cwd) if cwd else None)
    try:
        for chunk in container.logs(stream=True, follow=True):
            os.write(2, chunk)
        status = container.wait()["StatusCode"]
    finally:
        container.remove(force=True)
    if status != 0:
        raise UserError(f"apptainer {args[0]} in the helper container failed (exit {status}, output above)")


def build_sif(manifest: Manifest, config: Config, layer: str, base_source: str, ca_bundle: Path | None,
              sign_key: Path | None = None) -> Path:
    import docker.errors
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
    if sign_key is None and _up_to_date(target, image_id, definition_digest):
        log(f"{target} is up to date with {image} ({image_id[:19]})")
        return target
    helper = None if host_apptainer() else builder_image(manifest, config, base_source, ca_bundle)
    log(f"converting {image} with {host_apptainer() or 'apptainer in ' + helper}")
    started = time.monotonic()
    with helper_workdir(SIF_DIR, ".convert-") as workdir:
        archive = workdir / "image.tar"
        with archive.open("wb") as handle:
            for chunk in client().images.get(image).save(chunk_size=8 << 20, named=True):
                handle.write(chunk)
        definition = workdir / "image.def"
        definition.write_text(render_definition(config, layer, str(archive)))
        for readable in (archive, definition):
            readable.chmod(0o644)
        partial = workdir / "image.sif"
        run_apptainer(helper, workdir, ["build", "--force", str(partial), str(definition)])
        archive.unlink()
        if sign_key is not None:
            shutil.copy(sign_key, workdir / "sign-key.pem")
            (workdir / "sign-key.pem").chmod(0o644)  # for the helper's user; no one else reaches helper_workdir
            run_apptainer(helper, workdir, ["sign", "--key", str(workdir / "sign-key.pem"), str(partial)])
        os.replace(definition, target.with_suffix(".def"))  # same file system: each file appears whole or not at all
        os.replace(partial, target)
    seconds = round(time.monotonic() - started, 1)
    update_images_json(f"sif:{target.name}", {
        "path": str(target.relative_to(REPO_ROOT)), "image": image, "image_id": image_id,
        "definition_sha256": definition_digest, "size_bytes": target.stat().st_size,
        "sha256": _sha256(target), "signed": sign_key is not None, "conversion_seconds": seconds,
        "docker_image_size_bytes": client().images.get(image).attrs["Size"]})
    log(f"wrote {target} ({target.stat().st_size / 1e9:.2f} GB) in {seconds} s")
    return target
