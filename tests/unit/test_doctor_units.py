"""Pure helpers of the doctor (scripts/doctor.py, helpers from tfhpc_runtime), on the host: the doctor imports no
TensorFlow or Horovod (it probes them in a child process)."""
import importlib.util
import sys

import pytest

from tfhpc import REPO_ROOT
from tfhpc_runtime import gpu


@pytest.mark.parametrize("code, version", [(21903, "2.19.3"), (20907, "2.9.7"), (2708, "2.7.8"), (0, "none"),
                                           (None, "none")])
def test_nccl_version_code_is_printed_as_nccl_does(code, version):
    assert gpu.nccl_version(code) == version


def test_the_doctor_loads_without_a_framework_and_uses_the_package():
    spec = importlib.util.spec_from_file_location("doctor_under_test", REPO_ROOT / "scripts" / "doctor.py")
    doctor = importlib.util.module_from_spec(spec)
    before = set(sys.modules)
    spec.loader.exec_module(doctor)
    assert doctor.nccl_version is gpu.nccl_version
    assert not {"tensorflow", "horovod", "numpy"} & {name.split(".")[0] for name in set(sys.modules) - before}
