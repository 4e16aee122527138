"""Single-copy transfers between the ranks of one node (Linux CMA: one rank reads another's memory with
process_vm_readv), decided at run time: Docker's and Podman's default seccomp profiles forbid process_vm_readv
without CAP_SYS_PTRACE, Apptainer, Charliecloud and bare metal allow it.

An MPI that uses CMA and meets the refusal aborts or fails in its first large intra-node transfer (measured: PyPI's
MPICH 5 under Docker, `MPIDI_CMA_copy_data: process_vm_readv failed (errno 1)` in Horovod's first 16 KB allreduce;
Open MPI 4's vader, "Read -1, expected ..., errno = 1", https://github.com/open-mpi/ompi/issues/4948). Where CMA is
allowed it doubles a large intra-node allreduce (measured in the SIF: 0.46 GB/s without, 0.95 GB/s with).
Two checks, in order:
1. Ranks started from outside the container, one container each (`mpiexec ... apptainer exec`, `srun ... apptainer
   exec` with unprivileged Apptainer): each rank has its own user namespace and none may read another's memory
   (measured: the same abort from the SIF under the host's hydra). Seen as the nearest launcher ancestor (hydra's
   proxy, orted, prted, slurmstepd, ...) living in another user namespace, or one this process cannot inspect.
   Apptainer's --sharens puts such ranks in one namespace; TFHPC_SINGLE_COPY=cma then keeps CMA on.
2. The probe: two forked processes, one reading the other's memory, as sibling ranks do (the reader is not the
   target's parent, so Yama's ptrace_scope=1 applies as between ranks).
The decision, unless the caller set the variable concerned:
- allowed: Open MPI 4's vader uses CMA (btl_vader_single_copy_mechanism=cma; the image's Open MPI parameter file
  says `none`, the safe choice for a process nobody decided for); MPICH and Open MPI 5 (smsc) use it by default.
- refused: MPICH's CMA path off (MPIR_CVAR_CH4_CMA_ENABLE=0), Open MPI 4 copies through shared memory (`none`),
  Open MPI 5 leaves out its cma single-copy component (smsc=^cma).
Applied by the entrypoint before any command (tfhpc-entrypoint), and at the start of every Python process of an MPI
rank that nobody decided for (at_rank_start, from a .pth file of the app image: `docker exec ... mpirun`, `apptainer
exec ... python`). The result is kept in TFHPC_SINGLE_COPY for the doctor and for the processes the command starts,
which then do not probe again.
"""
import os
import signal

DECIDED_VARIABLE = "TFHPC_SINGLE_COPY"   # "cma" or "none: <why>"
MPICH_CMA_VARIABLE = "MPIR_CVAR_CH4_CMA_ENABLE"
OPEN_MPI_4_VARIABLE = "OMPI_MCA_btl_vader_single_copy_mechanism"
OPEN_MPI_5_VARIABLE = "OMPI_MCA_smsc"
# Set in every rank by the launchers the images meet (Open MPI, PMIx, MPICH's hydra and PMI-2, Slurm): the process
# is an MPI rank, or a launcher whose ranks inherit its environment.
RANK_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_FD", "PMI_SIZE", "SLURM_STEP_ID")
# Process names (comm) of launchers; PyPI's Open MPI wheels run theirs as orterun_wrapper / ompirun_wrapper.
LAUNCHERS = {"hydra_pmi_proxy", "hydra_bstrap_proxy", "mpiexec", "mpiexec.hydra", "mpirun", "orterun", "orted",
             "orterun_wrapper", "ompirun_wrapper", "prterun", "prted", "slurmstepd", "srun"}


def _status_field(proc, pid, field):
    with open(f"{proc}/{pid}/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
    return ""


def launcher_outside(proc="/proc", pid=None):
    """The name of the nearest launcher ancestor when it runs in another user namespace than this process (or in one
    that cannot be inspected from here), else None."""
    try:
        own = os.readlink(f"{proc}/self/ns/user")
        pid = pid or os.getppid()
        for _ in range(64):
            if pid <= 1:
                return None
            with open(f"{proc}/{pid}/comm") as handle:
                name = handle.read().strip()
            if name in LAUNCHERS:
                try:
                    return None if os.readlink(f"{proc}/{pid}/ns/user") == own else name
                except OSError:
                    return name
            pid = int(_status_field(proc, pid, "PPid") or 0)
    except (OSError, ValueError):
        return None
    return None


def cma_probe():
    """None when one process can read a sibling's memory with process_vm_readv, else why not (a short text)."""
    import ctypes  # here, not at the top: at_rank_start imports this module in every rank's Python

    class _IOVec(ctypes.Structure):
        _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]

    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "process_vm_readv"):
        return "no process_vm_readv in the C library"
    source = ctypes.create_string_buffer(b"tfhpc-cma-probe", 16)
    ready_read, ready_write = os.pipe()
    target = os.fork()
    if target == 0:  # the target: keeps its memory mapped until the reader is done
        os.close(ready_read)
        os.write(ready_write, b"x")
        try:
            signal.pause()   # until the parent kills it
        finally:
            os._exit(0)
    os.close(ready_write)
    os.read(ready_read, 1)
    os.close(ready_read)
    result_read, result_write = os.pipe()
    reader = os.fork()
    if reader == 0:  # a sibling of the target, as ranks are siblings under their launcher
        os.close(result_read)
        destination = ctypes.create_string_buffer(16)
        local = _IOVec(ctypes.cast(destination, ctypes.c_void_p), 16)
        remote = _IOVec(ctypes.cast(source, ctypes.c_void_p), 16)
        libc.process_vm_readv.restype = ctypes.c_ssize_t
        done = libc.process_vm_readv(target, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        error = ctypes.get_errno()
        ok = done == 16 and destination.raw == source.raw
        os.write(result_write, b"ok" if ok else os.strerror(error).encode()[:200] or b"short read")
        os._exit(0)
    os.close(result_write)
    answer = b""
    while chunk := os.read(result_read, 256):
        answer += chunk
    os.close(result_read)
    os.waitpid(reader, 0)
    os.kill(target, 9)
    os.waitpid(target, 0)
    return None if answer == b"ok" else f"process_vm_readv: {answer.decode(errors='replace') or 'no answer'}"


def prepare(environ, outside=launcher_outside, probe=cma_probe):
    """The changes to make to `environ` (a mapping): {name: value}. Ranks in separate user namespaces also cannot open
    each other's /proc/PID/fd, through which UCX's shared memory (PyPI MPICH's UCX) attaches by default: it is told to
    use named segments instead (UCX_POSIX_USE_PROC_LINK=n), unless the caller set that."""
    if environ.get(DECIDED_VARIABLE):
        return {}
    launcher = outside()
    if launcher:
        refused = (f"each rank in its own user namespace ({launcher} started them from outside the container; "
                   "apptainer --sharens shares one)")
    else:
        refused = probe()
    if refused is None:
        settings = {DECIDED_VARIABLE: "cma", OPEN_MPI_4_VARIABLE: "cma"}
    else:
        settings = {DECIDED_VARIABLE: f"none: {refused}", MPICH_CMA_VARIABLE: "0", OPEN_MPI_4_VARIABLE: "none",
                    OPEN_MPI_5_VARIABLE: "^cma"}
        if launcher:
            settings["UCX_POSIX_USE_PROC_LINK"] = "n"
    return {name: value for name, value in settings.items() if name == DECIDED_VARIABLE or name not in environ}


def apply(environ=None, **options):
    environ = os.environ if environ is None else environ
    changes = prepare(environ, **options)
    environ.update(changes)
    return changes


def at_rank_start(environ=None):
    """Decide for an MPI rank's Python process that no entrypoint decided for, before it loads MPI: run from the app
    image's tfhpc-singlecopy.pth at interpreter start. Quiet: a failure leaves the image's safe defaults."""
    environ = os.environ if environ is None else environ
    if environ.get(DECIDED_VARIABLE) or not any(name in environ for name in RANK_VARIABLES):
        return {}
    try:
        return apply(environ)
    except Exception:  # noqa: BLE001 (never stop a rank's interpreter from starting)
        return {}
