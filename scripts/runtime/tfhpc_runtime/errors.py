"""Errors every shipped script reports the same way: UsageError for a request that cannot be met, and fail(), which
prints one line from rank 0 only. The rank is read from the launcher's environment, so that this works before any
framework starts.

At the bottom of the package: imports nothing of it, so that every other module can report through it.
"""
import json
import os
import sys
import time

PREFIX = "tfhpc"
FAIL_WAIT_SECONDS = 10  # see fail()


class UsageError(Exception):
    """A request that cannot be met; the message names the fix. Scripts turn it into one line on stderr."""


def launch_rank():
    """This process's rank as the launcher announced it (mpirun, horovodrun, srun, TF_CONFIG), read before any
    framework starts, so that only one rank prints an error."""
    for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    try:
        return int(json.loads(os.environ.get("TF_CONFIG", "{}"))["task"]["index"])
    except (ValueError, KeyError, TypeError):
        return 0


def launch_size():
    """The number of ranks the launcher started, from its environment (1 when started without one)."""
    for name in ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 1


def fail(message, code=2, everyone=False):
    """Stop with one line on stderr, printed by rank 0 only (the other ranks exit with the same status) unless the
    problem is this process's own (everyone=True)."""
    if everyone or launch_rank() == 0:
        print(f"{PREFIX}: error: {message}", file=sys.stderr, flush=True)
    else:
        # The silent ranks leave last: a launcher kills the job at the first non-zero exit, and Open MPI 5's mpirun
        # then lost rank 0's line when another rank exited first (measured: in 1 of 2 GPU-image test runs). Rank 0's
        # exit ends the job, so the wait costs nothing unless rank 0 never gets here. No upstream report found for
        # Open MPI 5.0.7 (searched 2026-11); drop when test_bad_input_* in tests/images/app passes on the GPU image
        # (Open MPI 5) with FAIL_WAIT_SECONDS = 0 over repeated runs.
        time.sleep(FAIL_WAIT_SECONDS)
    sys.exit(code)
