"""Figures the scripts measure and the threads they measure with: intra-op threads per rank, nccl-tests' bandwidths
of an allreduce (the one busbw of the image), and throughput statistics over workers and iterations."""
import os

import numpy as np

from .errors import UsageError


def default_threads():
    """Intra-op threads from OMP_NUM_THREADS or SLURM_CPUS_PER_TASK (as the CSCS Piz Daint course's job script sets
    them), else 0: configure_threads() then divides the cores among the ranks on the node."""
    for name in ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def configure_threads(tf, threads, local_ranks=1):
    """Intra-op threads per rank: --intra-threads, else the cores of this process divided by the ranks on the node
    (TensorFlow's own default takes every core in every rank: N ranks on a node then fight over the cores)."""
    if not threads:
        threads = max(1, len(os.sched_getaffinity(0)) // max(1, local_ranks))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    return threads


def parse_bytes(text):
    """'64M' -> 67108864; suffixes K, M, G are powers of 1024 (nccl-tests' -b/-e)."""
    text = text.strip().upper()
    factor = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in "KMG" else text
    try:
        value = int(number) * factor
    except ValueError:
        raise UsageError(f"size '{text}' is not a byte count: write e.g. 4096, 64K, 16M or 1G") from None
    if value <= 0:
        raise UsageError(f"size '{text}' must be positive")
    return value


def algorithm_bandwidth(size_bytes, seconds):
    """Bytes per second of one allreduce of size_bytes taking seconds (nccl-tests' algbw)."""
    if seconds <= 0:
        raise ValueError("seconds must be positive")
    return size_bytes / seconds


def bus_bandwidth(size_bytes, seconds, ranks):
    """nccl-tests' bus bandwidth of an allreduce: algbw * 2(N-1)/N, comparable across rank counts and with the
    hardware's link bandwidth (each rank sends and receives 2(N-1)/N of the data in a ring, the ring allreduce cost
    the CSCS Piz Daint course derives)."""
    if ranks < 1:
        raise ValueError("ranks must be at least 1")
    return algorithm_bandwidth(size_bytes, seconds) * 2 * (ranks - 1) / ranks


def throughput_summary(table):
    """table: rates [workers, iterations] -> per-worker and total statistics (95 % interval = 1.96 std)."""
    per_worker = table.ravel()
    totals = table.sum(axis=0)
    return {"images_per_second_per_worker": _stats(per_worker), "images_per_second_total": _stats(totals),
            "per_worker_mean": table.mean(axis=1).tolist(), "rates": table.tolist()}


def _stats(values):
    std = float(np.std(values))
    return {"mean": float(np.mean(values)), "std": std, "ci95": 1.96 * std, "n": int(values.size)}
