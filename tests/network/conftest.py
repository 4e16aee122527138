"""Tests that read PyPI, or PIP_INDEX_URL's mirror, from the host: no docker, no image. Each is marked `network`
(pytest.ini); without the index it fails, naming the index and the error, and is never skipped: `make test` needs
PyPI for its builds anyway, and a check that watches upstream must not pass by not looking. `make test-network` runs
them alone."""
import pytest

from support.markers import mark_directory


def pytest_collection_modifyitems(items):
    mark_directory(items, __file__, pytest.mark.network)
