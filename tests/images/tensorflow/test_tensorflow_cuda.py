"""The GPU flavour's TensorFlow (issue 6), checked on tensorflow and every image built on it: CUDA, cuDNN and NCCL are
those of TensorFlow's tested build as pinned in versions.toml, no driver library is in the image (`--nv` or the NVIDIA
container runtime brings it), and exactly one libnccl.so.2 exists. This machine has no GPU: nothing here needs one."""
import json
import re

import pytest

from support.stack import CONFIG

pytestmark = pytest.mark.skipif(CONFIG.flavor != "gpu", reason="GPU flavour only (run with FLAVOR=gpu)")

BUILD_INFO = ("import json, tensorflow as tf; i = tf.sysconfig.get_build_info(); "
              "print(json.dumps({'cuda_build': tf.test.is_built_with_cuda(), 'cuda': i.get('cuda_version'), "
              "'cudnn': i.get('cudnn_version'), 'gpus': len(tf.config.list_physical_devices('GPU'))}))")


def test_tensorflow_is_the_cuda_build_of_the_pinned_cuda_and_cudnn(host, image_layer):
    info = json.loads(host.check_output(f'python -c "{BUILD_INFO}" 2>/dev/null').splitlines()[-1])
    assert info["cuda_build"] is True
    assert info["cuda"] == CONFIG.gpu["cuda"], "versions.toml's CUDA must be TensorFlow's tested build"
    assert str(info["cudnn"]).split(".")[0] == CONFIG.gpu["cudnn"].split(".")[0]
    assert info["gpus"] == 0  # no GPU here; on a GPU node the same probe counts them


def test_cuda_library_wheels_are_the_pinned_ones(host, image_layer):
    packages = {re.sub(r"[-_.]+", "-", name).lower(): spec["version"]
                for name, spec in host.pip.get_packages(pip_path="/opt/venv/bin/pip").items()}
    for wheel, version in CONFIG.gpu["wheels"].items():
        assert packages.get(wheel) == version, f"{wheel}: {packages.get(wheel)} installed, {version} pinned"
    assert packages["nvidia-nccl-cu12"] == CONFIG.gpu["nccl"]
    assert packages["nvidia-cudnn-cu12"].startswith(CONFIG.gpu["cudnn"])


def test_no_driver_library_and_no_cuda_stub_in_the_image(root_host, image_layer):
    found = root_host.check_output(
        "find / -xdev \\( -name 'libcuda.so*' -o -name 'libnvidia-*.so*' -o -path '*/stubs/*.so*' \\) -print")
    assert found == "", f"driver libraries belong to the host (--nv / --gpus all), found:\n{found}"


def test_exactly_one_nccl_library(root_host, image_layer):
    found = root_host.check_output("find / -xdev -name 'libnccl.so*' \\( -type f -o -type l \\) -print").split()
    assert len(found) == 1 and found[0].endswith("/nvidia/nccl/lib/libnccl.so.2"), found
