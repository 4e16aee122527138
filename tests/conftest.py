"""Fixtures every test directory shares. The configuration `make test` selected (STACK/FLAVOR/MPI) lives once, in
support/stack.py, as constants (skip marks and parametrisations need it at import time); `manifest` and `config` only
hand those same objects to the tests that take them as arguments. The docker client is one per session, for every
directory whose tests talk to the engine (images, publish, runtimes)."""
import pytest

from support.stack import CONFIG, MANIFEST


@pytest.fixture(scope="session")
def manifest():
    return MANIFEST


@pytest.fixture(scope="session")
def config():
    return CONFIG


@pytest.fixture(scope="session")
def docker_client():
    # Imported here: the docker SDK is needed only by the tests that use the engine, not to collect or run tests/unit.
    from tfhpc.dockerhost import client
    return client()
