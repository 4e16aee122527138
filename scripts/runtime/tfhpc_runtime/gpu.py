"""Which device a rank computes on and which GPU it takes: the one place where the training entrypoints, the smoke
tests and the MWMS cluster plan decide it. Also what the doctor reads about GPUs (driver, compute capability, NCCL).

Nothing here imports TensorFlow: functions that need it take the module as `tf`, and the host's unit tests call the
choice logic without it (tests/unit/test_smoke_device.py, tests/unit/test_train_gpu_choice.py).
"""
import ctypes
import os
import shutil
import subprocess

from .errors import UsageError, fail


class DeviceError(UsageError):
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


def gpu_for_rank(local_rank, local_size, visible):
    """Index of the GPU this rank uses among the `visible` ones, or None with no GPU.

    One GPU visible: it is this rank's (srun --gpus-per-task=1 or a per-task CUDA_VISIBLE_DEVICES hands each task
    its own GPU as device 0). At least as many GPUs as ranks on the node: the rank's local index. Fewer GPUs than
    ranks but more than one: a launch error (DeviceError), rather than an IndexError or two ranks silently sharing a
    GPU."""
    if visible == 0:
        return None
    if visible == 1:
        return 0
    if visible >= local_size:
        return local_rank
    raise DeviceError(f"{local_size} ranks on this node but {visible} GPUs visible: start one rank per GPU "
                      f"(srun --ntasks-per-node={visible} --gpus-per-task=1, or horovodrun -np/-H with {visible} "
                      f"slots per node)")


def select_gpu(tf, local_rank, local_size, memory_growth=True):
    """Horovod: one GPU per rank, chosen by gpu_for_rank() and made the only one TensorFlow sees; with
    memory_growth its memory grows on demand (as the Lablup course sets it), so that a second process on the GPU
    (the doctor, a profiler) still fits. Returns the GPU's index among the visible ones, or None on a CPU node;
    raises DeviceError. Call it before TensorFlow's runtime starts."""
    gpus = tf.config.list_physical_devices("GPU")
    index = gpu_for_rank(local_rank, local_size, len(gpus))
    if index is not None:
        tf.config.set_visible_devices(gpus[index], "GPU")
        if memory_growth:
            tf.config.experimental.set_memory_growth(gpus[index], True)
    return index


def pin_gpu(tf, local_rank, local_size):
    """select_gpu() for the training entrypoints: a launch that cannot give each rank its GPU stops in one line."""
    try:
        return select_gpu(tf, local_rank, local_size)
    except DeviceError as error:
        fail(str(error))


def detect_gpus_per_node():
    """GPUs on this node, without TensorFlow: SLURM_GPUS_ON_NODE, else CUDA_VISIBLE_DEVICES, else nvidia-smi."""
    for name in ("SLURM_GPUS_ON_NODE",):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() not in ("", "-1")])
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True, timeout=30).stdout
            return sum(line.startswith("GPU ") for line in out.splitlines())
        except (OSError, subprocess.SubprocessError):
            return 0
    return 0


def driver_cuda_version():
    """(CUDA version the driver supports as 'major.minor', library path) or (None, None) without libcuda."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        version = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
            return f"{version.value // 1000}.{version.value % 1000 // 10}", name
        return "unknown", name
    return None, None


def nccl_version(code):
    """hvd.nccl_built() gives NCCL's version code: major*10000 + minor*100 + patch since NCCL 2.9 (21903 = 2.19.3),
    major*1000 + minor*100 + patch before."""
    if not code:
        return "none"
    code = int(code)
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def device_compute_capabilities(run=subprocess.run):
    """[(name, 'major.minor')] of the visible GPUs from nvidia-smi (driver >= 510 knows compute_cap), else []."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"], capture_output=True,
                  text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.splitlines():
        name, _, capability = line.rpartition(",")
        if name.strip() and capability.strip().replace(".", "", 1).isdigit():
            found.append((name.strip(), capability.strip()))
    return found


def capability_support(capability, built):
    """Whether kernels built for `built` (TensorFlow's cuda_compute_capabilities, e.g. ['sm_80', 'compute_90']) run
    on a GPU of compute capability 'major.minor': (True, how) or (False, why). A cubin runs on its major's later
    minors; PTX is compiled by the driver for any later GPU (at start-up, and cached)."""
    major, minor = (int(part) for part in capability.split("."))
    kernels = [(kind, int(number)) for kind, _, number in (entry.partition("_") for entry in built or ())
               if kind in ("sm", "compute") and number.isdigit()]
    cubins = sorted(n for kind, n in kernels if kind == "sm" and n // 10 == major and n % 10 <= minor)
    if cubins:
        return True, f"kernels for sm_{cubins[-1]}"
    ptx = sorted(n for kind, n in kernels if kind == "compute" and n <= major * 10 + minor)
    if ptx:
        return True, f"PTX for compute_{ptx[-1]}, compiled by the driver on first use"
    listed = ", ".join(f"{kind}_{n}" for kind, n in kernels) or "none"
    return False, f"TensorFlow's kernels ({listed}) do not run on compute capability {capability}"
