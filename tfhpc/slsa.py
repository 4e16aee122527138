"""Provenance of every built image and SIF: an in-toto Statement v1 (https://in-toto.io/Statement/v1) whose predicate
is SLSA provenance v1 (https://slsa.dev/spec/v1.0/provenance), in build/provenance/<name>.intoto.json, and with a
signing key a detached signature beside it (<name>.intoto.json.sig).

subject: the image id (the sha256 of its configuration, what `docker inspect` and `docker images --digests` name) or
the SIF file's sha256. resolvedDependencies: the git commit, versions.toml, the Horovod patches, the lock files
(locks/, when there is one), the parent image, and the OS root image (its registry digest, or the debootstrap mirror,
release and date). No clock: the same inputs give the same bytes, so a statement is rewritten, never made to differ,
by a warm rebuild.

The signature is over the statement file's bytes as written: RSA (PKCS #1 v1.5) or ECDSA with SHA-256, or Ed25519;
`openssl dgst -sha256 -verify KEY.pub -signature FILE.sig FILE` checks an RSA or ECDSA one (docs/publishing.md).
"""
from __future__ import annotations

import json
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

from .common import REPO_ROOT, UserError, git_head, git_revision, sha256_file, write_atomically
from .dockerhost import client
from .manifest import MANIFEST_PATH, Config
from .sbom import MEDIA_TYPE as SBOM_MEDIA_TYPE, file_name

PROVENANCE_DIR = REPO_ROOT / "build" / "provenance"
LOCKS_DIR = REPO_ROOT / "locks"
PATCH_DIR = REPO_ROOT / "containers" / "horovod" / "patches"
KERAS_PATCH_DIR = REPO_ROOT / "containers" / "tensorflow" / "patches" / "keras"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
MEDIA_TYPE = "application/vnd.in-toto+json"
# SLSA asks for a URI naming the build's template; these name tfhpc's two builds, described in docs/building.md.
IMAGE_BUILD_TYPE = "urn:tfhpc:build:make-image:v1"
SIF_BUILD_TYPE = "urn:tfhpc:build:make-sif:v1"
BUILDER_ID = "urn:tfhpc:builder:make"
ROOT_NAME = "root image"


def statement_path(name: str) -> Path:
    """build/provenance/<name>.intoto.json, `name` as sbom.file_name gives it or a SIF's file name."""
    return PROVENANCE_DIR / f"{name}.intoto.json"


def signature_path(statement: Path) -> Path:
    return statement.with_name(statement.name + ".sig")


def _hex(image_id: str) -> str:
    return image_id.split(":", 1)[-1]


def _file_material(path: Path) -> dict:
    return {"name": str(path.relative_to(REPO_ROOT)), "digest": {"sha256": sha256_file(path)}}


def source_materials(config: Config) -> list[dict]:
    """The checkout's commit, versions.toml, the stack's Horovod and Keras patches and every lock file."""
    head, dirty = git_head()
    materials = []
    if head:
        materials.append({"name": "git", "digest": {"gitCommit": head},
                          "annotations": {"imageSourcesCommit": git_revision(), "uncommittedImageSources": dirty}})
    materials.append(_file_material(MANIFEST_PATH))
    materials += [_file_material(PATCH_DIR / patch) for patch in config.horovod_patches]
    materials += [_file_material(KERAS_PATCH_DIR / patch) for patch in config.keras_patches]
    if LOCKS_DIR.is_dir():
        materials += [_file_material(path) for path in sorted(LOCKS_DIR.rglob("*")) if path.is_file()]
    return materials


def root_material(config: Config, root_image: str) -> dict:
    """The OS root image: a registry image by its repository digest, or debootstrap's by mirror, release and date."""
    attrs = client().images.get(root_image).attrs
    if root_image == config.debootstrap_root_image:
        return {"name": ROOT_NAME, "uri": config.os["apt_mirror"], "digest": {"sha256": _hex(attrs["Id"])},
                "annotations": {"debootstrap": config.os_release, "variant": "minbase", "created": attrs["Created"]}}
    digests = attrs.get("RepoDigests") or []
    if not digests:
        return {"name": ROOT_NAME, "uri": f"docker://{root_image}", "digest": {"sha256": _hex(attrs["Id"])}}
    return {"name": ROOT_NAME, "uri": f"docker://{digests[0]}", "digest": {"sha256": _hex(digests[0].split("@")[1])}}


def subject_sha256(path: Path) -> str:
    """The sha256 of the first subject of the statement at `path`, or "" when there is none."""
    try:
        return json.loads(path.read_text())["subject"][0]["digest"]["sha256"]
    except (FileNotFoundError, KeyError, IndexError, TypeError, ValueError):
        return ""


def recorded_root(config: Config) -> dict:
    """The root image material of the first layer's statement, when that statement is of the current image."""
    first = config.image(config.layers.names[0])
    path = statement_path(file_name(first))
    if subject_sha256(path) != _hex(client().images.get(first).id):
        raise UserError(f"{path.relative_to(REPO_ROOT)} is missing or not of the current {first}: build that "
                        "layer first (make image, or ci-build-layer in its job)")
    recorded = json.loads(path.read_text())["predicate"]["buildDefinition"]["resolvedDependencies"]
    return next(material for material in recorded if material["name"] == ROOT_NAME)


def statement(subject_name: str, sha256: str, build_type: str, external: dict, internal: dict,
              materials: list[dict], byproducts: list[dict]) -> dict:
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject_name, "digest": {"sha256": sha256}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {"buildType": build_type, "externalParameters": external,
                                "internalParameters": internal, "resolvedDependencies": materials},
            "runDetails": {"builder": {"id": BUILDER_ID}, "byproducts": byproducts},
        },
    }


def image_statement(config: Config, image: str, parent: str | None, root: dict, build_args: dict[str, str],
                    sbom: Path | None) -> dict:
    """The statement of the stack's image `image`, built on the image `parent` (None: on the root image)."""
    engine = client()
    attrs = engine.images.get(image).attrs
    materials = [*source_materials(config), root]
    if parent:
        materials.append({"name": parent, "digest": {"sha256": _hex(engine.images.get(parent).id)}})
    byproducts = [{"name": "sbom", "uri": str(sbom.relative_to(REPO_ROOT)), "mediaType": SBOM_MEDIA_TYPE,
                   "digest": {"sha256": sha256_file(sbom)}}] if sbom else []
    return statement(image, _hex(attrs["Id"]), IMAGE_BUILD_TYPE,
                     {"stack": config.stack, "flavor": config.flavor, "mpi": config.mpi,
                      "layer": attrs["Config"]["Labels"].get("io.tfhpc.layer", ""), "platform": config.platform},
                     {"buildArgs": build_args}, materials, byproducts)


def sif_statement(config: Config, sif: Path, image: str, definition: Path) -> dict:
    """The statement of a SIF converted from `image` with the definition file `definition`."""
    materials = source_materials(config)
    materials.append({"name": image, "digest": {"sha256": _hex(client().images.get(image).id)}})
    materials.append({"name": definition.name, "digest": {"sha256": sha256_file(definition)}})
    return statement(sif.name, sha256_file(sif), SIF_BUILD_TYPE,
                     {"stack": config.stack, "flavor": config.flavor, "mpi": config.mpi, "platform": config.platform},
                     {}, materials, [])


def encode(document: dict) -> bytes:
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()


def write_statement(path: Path, document: dict, sign_key: Path | None = None) -> Path:
    """Write the statement (and its signature with `sign_key`; an old signature is removed, never left to mismatch)."""
    write_atomically(path, encode(document))
    signature = signature_path(path)
    if sign_key is not None:
        write_atomically(signature, sign(path.read_bytes(), sign_key))
    elif signature.exists():
        signature.unlink()
    return path


def _private_key(sign_key: Path):
    try:
        return serialization.load_pem_private_key(sign_key.read_bytes(), password=None)
    except FileNotFoundError:
        raise UserError(f"SIGN_KEY={sign_key}: no such file: give a PEM private key "
                        "(openssl genpkey -algorithm RSA)") from None
    except (TypeError, ValueError) as error:
        raise UserError(f"SIGN_KEY={sign_key}: not an unencrypted PEM private key ({error}): give one "
                        "(openssl genpkey -algorithm RSA)") from None


def sign(data: bytes, sign_key: Path) -> bytes:
    """A detached signature of `data`: RSA PKCS #1 v1.5 or ECDSA (DER) with SHA-256, or Ed25519."""
    key = _private_key(sign_key)
    if isinstance(key, rsa.RSAPrivateKey):
        return key.sign(data, padding.PKCS1v15(), hashes.SHA256())
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.sign(data, ec.ECDSA(hashes.SHA256()))
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.sign(data)
    raise UserError(f"SIGN_KEY={sign_key}: a {type(key).__name__} cannot sign here: give an RSA, EC or Ed25519 key")


def public_key_pem(sign_key: Path) -> bytes:
    return _private_key(sign_key).public_key().public_bytes(serialization.Encoding.PEM,
                                                            serialization.PublicFormat.SubjectPublicKeyInfo)


def verify(data: bytes, signature: bytes, public_pem: bytes) -> bool:
    """Whether `signature` is a signature of `data` by the private key of `public_pem`."""
    key = serialization.load_pem_public_key(public_pem)
    try:
        if isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
        elif isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        elif isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, data)
        else:
            return False
    except InvalidSignature:
        return False
    return True
