"""No CA bundle, proxy setting or secret in any layer's files, history or configuration.

The proxy CA of the build host (the certificates of the CA bundle used for the build that the image's own
ca-certificates bundle does not contain) must not appear anywhere in `docker save` of the image.
"""
import os
import re
from pathlib import Path

import pytest

PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\s+(.+?)-----END CERTIFICATE-----", re.S)
SECRET_WORDS = ("PIP_CERT", "PIP_INDEX_URL=", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "CA_BUNDLE=",
                "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "BEGIN CERTIFICATE")


def certificate_markers(pem_bytes):
    """One distinctive base64 line (the 4th) of each certificate in a PEM bundle."""
    markers = set()
    for body in PEM.findall(pem_bytes):
        lines = [line.strip() for line in body.splitlines() if line.strip()]
        if len(lines) > 4:
            markers.add(lines[4])
    return markers


def build_ca_bundle():
    for variable in ("CA_BUNDLE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        value = os.environ.get(variable)
        if value and value != "none" and Path(value).is_file():
            return Path(value)
    return None


def scan_saved_image(docker_client, image, markers):
    """Stream `docker save` (every layer's files, the config and the history) and return the markers found."""
    found = set()
    longest = max(len(m) for m in markers)
    tail = b""
    for chunk in docker_client.images.get(image).save(chunk_size=8 << 20):
        window = tail + chunk
        found.update(m for m in markers if m in window)
        tail = window[-longest:]
    return found


def test_history_and_config_hold_no_secret(docker_client, image, image_layer):
    attrs = docker_client.images.get(image).attrs
    environment = "\n".join(attrs["Config"].get("Env") or [])
    history = "\n".join(step.get("CreatedBy", "") for step in docker_client.images.get(image).history())
    for word in SECRET_WORDS:
        assert word not in environment, f"{word} in the image environment"
        assert word not in history, f"{word} in the image history"


def test_build_host_proxy_ca_is_in_no_layer(docker_client, image, image_layer, root_host):
    bundle = build_ca_bundle()
    if bundle is None:
        pytest.skip("no CA bundle was given to the build on this host: nothing to look for")
    # Public CAs that the image ships by itself (Debian's ca-certificates package and certifi bundles) may appear;
    # any other certificate of the build's bundle (the site proxy's CA) must not.
    shipped = root_host.check_output(
        "cat /usr/share/ca-certificates/mozilla/*.crt $(find / -xdev -name cacert.pem 2>/dev/null) 2>/dev/null")
    extra = certificate_markers(bundle.read_bytes()) - certificate_markers(shipped.encode())
    if not extra:
        pytest.skip(f"{bundle} holds only certificates the image ships anyway (no proxy CA on this host)")
    found = scan_saved_image(docker_client, image, extra)
    assert not found, f"{len(found)} certificate(s) of the build CA bundle {bundle} are stored in {image}"
