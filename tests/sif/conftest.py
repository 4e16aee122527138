"""SIF tests: the app image's SIF, used the way HPC users do (the fixtures: tests/support/sif.py)."""
import pytest

from support.markers import mark_directory
from support.sif import apptainer_container, in_sif, sif, user_host  # noqa: F401 (fixtures)


def pytest_collection_modifyitems(items):
    mark_directory(items, __file__, pytest.mark.sif)
