"""Image tests, inherited down the stack: the tests in tests/images/<layer>/ run on that layer's image and on every
image built on top of it (containers/layers.toml), so what holds for `mpi` is checked on tensorflow, horovod and app.

Each test module gets one container per image (started with the docker SDK, always removed) and a testinfra host on
it. Images below the app layer get the repository's scripts/ mounted read-only where the app layer ships them.
"""
import shlex
from pathlib import Path

import pytest


from support.containers import SCRIPTS, running, start_container, testinfra_host  # noqa: F401 (re-exported)
from support.failures import excerpt
from support.markers import mark_directory
from support.results import results
from support.stack import CONFIG, MANIFEST



def pytest_collection_modifyitems(items):
    mark_directory(items, __file__, pytest.mark.image)


def pytest_generate_tests(metafunc):
    """Each module of tests/images/<layer> on every image built on <layer>; the test tier keeps the leaf's
    (support/tiers.py)."""
    if "image_layer" in metafunc.fixturenames:
        layer = Path(metafunc.definition.fspath).parent.name  # tests/images/<layer>/test_*.py
        metafunc.parametrize("image_layer", MANIFEST.layers.descendants(layer), scope="module")


@pytest.fixture(scope="module")
def image(image_layer, docker_client):
    import docker.errors
    name = CONFIG.image(image_layer)
    try:
        docker_client.images.get(name)
    except docker.errors.ImageNotFound:
        pytest.fail(f"{name} is not built: run `make image` first")
    return name


@pytest.fixture(scope="module")
def container(docker_client, image):
    with running(docker_client, image) as started:
        yield started


@pytest.fixture(scope="module")
def host(container):
    return testinfra_host(container)


@pytest.fixture(scope="module")
def root_host(container):
    """The same container, as root: for looking at files the runtime user cannot read."""
    return testinfra_host(container, "root")


def undecided_single_copy(image_layer):
    """What a multi-rank command on `image_layer` needs in front: the app image decides single-copy transfers (CMA)
    at run time (tfhpc_runtime/singlecopy.py); the layers below it leave Open MPI's safe parameter file
    (containers/mpi/Dockerfile) but MPICH's default, CMA, which Docker's seccomp profile refuses
    ("process_vm_readv failed (errno 1)" in PyPI MPICH 5's first large allreduce). There the command gets the
    setting the app image's decision gives in Docker."""
    if image_layer in MANIFEST.layers.descendants("app") or CONFIG.mpi == "openmpi":
        return ""
    return "env MPIR_CVAR_CH4_CMA_ENABLE=0 "


def run_ranks(host, command, ranks=2, output_dir=None):
    """Run a multi-rank command; return the parsed RESULT lines, one per rank, sorted by rank.

    output_dir: the launcher writes each rank's stdout to its own file under it (`horovodrun/mpirun
    --output-filename DIR`), read from there: a launcher that forwards the ranks' output through one stream can
    split a long line of one rank around another rank's line."""
    result = host.run(command)
    assert result.rc == 0, f"{command} exited {result.rc}:\n{excerpt(result.stdout, result.stderr)}"
    stdout = result.stdout
    if output_dir:
        stdout = host.run(f"find {shlex.quote(output_dir)} -name stdout -path '*rank.*' -exec cat {{}} +").stdout
    return results(stdout, ranks)


def script(relative_path):
    return shlex.quote(f"{SCRIPTS}/{relative_path}")
