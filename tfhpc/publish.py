"""make push: publish the built images and the app SIF of one stack configuration (STACK/FLAVOR/MPI) to a registry.

Tags come from the versions manifest through `Config` (no version is written here):
- a versioned tag `tf<TF minor>-hvd<Horovod>-<mpi><MPI minor>-<flavour>[-cuda<CUDA minor>]` (`make show` and
  docs/publishing.md give the current one; a version written here would be a second source);
- moving tags: the configuration's local tag (`latest-cpu-openmpi`), and the bare flavour (`cpu`) for the manifest's
  default stack and MPI.
Every architecture of versions.toml whose images of this configuration are built is published (`make image ARCH=arm64`
and `make sif ARCH=arm64` beside the default build add linux/arm64), each under tags of its own, and every tag above
is an OCI image index over them (tfhpc/imageindex.py), so that one name serves amd64 and GH200 (arm64) nodes:
- images: REGISTRY/tfhpc-<layer>:<versioned tag>-<arch> (docker SDK push), and :<tag> the index;
- the SIF: oras://REGISTRY/tfhpc-<leaf>-sif:<tag>-<arch> (`apptainer push`, signed on the way with SIGN_KEY when one
  is given), and :<tag> the index (Apptainer 1.5 picks its platform from it, 1.4 always the amd64 SIF);
- beside each SIF, with ORAS, its images' CycloneDX SBOMs (build/sbom/) as :<tag>-<arch>-sbom and the provenance
  statements of its images and of the pushed SIF (build/provenance/, signed with SIGN_KEY when one is given) as
  :<tag>-<arch>-provenance.

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
from .imageindex import IndexWriter, platform
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
    tags = [config.tag.removesuffix(config.arch_suffix)]  # one tag for every architecture (an index)
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
    """What `make push` publishes of one architecture."""
    config: Config
    registry: str
    scheme: str  # how the registry answered: "https" or "http" (plain HTTP: apptainer needs --no-https)
    images: dict[str, str]  # local image -> registry repository (without tag)
    sif: Path
    sif_repository: str  # oras:// reference without tag
    tags: list[str]  # versioned tag(s) first, moving tags after: the images' indexes, for every architecture

    @property
    def arch_tag(self) -> str:
        """The tag of this architecture's images, which the indexes name: `<versioned tag>-<arch>`."""
        return f"{self.tags[0]}-{self.config.arch}"

    @property
    def sif_tags(self) -> list[str]:
        """The SIF's tags, `<tag>-<arch>` for every tag: a SIF is one architecture's file. Each `<tag>` is an index
        over them, which Apptainer 1.5 resolves by platform; 1.4 takes its linux/amd64 entry whatever the host
        (apptainer/apptainer#3345), so an arm64 node of 1.4 names `<tag>-arm64` (docs/publishing.md)."""
        return [f"{tag}-{self.config.arch}" for tag in self.tags]

    def sif_refs(self) -> list[str]:
        return [f"oras://{self.sif_repository}:{tag}" for tag in self.sif_tags]


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
    if (record.get("image_id") != engine.images.get(config.image(leaf)).id
            or record.get("size_bytes") != sif.stat().st_size):
        raise UserError(f"{sif.relative_to(REPO_ROOT)} was not made from the current {config.image(leaf)}: "
                        "run `make sif` first; nothing was pushed")
    check_records(config, list(images), sif)
    try:
        Apptainer.for_config(manifest, config, build=False)
    except UserError as error:
        raise UserError(f"{error}; nothing was pushed") from None
    scheme = probe_registry(registry)
    tags = [version_tag(config), *moving_tags(manifest, config)]
    return Plan(config, registry, scheme, images, sif, f"{registry}/{IMAGE_PREFIX}-{leaf}{SIF_REPOSITORY_SUFFIX}",
                tags)


def built_arches(manifest: Manifest, config: Config) -> tuple[list[Config], list[str]]:
    """The configuration in every architecture to publish, the default architecture first (make_plan then checks
    it): the default one when its leaf image is built, and each other one whose leaf image is built and whose SIF
    this checkout made (an image alone may be another checkout's). Their leaf images must be of one commit. Also a
    note for each architecture left out, which push prints once every check has passed."""
    default = manifest.data["default_arch"]
    configs = []
    for arch in sorted(manifest.arches, key=lambda arch: arch != default):
        try:
            configs.append(config if arch == config.arch else manifest.config(config.stack, config.flavor,
                                                                               config.mpi, arch))
        except UserError:  # a configuration versions.toml does not have for that architecture
            continue
    leaf = manifest.layers.leaf
    built, notes = [], []
    for candidate in configs:
        try:
            image = client().images.get(candidate.image(leaf))
        except docker.errors.ImageNotFound:
            image = None
        if image is not None and (candidate.arch == default or sif_path(candidate, leaf).is_file()):
            built.append((candidate, image.labels.get("org.opencontainers.image.revision", "")))
        else:
            notes.append(f"{candidate.arch}: {candidate.image(leaf)} or its SIF is not built here, so not "
                         f"published: `make image ARCH={candidate.arch} && make sif ARCH={candidate.arch}` adds it")
    if not built:
        return [config], notes  # make_plan names what is missing
    if len({revision for _, revision in built}) > 1:
        shown = ", ".join(f"{candidate.arch} {revision[:12] or 'no revision'}" for candidate, revision in built)
        raise UserError(f"the architectures' images are of different commits ({shown}): build them all from this "
                        "checkout (`make image ARCH=...`) before one tag names them; nothing was pushed")
    return [candidate for candidate, _ in built], notes


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


def _sif_workdir(workdir: Path, arch: str) -> Path:
    """One directory per architecture in the push's scratch: the SIF's copy, the key's copies, its statements."""
    own = workdir / arch
    own.mkdir()
    own.chmod(0o777)  # the helper's user writes apptainer's files here
    for key in ("sign-key.pem", "sign-key.pub"):
        if (workdir / key).is_file():
            shutil.copyfile(workdir / key, own / key)
            (own / key).chmod(0o644)
    return own


def _push_sif(plan: Plan, runtime: Apptainer, sign_key: Path | None, workdir: Path, tag_index: int,
              signed: Path | None = None) -> tuple[str, dict | None, Path]:
    """Push one architecture's SIF as <tag>-<arch> of plans' tags[tag_index] (the first time signed on the way with
    `sign_key`; later pushes give the `signed` copy), then its SBOMs and provenance beside it (<tag>-<arch>-sbom,
    -provenance). Returns the SIF's reference, its attestations' files (first push only, else None) and the pushed
    copy."""
    config, plain_http = plan.config, plan.scheme == "http"
    reference = plan.sif_refs()[tag_index]
    if signed is None:
        workdir = _sif_workdir(workdir, config.arch)
        signed = workdir / plan.sif.name
        shutil.copyfile(plan.sif, signed)
        signed.chmod(0o666)
        log(f"pushing {plan.sif.name} as {reference}" + (" (signed with SIGN_KEY)" if sign_key else ""))
        if sign_key is not None:
            runtime.sign(signed, workdir / "sign-key.pem", workdir)
            runtime.verify(signed, workdir / "sign-key.pub", workdir)
    runtime.push(signed, reference, signed.parent, plain_http)
    attestations = attestation_files(config, plan, signed, sign_key, signed.parent) if tag_index == 0 else None
    return reference, attestations, signed


def push(manifest: Manifest, config: Config, registry: str | None, sign_key: Path | None = None) -> dict:
    """Publish every built architecture of the configuration (tfhpc/imageindex.py): each one's images under
    `<versioned tag>-<arch>` and its SIF, SBOMs and provenance under `<tag>-<arch>` for every tag; then each tag as
    an index over the architectures, for every image and for the SIF."""
    if sign_key is not None and not sign_key.is_file():
        raise UserError(f"SIGN_KEY={sign_key}: no such file: give a PEM private key "
                        "(openssl genpkey -algorithm RSA); nothing was pushed")
    parse_registry(registry)  # before anything else: its error is the one a bare `make push` meets
    configs, notes = built_arches(manifest, config)
    plans = [make_plan(manifest, built, registry) for built in configs]
    for note in notes:  # after every check, so that a failing one is the only line printed
        log(note)
    first = plans[0]
    tags, plain_http = first.tags, first.scheme == "http"
    log(f"publishing {', '.join(built.platform for built in configs)} under {', '.join(tags)}")
    engine = client()
    runtime = Apptainer.for_config(manifest, config, build=False)
    indexes = IndexWriter(first.registry, plain_http, uses_proxy(first.registry.split("/", 1)[0]))
    aliases: list[tuple[str, str]] = []
    published = {"registry": first.registry, "scheme": first.scheme, "stack": config.stack, "flavor": config.flavor,
                 "mpi": config.mpi, "tags": tags, "platforms": [built.platform for built in configs], "images": {},
                 "indexes": {}, "sif": {}}
    PUBLISHED_JSON.parent.mkdir(parents=True, exist_ok=True)
    with scratch_dir(PUBLISHED_JSON.parent, ".push-") as workdir:
        public_key = None
        if sign_key is not None:
            # Signed here rather than at `make sif`, so that a CI hands the key to the publishing job only.
            shutil.copyfile(sign_key, workdir / "sign-key.pem")
            (workdir / "sign-key.pem").chmod(0o644)  # for the helper's user; no one else reaches scratch_dir
            public_key = runtime.public_key(workdir / "sign-key.pem", workdir)  # workdir / "sign-key.pub"
        entries: dict[str, list[dict]] = {}  # registry repository -> the entries of its indexes
        try:
            # 1. every architecture's images (parents first) under <versioned tag>-<arch>
            for plan in plans:
                for local, repository in plan.images.items():
                    reference = f"{repository}:{plan.arch_tag}"
                    engine.images.get(local).tag(repository, plan.arch_tag)
                    aliases.append((repository, plan.arch_tag))
                    log(f"pushing {local} as {reference}")
                    attrs = engine.images.get(local).attrs
                    published["images"][reference] = {"image": local, "digest": _docker_push(reference),
                                                      "image_id": attrs["Id"], "platform": plan.config.platform}
                    entries.setdefault(repository, []).append(
                        indexes.entry(repository, plan.arch_tag, platform(attrs["Os"], attrs["Architecture"])))
            # 2. every architecture's SIF as <versioned tag>-<arch>, its SBOMs and provenance beside it
            attestations, copies = {}, {}
            for plan in plans:
                arch = plan.config.arch
                try:
                    reference, attestations[arch], copies[arch] = _push_sif(plan, runtime, sign_key, workdir, 0)
                except UserError as error:
                    raise UserError(f"{error}; moving tags were not updated and build/published.json was not "
                                    "written") from None
                published["sif"][arch] = {"file": str(plan.sif.relative_to(REPO_ROOT)),
                                          "sha256": sha256_file(copies[arch]), "platform": plan.config.platform,
                                          "size_bytes": copies[arch].stat().st_size, "signed": sign_key is not None,
                                          "references": [reference]}
                for kind, files in attestations[arch].items():
                    attestation = f"{plan.sif_repository}:{plan.sif_tags[0]}-{kind}"
                    log(f"pushing {len(files)} {kind} files as oras://{attestation}")
                    published["sif"][arch][kind] = {"references": [f"oras://{attestation}"],
                                                    "digest": _oras_push(attestation, files, plain_http),
                                                    "files": {path.name: sha256_file(path) for path in files}}
                entries.setdefault(plan.sif_repository, []).append(
                    indexes.entry(plan.sif_repository, plan.sif_tags[0], platform("linux", arch)))
            # 3. the versioned tag: one index per repository over the architectures
            for repository, listed in entries.items():
                published["indexes"][f"{repository}:{tags[0]}"] = {
                    "digest": indexes.put(repository, tags[0], listed),
                    "manifests": [entry["digest"] for entry in listed]}
            if public_key is not None:
                # The public key to hand to the sites, beside the record.
                public = PUBLISHED_JSON.with_name(f"{first.sif.stem}.pub")
                shutil.copyfile(public_key, public.with_suffix(".pub.partial"))
                os.replace(public.with_suffix(".pub.partial"), public)  # whole or not at all
                for record in published["sif"].values():
                    record["public_key"] = _shown(public)
            # 4. only now the moving tags, which sites follow. A registry cannot move several tags at once: if a
            # push fails here, the error names the tags already moved, and `make push` again moves the rest.
            moved: list[str] = []
            try:
                for position, tag in enumerate(tags[1:], start=1):
                    for repository, listed in entries.items():  # the images' indexes, parents first
                        if repository != first.sif_repository:
                            published["indexes"][f"{repository}:{tag}"] = {
                                "digest": indexes.put(repository, tag, listed),
                                "manifests": [entry["digest"] for entry in listed]}
                            moved.append(f"{repository}:{tag}")
                    for plan in plans:  # each architecture's SIF and its attestations, then the SIF's index
                        arch, record = plan.config.arch, published["sif"][plan.config.arch]
                        try:
                            reference, _, _ = _push_sif(plan, runtime, sign_key, workdir, position, copies[arch])
                        except UserError as error:
                            raise UserError(f"{error}; moving tags were not updated") from None
                        record["references"].append(reference)
                        moved.append(reference)
                        for kind, files in attestations[arch].items():
                            attestation = f"{plan.sif_repository}:{plan.sif_tags[position]}-{kind}"
                            _oras_push(attestation, files, plain_http)
                            record[kind]["references"].append(f"oras://{attestation}")
                            moved.append(f"oras://{attestation}")
                    listed = entries[first.sif_repository]
                    published["indexes"][f"{first.sif_repository}:{tag}"] = {
                        "digest": indexes.put(first.sif_repository, tag, listed),
                        "manifests": [entry["digest"] for entry in listed]}
                    moved.append(f"oras://{first.sif_repository}:{tag}")
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
    log(f"published {', '.join(published['platforms'])}: {len(published['images'])} images, {len(published['sif'])} "
        f"SIFs, {len(published['indexes'])} indexes to {first.registry}; record: {_shown(PUBLISHED_JSON)}")
    return published
