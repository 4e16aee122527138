"""Build mechanics on a real engine: a failed layer build (a hash mismatch against a lock among the causes) leaves the
previous image and tag untouched, and a CA bundle given to the build reaches the RUN steps that need it but no layer,
history entry or configuration."""
import uuid

import pytest

from support.stack import CONFIG
from tfhpc import UserError
from tfhpc.imagebuild import build_image
from tfhpc.common import default_ca_bundle, resolve_ca_bundle, sha256_file
from tfhpc.lock import lock_dir, locked_packages

SCRATCH_IMAGE = "tfhpc-test-scratch:build-safety"


@pytest.fixture
def base_image(docker_client):
    import docker.errors
    try:
        return docker_client.images.get(CONFIG.image("base"))
    except docker.errors.ImageNotFound:
        pytest.fail(f"{CONFIG.image('base')} is not built: run `make image` first")


def test_failed_build_keeps_the_previous_image(tmp_path, docker_client, base_image):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo half-way > /tmp/marker && exit 3\n")
    before = docker_client.images.get(CONFIG.image("base")).id
    with pytest.raises(UserError, match=f"building {CONFIG.image('base')} from .* failed .* was left as it was"):
        build_image(CONFIG, dockerfile, CONFIG.image("base"), CONFIG.image("base"), None)
    assert docker_client.images.get(CONFIG.image("base")).id == before


def test_ca_bundle_reaches_the_build_but_no_layer(tmp_path, docker_client, base_image):
    marker = uuid.uuid4().hex.upper()
    bundle = tmp_path / "proxy-ca.pem"
    bundle.write_text(f"-----BEGIN CERTIFICATE-----\nTFHPCTEST{marker}\n-----END CERTIFICATE-----\n")
    index_marker = f"https://user:{marker.lower()}@mirror.invalid/simple"
    index_file = tmp_path / "index"
    index_file.write_text(index_marker)
    dockerfile = tmp_path / "Dockerfile"
    # The RUN proves that both secrets were mounted, byte for byte (it fails otherwise), through the helpers the
    # layers use, while naming only their checksums (which reveal nothing).
    dockerfile.write_text(
        "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nUSER root\n"
        "RUN --mount=type=secret,id=ca_bundle --mount=type=secret,id=pip_index_url "
        f"echo '{sha256_file(bundle)}  /run/secrets/ca_bundle' | sha256sum -c - "
        f"&& echo '{sha256_file(index_file)}  /run/secrets/pip_index_url' | sha256sum -c - "
        "&& build-pip --version > /tmp/pip-version\n")
    try:
        build_image(CONFIG, dockerfile, SCRATCH_IMAGE, CONFIG.image("base"), bundle, index_marker)
        image = docker_client.images.get(SCRATCH_IMAGE)
        saved = b"".join(image.save(chunk_size=8 << 20))
        assert marker.encode() not in saved and marker.lower().encode() not in saved
        history = "\n".join(step.get("CreatedBy", "") for step in image.history())
        assert "mirror.invalid" not in history and marker not in history
    finally:
        try:
            docker_client.images.remove(SCRATCH_IMAGE, force=True)
        except Exception:
            pass


def test_hash_mismatch_fails_the_build_and_keeps_the_tag(tmp_path, docker_client, base_image, capfd):
    """A locked package whose file does not match the lock's hash stops the build (pip --require-hashes, as the
    layers install), and the tag stays on the previous image."""
    entry = next(r for r in locked_packages(lock_dir(CONFIG) / "tensorflow.txt") if r.startswith("six=="))
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nUSER root\n"
        "RUN --mount=type=secret,id=ca_bundle --mount=type=secret,id=pip_index_url "
        f"echo '{entry} --hash=sha256:{'0' * 64}' > /tmp/lock.txt "
        "&& build-pip install --require-hashes --no-deps -r /tmp/lock.txt\n")
    before = docker_client.images.get(CONFIG.image("base")).id
    with pytest.raises(UserError, match="was left as it was"):
        build_image(CONFIG, dockerfile, CONFIG.image("base"), CONFIG.image("base"),
                    resolve_ca_bundle(default_ca_bundle()))
    assert docker_client.images.get(CONFIG.image("base")).id == before
    output = capfd.readouterr()
    assert "DO NOT MATCH THE HASHES" in output.out + output.err
