"""Publishing tests: a real registry on 127.0.0.1 (tests/support/registry.py) and a site's signing keys."""
import subprocess

import pytest

from support.markers import mark_directory
from support.registry import registry  # noqa: F401 (the fixture)


def pytest_collection_modifyitems(items):
    mark_directory(items, __file__, pytest.mark.image, pytest.mark.sif)


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
