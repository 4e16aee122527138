"""Pure helpers of the doctor (scripts/doctor.py), on the host: no TensorFlow or Horovod is imported by the module."""
import sys

import pytest

from tfhpc import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import doctor  # noqa: E402


@pytest.mark.parametrize("code, version", [(21903, "2.19.3"), (20907, "2.9.7"), (2708, "2.7.8"), (0, "none"),
                                           (None, "none")])
def test_nccl_version_code_is_printed_as_nccl_does(code, version):
    assert doctor.nccl_version(code) == version
