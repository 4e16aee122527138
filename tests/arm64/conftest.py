"""`make test-arm64`: the checks of another architecture's images (ARCH=arm64), run where they were built, under
emulation (docs/arm64.md). Not part of `make test`: every program in these containers runs through qemu, many times
slower than natively, so the suite is a focused one, not the image suite of tests/images.

`make test-arm64` builds both architectures' images and SIFs first (test_arm64_publish.py pushes both under one
tag). Run directly (pytest tests/arm64), each image test names the lowest layer it needs and runs on the highest
layer of the stack that is built, so that a stack built only up to tensorflow is still tested as far as it goes;
what needs a missing layer is skipped, saying which. A container per module, always removed.
"""
import docker.errors
import pytest

from support.containers import SCRIPTS, running, testinfra_host
from support.markers import mark_directory
from support.registry import registry  # noqa: F401 (fixture: test_arm64_publish.py)
from support.sif import apptainer_container, in_sif, sif, user_host  # noqa: F401 (fixtures: test_arm64_sif.py)
from support.stack import CONFIG, MANIFEST


def pytest_collection_modifyitems(items):
    mark_directory(items, __file__, pytest.mark.image)
    if not CONFIG.arch_suffix:
        mark_directory(items, __file__, pytest.mark.skip(reason=f"ARCH={CONFIG.arch} is the default architecture: "
                                                                "`make test-arm64` runs these"))


def built_layers(docker_client):
    """The stack's layers whose images exist, in build order."""
    built = []
    for layer in MANIFEST.layers.names:
        try:
            docker_client.images.get(CONFIG.image(layer))
        except docker.errors.ImageNotFound:
            continue
        built.append(layer)
    return built


@pytest.fixture(scope="session")
def top_layer(docker_client):
    """The highest built layer of the stack, the one every check runs on."""
    built = built_layers(docker_client)
    if not built:
        pytest.fail(f"no image of {CONFIG.tag} is built: run `make image ARCH={CONFIG.arch}` first")
    return built[-1]


@pytest.fixture(scope="session")
def needs(top_layer):
    """needs(layer): skip unless `layer` is the top layer or below it (the top image then holds what it installs)."""
    def check(layer):
        if layer not in MANIFEST.layers.chain(top_layer):
            pytest.skip(f"needs the {layer} layer, and {CONFIG.image(layer)} is not built (top: {top_layer})")
    return check


@pytest.fixture(scope="session")
def scripts():
    """Where the container has the repository's scripts/ (the app layer's copy, or the checkout's, mounted)."""
    return SCRIPTS


@pytest.fixture(scope="module")
def container(docker_client, top_layer):
    with running(docker_client, CONFIG.image(top_layer)) as started:
        yield started


@pytest.fixture(scope="module")
def host(container):
    return testinfra_host(container)
