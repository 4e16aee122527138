"""Publishing tests: a real registry (Debian's docker-registry, the CNCF distribution server) started on 127.0.0.1 at a
free port with its storage in a temporary directory, always stopped at the end of the session."""
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from tfhpc.manifest import Manifest  # noqa: E402

MANIFEST = Manifest()
CONFIG = MANIFEST.config(os.environ.get("STACK") or None, os.environ.get("FLAVOR") or None,
                         os.environ.get("MPI") or None)
MANIFEST_TYPES = ", ".join(["application/vnd.docker.distribution.manifest.v2+json",
                            "application/vnd.oci.image.manifest.v1+json",
                            "application/vnd.docker.distribution.manifest.list.v2+json",
                            "application/vnd.oci.image.index.v1+json"])


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.image)
            item.add_marker(pytest.mark.sif)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Registry:
    address: str
    log: Path

    def get(self, path, **kwargs):
        return requests.get(f"http://{self.address}/v2/{path}", timeout=30, **kwargs)

    def catalog(self) -> set:
        return set(self.get("_catalog").json().get("repositories") or [])

    def tags(self, repository) -> set:
        answer = self.get(f"{repository}/tags/list")
        return set(answer.json().get("tags") or []) if answer.status_code == 200 else set()

    def digest(self, repository, tag) -> str:
        answer = requests.head(f"http://{self.address}/v2/{repository}/manifests/{tag}",
                               headers={"Accept": MANIFEST_TYPES}, timeout=30)
        assert answer.status_code == 200, f"{repository}:{tag}: HTTP {answer.status_code}"
        return answer.headers["Docker-Content-Digest"]


@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    binary = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    if not os.access(binary, os.X_OK):
        pytest.fail("docker-registry not found: apt-get install docker-registry (.ci/run installs it)")
    root = tmp_path_factory.mktemp("registry")
    address = f"127.0.0.1:{free_port()}"
    config = root / "config.yml"
    config.write_text(f"""version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root / "data"}
http:
  addr: {address}
""")
    log = root / "registry.log"
    with log.open("w") as handle:
        process = subprocess.Popen([binary, "serve", str(config)], stdout=handle, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"http://{address}/v2/", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"docker-registry did not start at {address}:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield Registry(address, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def docker_client():
    from tfhpc.dockerhost import client
    return client()


@pytest.fixture(scope="session")
def keys(tmp_path_factory):
    """Two throwaway RSA key pairs: the site's signing key and another one."""
    root = tmp_path_factory.mktemp("keys")
    for name in ("site", "other"):
        subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                        "-out", str(root / f"{name}.pem")], check=True, capture_output=True)
        subprocess.run(["openssl", "pkey", "-in", str(root / f"{name}.pem"), "-pubout",
                        "-out", str(root / f"{name}.pub")], check=True, capture_output=True)
    return root
