"""The smoke tests' device choice and bandwidth arithmetic (tfhpc_runtime.gpu and .metrics, which
scripts/smoke/ uses), on the host: the GPU path's logic is tested here up to the point where a GPU would be touched."""
import pytest

from tfhpc_runtime.errors import UsageError
from tfhpc_runtime.gpu import DeviceError, choose_device
from tfhpc_runtime.metrics import algorithm_bandwidth, bus_bandwidth, parse_bytes


def test_bus_bandwidth_is_nccl_tests_definition():
    # 256 MiB in 0.1 s on 8 ranks: algbw 2.684 GB/s, busbw = algbw * 2 * 7 / 8
    assert algorithm_bandwidth(256 << 20, 0.1) == pytest.approx(2.68435456e9)
    assert bus_bandwidth(256 << 20, 0.1, 8) == pytest.approx(2.68435456e9 * 1.75)
    assert bus_bandwidth(1 << 20, 1.0, 2) == algorithm_bandwidth(1 << 20, 1.0)  # N=2: factor 1
    assert bus_bandwidth(1 << 20, 1.0, 1) == 0.0  # one rank moves nothing over the bus
    with pytest.raises(ValueError):
        bus_bandwidth(1, 0.0, 2)


@pytest.mark.parametrize("text, value", [("4096", 4096), ("64K", 65536), ("16m", 16 << 20), ("1G", 1 << 30)])
def test_sizes_parse_like_nccl_tests(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "M", "12x", "-1K", "0"])
def test_bad_sizes_are_refused_with_the_form_to_use(text):
    with pytest.raises(UsageError):
        parse_bytes(text)


@pytest.mark.parametrize("requested, gpus, cuda, device, note", [
    ("auto", 2, True, "gpu", None),
    ("auto", 0, True, "cpu", "no GPU visible"),
    ("auto", 0, False, "cpu", "CPU image"),
    ("auto", 4, False, "cpu", "CPU image"),     # a CPU image on a GPU node still runs
    ("cpu", 4, True, "cpu", None),
    ("gpu", 1, True, "gpu", None),
])
def test_device_choice(requested, gpus, cuda, device, note):
    chosen, said = choose_device(requested, gpus, cuda)
    assert chosen == device
    assert (said is None) if note is None else (note in said and "\n" not in said)


@pytest.mark.parametrize("gpus, cuda, fix", [(0, True, "--nv"), (2, False, "gpu flavour")])
def test_gpu_requested_but_impossible_names_the_fix(gpus, cuda, fix):
    with pytest.raises(DeviceError, match=fix):
        choose_device("gpu", gpus, cuda)
