"""Shared fixtures: the manifest and the stack configuration selected by STACK/FLAVOR/MPI (as `make test` exports)."""
import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from tfhpc.manifest import Manifest  # noqa: E402


@pytest.fixture(scope="session")
def manifest():
    return Manifest()


@pytest.fixture(scope="session")
def config(manifest):
    return manifest.config(os.environ.get("STACK") or None, os.environ.get("FLAVOR") or None,
                           os.environ.get("MPI") or None)
