"""A wheel on the package index, read without downloading it whole (tests/network): the file chosen from the
index's JSON listing (PEP 691, PyPI's simple API, or PIP_INDEX_URL's mirror) by the sha256 a lock holds, then one
member read from the URL the index lists with HTTP range requests (remotezip: the zip's central directory, then that
member, whose CRC-32 zipfile checks). The index's sha256 of the file is compared with the lock's, since the whole
file is never hashed here. TLS: the host's CA bundle, found as tfhpc finds it for the builds (CA_BUNDLE, PIP_CERT,
REQUESTS_CA_BUNDLE, SSL_CERT_FILE); proxies from the environment (requests)."""
import ast
import os
import re
from urllib.parse import urljoin

import requests
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from remotezip import RemoteZip, RemoteZipError

from tfhpc.common import default_ca_bundle, resolve_ca_bundle

DEFAULT_INDEX = "https://pypi.org/simple"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
TIMEOUT = 120
# What reading the index or a file from it raises when the network, the index or its server's ranges fail.
UNREACHABLE = (requests.RequestException, RemoteZipError)


def index_url() -> str:
    """The index `make lock` resolves from: PIP_INDEX_URL, else PyPI's."""
    return (os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX).rstrip("/")


def tls_verify() -> str | bool:
    """requests' `verify`: the host's CA bundle (a TLS-intercepting proxy's), else the default trust store."""
    bundle = resolve_ca_bundle(default_ca_bundle())
    return str(bundle) if bundle else True


def index_files(project: str) -> tuple[str, list[dict]]:
    """(the project's page, its files as the index's PEP 691 JSON lists them, each `url` made absolute)."""
    page = f"{index_url()}/{canonicalize_name(project)}/"
    response = requests.get(page, headers={"Accept": SIMPLE_JSON}, verify=tls_verify(), timeout=TIMEOUT)
    response.raise_for_status()
    if not response.headers.get("Content-Type", "").startswith(SIMPLE_JSON):
        raise requests.RequestException(f"{page} answered {response.headers.get('Content-Type')!r}, not PEP 691's "
                                        f"{SIMPLE_JSON}: use an index that serves it (PyPI does)")
    return page, [{**entry, "url": urljoin(page, entry["url"])} for entry in response.json()["files"]]


def python_tag(python: str) -> str:
    """'3.99' -> 'cp399': the CPython tag of a wheel for that Python."""
    return "cp" + python.replace(".", "")


def matching_wheels(files: list[dict], project: str, version: str, python: str, machine: str,
                    hashes: list[str]) -> list[dict]:
    """The files of `files` that are manylinux wheels of project==version for CPython `python` on `machine` (uname -m)
    and whose sha256 is one of `hashes` (a lock's)."""
    found = []
    for entry in files:
        try:
            name, wheel_version, _, tags = parse_wheel_filename(entry["filename"])
        except InvalidWheelFilename:
            continue  # an sdist
        if name != canonicalize_name(project) or str(wheel_version) != version:
            continue
        if not any(tag.interpreter == python_tag(python) and re.fullmatch(rf"manylinux\w*_{machine}", tag.platform)
                   for tag in tags):
            continue
        if entry.get("hashes", {}).get("sha256") in hashes:
            found.append(entry)
    return found


def read_member(url: str, member: str) -> bytes:
    """One member of the zip (a wheel) at `url`, by range requests."""
    with RemoteZip(url, verify=tls_verify(), timeout=TIMEOUT) as archive:
        return archive.read(member)


def build_info(source: str) -> dict:
    """The `build_info` mapping of TensorFlow's tensorflow/python/platform/build_info.py, read with `ast` (never run):
    `build_info = collections.OrderedDict([(key, value), ...])` or a dict literal."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", "") == "build_info" for target in node.targets):
            value = node.value
            if isinstance(value, ast.Call) and value.args:
                return dict(ast.literal_eval(value.args[0]))
            return dict(ast.literal_eval(value))
    raise ValueError("no `build_info = ...` assignment")
