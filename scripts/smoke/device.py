"""Device choice and bandwidth arithmetic shared by the smoke tests.

No TensorFlow import here: the host's unit tests import this module directly (tests/unit/test_smoke_device.py).
"""


class DeviceError(Exception):
    """A device request that cannot be met; the message names the fix."""


def choose_device(requested, gpus_visible, built_with_cuda):
    """('gpu' | 'cpu', note or None) for --device auto|cpu|gpu.

    auto takes the GPU path only when TensorFlow was built with CUDA and sees a GPU; otherwise it says so in one
    line and takes the CPU path, so that the same command runs on a laptop, a CPU node and a GPU node.
    """
    if requested not in ("auto", "cpu", "gpu"):
        raise DeviceError(f"unknown --device '{requested}': use auto, cpu or gpu")
    if requested == "cpu":
        return "cpu", None
    if not built_with_cuda:
        if requested == "gpu":
            raise DeviceError("--device gpu, but this TensorFlow has no CUDA build: use the image's gpu flavour "
                              "or --device cpu")
        return "cpu", "CPU image (TensorFlow without CUDA): running the CPU path"
    if gpus_visible == 0:
        if requested == "gpu":
            raise DeviceError("--device gpu, but no GPU is visible: add --nv (apptainer/singularity) or --gpus all "
                              "(docker), check CUDA_VISIBLE_DEVICES, or use --device cpu")
        return "cpu", "no GPU visible: running the CPU path (add --nv or --gpus all on a GPU node)"
    return "gpu", None


def parse_bytes(text):
    """'64M' -> 67108864; suffixes K, M, G are powers of 1024 (nccl-tests' -b/-e)."""
    text = text.strip().upper()
    factor = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in "KMG" else text
    try:
        value = int(number) * factor
    except ValueError:
        raise DeviceError(f"size '{text}' is not a byte count: write e.g. 4096, 64K, 16M or 1G") from None
    if value <= 0:
        raise DeviceError(f"size '{text}' must be positive")
    return value


def algorithm_bandwidth(size_bytes, seconds):
    """Bytes per second of one allreduce of size_bytes taking seconds (nccl-tests' algbw)."""
    if seconds <= 0:
        raise ValueError("seconds must be positive")
    return size_bytes / seconds


def bus_bandwidth(size_bytes, seconds, ranks):
    """nccl-tests' bus bandwidth of an allreduce: algbw * 2(N-1)/N, comparable across rank counts and with the
    hardware's link bandwidth (each rank sends and receives 2(N-1)/N of the data in a ring)."""
    if ranks < 1:
        raise ValueError("ranks must be at least 1")
    return algorithm_bandwidth(size_bytes, seconds) * 2 * (ranks - 1) / ranks
