"""One tag for several architectures: an OCI image index over the manifests `make push` pushed for each one.

`docker pull`, podman, enroot/pyxis (`enroot import docker://`), Sarus and `apptainer pull docker://` read the index
and take the manifest of their own platform (or of `--platform`/`--arch`), so a site's amd64 and GH200 (arm64) nodes
pull the same name. Each architecture's images are first pushed under a tag of their own (`<tag>-<arch>`, what a
user names to pull one architecture explicitly); the index then names them by digest with their platform
(OCI image spec, image-index.md: `platform.architecture`, `platform.os`, and `variant` `v8` for arm64).

Written with oras-py's registry client (requirements.txt: oras), which the SIF's attestations already use: it sends
the registry's credentials from `docker login` (~/.docker/config.json) and answers the token challenge, as the docker
engine does for the per-architecture pushes.
"""
from __future__ import annotations

import hashlib
import json

import oras.container
import oras.provider
import requests

from .common import UserError

INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
# What the docker engine pushes (schema 2) or an OCI builder does: the per-architecture manifests an index may name.
IMAGE_MANIFEST_TYPES = ("application/vnd.docker.distribution.manifest.v2+json",
                        "application/vnd.oci.image.manifest.v1+json")
VARIANTS = {"arm64": "v8"}  # the variant docker and containerd give linux/arm64 (platforms.Normalize)


def platform(os_name: str, architecture: str) -> dict:
    """An index entry's platform for an image of `os_name`/`architecture` (docker inspect's Os and Architecture)."""
    described = {"architecture": architecture, "os": os_name}
    if architecture in VARIANTS:
        described["variant"] = VARIANTS[architecture]
    return described


def index_document(entries: list[dict]) -> bytes:
    """The index's bytes (what the registry stores and what its digest is of), entries in the order given."""
    if len({json.dumps(entry["platform"], sort_keys=True) for entry in entries}) != len(entries):
        raise UserError("two images of the same platform for one tag: push each architecture once")
    return json.dumps({"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": entries},
                      indent=2).encode()


class IndexWriter:
    """Reads per-architecture manifests and writes indexes over them, in one registry (host[:port][/namespace])."""

    def __init__(self, registry: str, plain_http: bool, use_proxy: bool):
        self.registry = registry
        self.client = oras.provider.Registry(hostname=registry.split("/", 1)[0], insecure=plain_http)
        self.client.session.trust_env = use_proxy

    def _container(self, repository: str, tag: str) -> oras.container.Container:
        """`repository` is registry/name as `make push` names it; oras splits host and name itself."""
        return oras.container.Container(f"{repository}:{tag}")

    def _request(self, method: str, repository: str, tag: str, **kwargs) -> requests.Response:
        container = self._container(repository, tag)
        self.client.auth.load_configs(container)
        url = f"{self.client.prefix}://{container.manifest_url()}"
        try:
            return self.client.do_request(url, method, **kwargs)
        except (requests.RequestException, ValueError) as error:
            raise UserError(f"{method} {repository}:{tag} failed ({error}): check the registry and `docker login`; "
                            "moving tags were not updated") from None

    def entry(self, repository: str, tag: str, described_platform: dict) -> dict:
        """The index entry of the image manifest at repository:tag: its media type, digest and size as stored."""
        answer = self._request("GET", repository, tag, headers={"Accept": ", ".join(IMAGE_MANIFEST_TYPES)})
        if answer.status_code != 200:
            raise UserError(f"{repository}:{tag} has no image manifest (HTTP {answer.status_code}) to name in the "
                            "index: push it first; moving tags were not updated")
        media_type = answer.headers.get("Content-Type", "").split(";")[0].strip()
        if media_type not in IMAGE_MANIFEST_TYPES:
            raise UserError(f"{repository}:{tag} is a {media_type or 'manifest of no type'}, not one image's "
                            "manifest: an index names image manifests only; moving tags were not updated")
        body = answer.content
        return {"mediaType": media_type, "digest": f"sha256:{hashlib.sha256(body).hexdigest()}", "size": len(body),
                "platform": described_platform}

    def put(self, repository: str, tag: str, entries: list[dict]) -> str:
        """Write the index over `entries` as repository:tag; returns its digest."""
        document = index_document(entries)
        answer = self._request("PUT", repository, tag, data=document, headers={"Content-Type": INDEX_MEDIA_TYPE})
        if answer.status_code not in (200, 201):
            raise UserError(f"writing the index {repository}:{tag} failed (HTTP {answer.status_code}: "
                            f"{answer.text.strip()[:200]}); moving tags were not updated")
        digest = f"sha256:{hashlib.sha256(document).hexdigest()}"
        stored = answer.headers.get("Docker-Content-Digest", digest)
        if stored != digest:
            raise UserError(f"the registry stored the index {repository}:{tag} as {stored}, not {digest}: it "
                            "rewrote the document; moving tags were not updated")
        return digest
