"""A real registry for the tests (Debian's docker-registry, the CNCF distribution server, in a container built by
tests/publish/registry.Dockerfile) on the host's 127.0.0.1 at a free port, removed at the end of the session: the
`registry` fixture of tests/publish and tests/arm64."""
import socket
import time
from dataclasses import dataclass

import pytest
import requests

from support.stack import CONFIG, MANIFEST, REPO_ROOT
from tfhpc.common import default_ca_bundle, resolve_ca_bundle
from tfhpc.emulation import host_config
from tfhpc.imagebuild import build_image

DOCKERFILE = REPO_ROOT / "tests" / "publish" / "registry.Dockerfile"
MANIFEST_TYPES = ", ".join(["application/vnd.docker.distribution.manifest.v2+json",
                            "application/vnd.oci.image.manifest.v1+json",
                            "application/vnd.docker.distribution.manifest.list.v2+json",
                            "application/vnd.oci.image.index.v1+json"])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Registry:
    address: str
    container: object  # the docker SDK container running it

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


def registry_image() -> str:
    """The registry's image, on the stack's base image (apt-install and the CA bundle secret as the layers use) of this
    host's architecture: it runs natively whatever ARCH the tests check."""
    config = host_config(MANIFEST, CONFIG)
    version = config.os.get("docker_registry_package_version")
    if not version:
        pytest.fail(f"versions.toml: [os.{config.os_release}] has no docker_registry_package_version, which the "
                    "publishing tests need: add Debian's docker-registry version")
    return build_image(config, DOCKERFILE, f"tfhpc-test-registry:{version.replace('+', '_')}", config.image("base"),
                       resolve_ca_bundle(default_ca_bundle()),
                       extra_args={"DOCKER_REGISTRY_PACKAGE_VERSION": version})


@pytest.fixture(scope="session")
def registry(tmp_path_factory, docker_client):
    image = registry_image()
    root = tmp_path_factory.mktemp("registry")
    root.chmod(0o755)
    address = f"127.0.0.1:{free_port()}"
    config = root / "config.yml"
    config.write_text(f"""version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: /tmp/registry
http:
  addr: {address}
""")
    config.chmod(0o644)
    container = docker_client.containers.run(
        image, ["/etc/tfhpc-registry/config.yml"], detach=True, network_mode="host",
        volumes={str(root): {"bind": "/etc/tfhpc-registry", "mode": "ro"}},
        labels={"io.tfhpc.test-registry": address})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"http://{address}/v2/", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            container.reload()
            if container.status == "exited" or time.monotonic() > deadline:
                logs = container.logs().decode(errors="replace")[-2000:]
                pytest.fail(f"the registry container did not start at {address}:\n{logs}")
            time.sleep(0.2)
        yield Registry(address, container)
    finally:
        container.remove(force=True)
