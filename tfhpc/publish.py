"""make push: publish the built images and the app SIF of one stack configuration (STACK/FLAVOR/MPI) to a registry.

Tags come from the versions manifest through `Config` (no version is written here):
- a versioned tag `tf<TF minor>-hvd<Horovod>-<mpi><MPI minor>-<flavour>[-cuda<CUDA minor>]` (`make show` and
  docs/publishing.md give the current one; a version written here would be a second source);
- moving tags: the configuration's local tag (`latest-cpu-openmpi`), and the bare flavour (`cpu`) for the manifest's
  default stack and MPI.
Docker images go to REGISTRY/tfhpc-<layer>:<tag> (docker SDK push), the SIF to oras://REGISTRY/tfhpc-<leaf>-sif:<tag>
(`apptainer push`), signed on the way with SIGN_KEY when one is given.

Beside the SIF go, with ORAS, every image's CycloneDX SBOM (build/sbom/) as oras://REGISTRY/tfhpc-<leaf>-sif:<tag>-sbom
and the provenance statements of the images and of the pushed SIF (build/provenance/, signed with SIGN_KEY when one is
given) as :<tag>-provenance.

Nothing is half-published as done: every check (REGISTRY given and reachable, every image built, the SIF up to date
with the image, the helper that carries apptainer) runs before the first push; the versioned tags are pushed first
and the moving tags (what sites follow) only after all of them succeeded; build/published.json is written last.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import docker.errors
import requests

from .apptainer import Apptainer, scratch_dir
from .common import REPO_ROOT, UserError, log, sha256_file, write_atomically
from .dockerhost import client
from .manifest import IMAGE_PREFIX, Config, Manifest, upstream_version
from .provenance import IMAGES_JSON
from .sbom import MEDIA_TYPE as SBOM_MEDIA_TYPE, file_name, sbom_path
from .sif import sif_path
from .slsa import (MEDIA_TYPE as STATEMENT_MEDIA_TYPE, sif_statement, sign, signature_path, statement_path,
                   subject_sha256, write_statement)

PUBLISHED_JSON = REPO_ROOT / "build" / "published.json"
SIGNATURE_MEDIA_TYPE = "application/octet-stream"  # a detached signature's raw bytes (tfhpc/slsa.py sign)
SIF_REPOSITORY_SUFFIX = "-sif"
# host[:port][/namespace...]: what `docker tag` accepts in front of the repository name.
REGISTRY_RE = re.compile(r"^(?P<host>[A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\])(?::(?P<port>\d{1,5}))?"
                         r"(?P<path>(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*)$")
LOOPBACK = re.compile(r"^(localhost|127(?:\.\d{1,3}){3}|\[::1\])$")
PUSH_HINT = "e.g. make push REGISTRY=127.0.0.1:5000 (or ghcr.io/ORG)"


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def version_tag(config: Config) -> str:
    """The tag that names what is inside: TensorFlow minor, Horovod release, MPI minor, flavour (and CUDA minor in
    the GPU flavour, whose driver requirement it sets)."""
    mpi_version = upstream_version(config.os["mpi"][config.mpi]["package_version"])
    cuda = f"-cuda{_minor(str(config.gpu['cuda']))}" if getattr(config, "gpu", None) else ""
    return (f"tf{_minor(config.versions['tensorflow'])}-hvd{config.versions['horovod']}"
            f"-{config.mpi}{_minor(mpi_version)}-{config.flavor}{cuda}")


def moving_tags(manifest: Manifest, config: Config) -> list[str]:
    """Tags that move to the newest build: the configuration's tag, and the flavour alone for the default stack/MPI."""
    tags = [config.tag]
    if config.stack == manifest.data["default_stack"] and config.mpi == manifest.data["default_mpi"]:
        tags.append(config.flavor)
    return tags


def parse_registry(registry: str | None) -> str:
    registry = (registry or "").strip().rstrip("/")
    if not registry:
        raise UserError(f"REGISTRY is not set: give the registry to push to, {PUSH_HINT}")
    if "://" in registry or not REGISTRY_RE.match(registry):
        raise UserError(f"REGISTRY={registry} is not host[:port][/namespace]: {PUSH_HINT}")
    return registry


@dataclass(frozen=True)
class Plan:
    registry: str
    scheme: str  # how the registry answered: "https" or "http" (plain HTTP: apptainer needs --no-https)
    images: dict[str, str]  # local image -> registry repository (without tag)
    sif: Path
    sif_repository: str  # oras:// reference without tag
    tags: list[str]  # versioned tag(s) first, moving tags after

    def refs(self, repository: str) -> list[str]:
        return [f"{repository}:{tag}" for tag in self.tags]


def uses_proxy(host: str) -> bool:
    """Whether requests to `host` may go through the environment's proxy: a loopback registry is never behind it."""
    return not LOOPBACK.match(host.rsplit(":", 1)[0] if not host.startswith("[") else host)


def probe_registry(registry: str) -> str:
    """'https' or 'http', whichever the registry's /v2/ endpoint answers on; one-line UserError when neither."""
    host = registry.split("/", 1)[0]
    session = requests.Session()
    session.trust_env = uses_proxy(host)
    failures = []
    for scheme in ("https", "http"):
        try:
            answer = session.get(f"{scheme}://{host}/v2/", timeout=10)
        except requests.RequestException as error:
            failures.append(f"{scheme}: {type(error).__name__}")
            continue
        if answer.status_code in (200, 401) or "Docker-Distribution-Api-Version" in answer.headers:
            return scheme
        failures.append(f"{scheme}: HTTP {answer.status_code} at /v2/")
    raise UserError(f"registry {host} unreachable or not a registry ({'; '.join(failures)}): start it, "
                    f"or fix REGISTRY ({PUSH_HINT}); nothing was pushed")


def _recorded_sif(sif: Path) -> dict:
    try:
        return json.loads(IMAGES_JSON.read_text())["images"][f"sif:{sif.name}"]
    except (FileNotFoundError, KeyError, ValueError):
        return {}


def check_records(config: Config, images: list[str], sif: Path) -> None:
    """Every image's SBOM and provenance statement, and the SIF's statement, exist and name what is pushed."""
    for image in images:
        sbom = sbom_path(image)
        statement = statement_path(file_name(image))
        try:
            named = json.loads(sbom.read_text())["metadata"]["component"]["bom-ref"]
        except (FileNotFoundError, KeyError, ValueError):
            named = ""
        if named != image or f"sha256:{subject_sha256(statement)}" != client().images.get(image).id:
            raise UserError(f"{image}'s SBOM or provenance ({_shown(sbom)}, {_shown(statement)}) is missing or of "
                            "another build: run `make image` (same STACK/FLAVOR/MPI) first; nothing was pushed")
    statement = statement_path(sif.name)
    if subject_sha256(statement) != sha256_file(sif):
        raise UserError(f"{_shown(statement)} is missing or not of {_shown(sif)}: run `make sif` first; "
                        "nothing was pushed")


def make_plan(manifest: Manifest, config: Config, registry: str | None) -> Plan:
    """Every check that can fail before a byte is pushed."""
    registry = parse_registry(registry)
    engine = client()
    images = {}
    for layer in manifest.layers.names:
        local = config.image(layer)
        try:
            engine.images.get(local)
        except docker.errors.ImageNotFound:
            raise UserError(f"{local} is not built: run `make image` (same STACK/FLAVOR/MPI) first; "
                            "nothing was pushed") from None
        images[local] = f"{registry}/{local.partition(':')[0]}"
    leaf = manifest.layers.leaf
    sif = sif_path(config, leaf)
    if not sif.is_file():
        raise UserError(f"{sif.relative_to(REPO_ROOT)} is missing: run `make sif` first; nothing was pushed")
    record = _recorded_sif(sif)
    if record.get("image_id") != engine.images.get(config.image(leaf)).id or record.get("size_bytes") != sif.stat().st_size:
        raise UserError(f"{sif.relative_to(REPO_ROOT)} was not made from the current {config.image(leaf)}: "
                        "run `make sif` first; nothing was pushed")
    check_records(config, list(images), sif)
    try:
        Apptainer.for_config(manifest, config, build=False)
    except UserError as error:
        raise UserError(f"{error}; nothing was pushed") from None
    scheme = probe_registry(registry)
    tags = [version_tag(config), *moving_tags(manifest, config)]
    return Plan(registry, scheme, images, sif, f"{registry}/{IMAGE_PREFIX}-{leaf}{SIF_REPOSITORY_SUFFIX}", tags)




def _shown(path: Path) -> str:
    """A path as the record and the messages give it: relative to the checkout when inside it."""
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def _docker_push(reference: str) -> str:
    """Push one registry reference with the docker SDK; returns the manifest digest the registry reported."""
    repository, _, tag = reference.rpartition(":")
    digest = ""
    try:
        for event in client().api.push(repository, tag=tag, stream=True, decode=True):
            if "error" in event or "errorDetail" in event:
                reason = event.get("error") or event["errorDetail"].get("message", "")
                raise UserError(f"pushing {reference} failed ({reason.strip()}): check the registry and "
                                "`docker login`; moving tags were not updated")
            digest = event.get("aux", {}).get("Digest", digest)
    except docker.errors.APIError as error:
        raise UserError(f"pushing {reference} failed ({error.explanation or error}): check the registry and "
                        "`docker login`; moving tags were not updated") from None
    if not digest:
        raise UserError(f"pushing {reference}: the registry reported no digest; moving tags were not updated")
    return digest


def attestation_files(config: Config, plan: Plan, sif: Path, sign_key: Path | None, workdir: Path) -> dict:
    """ATTESTATIONS' files for the pushed SIF `sif` (a signed copy has its own sha256, so its statement is made here)
    and the images: path -> media type. Statements are signed with `sign_key` (<statement>.sig)."""
    statements = workdir / "provenance"
    statements.mkdir()
    for image in plan.images:
        shutil.copyfile(statement_path(file_name(image)), statements / statement_path(file_name(image)).name)
    write_statement(statements / statement_path(sif.name).name,
                    sif_statement(config, sif, config.image(config.layers.leaf), plan.sif.with_suffix(".def")))
    files = {"sbom": {sbom_path(image): SBOM_MEDIA_TYPE for image in plan.images}, "provenance": {}}
    for statement in sorted(statements.iterdir()):
        files["provenance"][statement] = STATEMENT_MEDIA_TYPE
        if sign_key is not None:
            signature = write_atomically(signature_path(statement), sign(statement.read_bytes(), sign_key))
            files["provenance"][signature] = SIGNATURE_MEDIA_TYPE
    return files


def _oras_push(reference: str, files: dict[Path, str], plain_http: bool) -> str:
    """Push `files` (path -> media type) as one OCI artifact with ORAS; returns the manifest digest."""
    import oras.client  # here: ~1 s to import, for the push only (edf and the tests use this module)
    client_ = oras.client.OrasClient(insecure=plain_http)
    client_.session.trust_env = uses_proxy(reference.split("/", 1)[0])
    try:
        answer = client_.push(target=reference, files=[f"{path}:{media}" for path, media in files.items()],
                              disable_path_validation=True, quiet=True)
    except (requests.RequestException, ValueError, OSError) as error:
        raise UserError(f"pushing {reference} failed ({error}): check the registry and `docker login`; "
                        "moving tags were not updated") from None
    return answer.headers.get("Docker-Content-Digest", "")


def push(manifest: Manifest, config: Config, registry: str | None, sign_key: Path | None = None) -> dict:
    if sign_key is not None and not sign_key.is_file():
        raise UserError(f"SIGN_KEY={sign_key}: no such file: give a PEM private key "
                        "(openssl genpkey -algorithm RSA); nothing was pushed")
    plan = make_plan(manifest, config, registry)
    engine = client()
    runtime = Apptainer.for_config(manifest, config, build=False)
    plain_http = plan.scheme == "http"
    aliases: list[tuple[str, str]] = []
    published = {"registry": plan.registry, "scheme": plan.scheme, "stack": config.stack, "flavor": config.flavor,
                 "mpi": config.mpi, "tags": plan.tags, "images": {}, "sif": {}}
    PUBLISHED_JSON.parent.mkdir(parents=True, exist_ok=True)
    with scratch_dir(PUBLISHED_JSON.parent, ".push-") as workdir:
        sif = workdir / plan.sif.name
        shutil.copyfile(plan.sif, sif)
        sif.chmod(0o666)
        public_key = None
        if sign_key is not None:
            # Signed here rather than at `make sif`, so that a CI hands the key to the publishing job only.
            shutil.copyfile(sign_key, workdir / "sign-key.pem")
            (workdir / "sign-key.pem").chmod(0o644)  # for the helper's user; no one else reaches scratch_dir
        try:
            # 1. versioned tags of every image (parents first), then of the SIF
            for local, repository in plan.images.items():
                reference = f"{repository}:{plan.tags[0]}"
                engine.images.get(local).tag(repository, plan.tags[0])
                aliases.append((repository, plan.tags[0]))
                log(f"pushing {local} as {reference}")
                published["images"][reference] = {"image": local, "digest": _docker_push(reference),
                                                  "image_id": engine.images.get(local).id}
            sif_refs = [f"oras://{ref}" for ref in plan.refs(plan.sif_repository)]
            log(f"pushing {plan.sif.name} as {sif_refs[0]}" + (" (signed with SIGN_KEY)" if sign_key else ""))
            try:
                if sign_key is not None:
                    public_key = runtime.public_key(workdir / "sign-key.pem", workdir)
                    runtime.sign(sif, workdir / "sign-key.pem", workdir)
                    runtime.verify(sif, public_key, workdir)
                runtime.push(sif, sif_refs[0], workdir, plain_http)
            except UserError as error:
                raise UserError(f"{error}; moving tags were not updated and build/published.json was not "
                                "written") from None
            published["sif"] = {"file": str(plan.sif.relative_to(REPO_ROOT)), "sha256": sha256_file(sif),
                                "size_bytes": sif.stat().st_size, "signed": sign_key is not None,
                                "references": [sif_refs[0]]}
            # SBOMs and provenance beside the SIF: <sif repository>:<tag>-sbom and :<tag>-provenance
            attestations = attestation_files(config, plan, sif, sign_key, workdir)
            for kind, files in attestations.items():
                reference = f"{plan.sif_repository}:{plan.tags[0]}-{kind}"
                log(f"pushing {len(files)} {kind} files as oras://{reference}")
                published[kind] = {"references": [f"oras://{reference}"],
                                   "digest": _oras_push(reference, files, plain_http),
                                   "files": {path.name: sha256_file(path) for path in files}}
            if sign_key is not None:
                # The public key to hand to the sites, beside the record.
                public = PUBLISHED_JSON.with_name(f"{plan.sif.stem}.pub")
                shutil.copyfile(public_key, public.with_suffix(".pub.partial"))
                os.replace(public.with_suffix(".pub.partial"), public)  # whole or not at all
                published["sif"]["public_key"] = _shown(public)
            # 2. only now the moving tags, which sites follow. A registry cannot move several tags at once: if a
            # push fails here, the error names the tags already moved, and `make push` again moves the rest.
            moved: list[str] = []
            try:
                for tag in plan.tags[1:]:
                    for local, repository in plan.images.items():
                        engine.images.get(local).tag(repository, tag)
                        aliases.append((repository, tag))
                        reference = f"{repository}:{tag}"
                        log(f"pushing {local} as {reference}")
                        published["images"][reference] = {"image": local, "digest": _docker_push(reference),
                                                          "image_id": engine.images.get(local).id}
                        moved.append(reference)
                for reference in sif_refs[1:]:
                    try:
                        runtime.push(sif, reference, workdir, plain_http)
                    except UserError as error:
                        raise UserError(f"{error}; moving tags were not updated") from None
                    moved.append(reference)
                published["sif"]["references"] = sif_refs
                for tag in plan.tags[1:]:
                    for kind, files in attestations.items():
                        reference = f"{plan.sif_repository}:{tag}-{kind}"
                        _oras_push(reference, files, plain_http)
                        published[kind]["references"].append(f"oras://{reference}")
                        moved.append(f"oras://{reference}")
            except UserError as error:
                raise UserError(str(error).replace(
                    "moving tags were not updated",
                    f"moving tags already updated: {', '.join(moved) or 'none'}; run `make push` again to move "
                    f"the rest")) from None
        finally:
            # The registry-named tags were only the push's handles: the local images keep their own names.
            for repository, tag in aliases:
                try:
                    engine.images.remove(f"{repository}:{tag}", noprune=True)
                except Exception:  # already gone: nothing to undo
                    pass
    published["when"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    partial = PUBLISHED_JSON.with_suffix(".json.partial")
    partial.write_text(json.dumps(published, indent=2) + "\n")
    os.replace(partial, PUBLISHED_JSON)
    log(f"published {len(published['images'])} image tags and {len(published['sif']['references'])} SIF tags "
        f"to {plan.registry}; record: {_shown(PUBLISHED_JSON)}")
    return published
