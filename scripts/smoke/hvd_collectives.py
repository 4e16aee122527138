#!/usr/bin/env python3
"""Horovod collectives smoke test: exact allreduce (sum and average), broadcast from a non-zero root and allgather
with uneven first dimensions, checked against closed-form expected values on every rank.

Run with 2 or more ranks, e.g.:
    horovodrun -np 2 python hvd_collectives.py            # MPI controller when Horovod has it
    horovodrun -np 2 --gloo python hvd_collectives.py     # Gloo controller
    mpirun -np 2 python hvd_collectives.py

On a GPU node (gpu flavour, `--nv` or `--gpus all`) the tensors live on each rank's GPU, so Horovod reduces them
with NCCL; --bandwidth-sizes adds an allreduce sweep reporting nccl-tests' bus bandwidth, busbw = S/t * 2(N-1)/N
(default on the GPU path: 1M,16M,64M,256M; on the CPU path only when asked). Without a GPU, --device auto says so in
one line and runs the CPU path.

Every rank prints one JSON line (prefix "RESULT ") with the checksums it saw; the exit status is non-zero when any
value differs from the expected one.
"""
import argparse
import socket
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd

from tfhpc_runtime.cli import report
from tfhpc_runtime.errors import UsageError
from tfhpc_runtime.gpu import choose_device, select_gpu
from tfhpc_runtime.metrics import algorithm_bandwidth, bus_bandwidth, parse_bytes

DTYPES = {"float16": tf.float16, "float32": tf.float32, "float64": tf.float64, "int32": tf.int32}


def contribution(n, rank, dtype):
    # Values stay small integers so that every dtype, float16 included, represents sums and averages exactly:
    # rank r sends 2*(r+1)*(i % 7); the sum over N ranks is (i % 7)*N*(N+1), the average (i % 7)*(N+1).
    pattern = np.arange(n) % 7
    return tf.constant(2 * (rank + 1) * pattern, dtype=dtype), pattern


def bandwidth_sweep(sizes, iterations, size, failures):
    """Median time of a float32 sum-allreduce per size, as algbw and busbw (GB/s); the sum is checked too."""
    sweep = []
    for nbytes in sizes:
        tensor = tf.ones([max(nbytes // 4, 1)], tf.float32)
        hvd.allreduce(tensor, op=hvd.Sum, name=f"bandwidth.{nbytes}")[-1].numpy()  # warm-up: buffers, NCCL comms
        seconds = []
        for _ in range(iterations):
            start = time.perf_counter()
            reduced = hvd.allreduce(tensor, op=hvd.Sum, name=f"bandwidth.{nbytes}")  # Horovod: NCCL on GPU tensors.
            last = float(reduced[-1].numpy())  # one element back to the host: waits for the collective to finish
            seconds.append(time.perf_counter() - start)
            if last != size:
                failures.append(f"bandwidth allreduce of {nbytes} bytes summed to {last}, expected {size}")
        median = statistics.median(seconds)
        sweep.append({"bytes": nbytes, "iterations": iterations, "seconds_median": median,
                      "seconds_spread": max(seconds) - min(seconds),
                      "algbw_GBps": algorithm_bandwidth(nbytes, median) / 1e9,
                      "busbw_GBps": bus_bandwidth(nbytes, median, size) / 1e9})
    return sweep


def argument_problem(args):
    """The first thing wrong with the arguments, as one sentence naming the fix; None when they are usable."""
    unknown = [name for name in args.dtypes.split(",") if name not in DTYPES]
    if unknown:
        return f"unknown --dtypes {','.join(unknown)}: choose from {','.join(DTYPES)}"
    lengths = args.sizes.split(",")
    if not all(length.strip().isdigit() and int(length) > 0 for length in lengths):
        return f"--sizes {args.sizes}: give positive element counts, comma-separated, e.g. 1,1023,65536"
    if args.iterations < 1 or args.min_ranks < 1:
        return "--iterations and --min-ranks must be at least 1"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--sizes", default="1,1023,65536,1048576", help="tensor lengths (elements), comma-separated")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="dtypes, comma-separated")
    parser.add_argument("--min-ranks", type=int, default=2,
                        help="fail when fewer ranks take part (the hvd.size()==1 trap of a mismatched launcher)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"),
                        help="auto: each rank's GPU when there is one, else the CPU (said in one line)")
    parser.add_argument("--bandwidth-sizes", default=None,
                        help="allreduce sizes (bytes, K/M/G suffixes) for a bus-bandwidth sweep; "
                             "default 1M,16M,64M,256M on the GPU path, none on the CPU path")
    parser.add_argument("--iterations", type=int, default=5, help="timed allreduces per bandwidth size (median)")
    args = parser.parse_args()
    problem = argument_problem(args)
    if problem:  # before hvd.init(): bad input costs no job start-up and no per-rank traceback
        print(f"smoke-collectives: error: {problem}", file=sys.stderr)
        return 2

    hvd.init()  # Horovod: join the job started by horovodrun/mpirun/srun.
    size, rank = hvd.size(), hvd.rank()
    gpus = tf.config.list_physical_devices("GPU")
    try:
        device, note = choose_device(args.device, len(gpus), tf.test.is_built_with_cuda())
        if device == "gpu":
            select_gpu(tf, hvd.local_rank(), hvd.local_size(), memory_growth=False)  # Horovod: one GPU per rank.
        default_sizes = "1M,16M,64M,256M" if device == "gpu" else ""
        sizes = [parse_bytes(s) for s in (args.bandwidth_sizes or default_sizes).split(",") if s.strip()]
    except UsageError as error:
        print(f"smoke-collectives: error: {error}", file=sys.stderr)
        return 2
    if note and rank == 0:
        print(f"smoke-collectives: {note}", flush=True)
    failures = []
    result = {"host": socket.gethostname(), "rank": rank, "size": size, "local_size": hvd.local_size(),
              "controller": "mpi" if hvd.mpi_enabled() else "gloo" if hvd.gloo_enabled() else "unknown",
              "device": device, "nccl_built": bool(hvd.nccl_built()),
              "allreduce": {}, "broadcast": None, "allgather": None, "bandwidth": []}
    if size < args.min_ranks:
        failures.append(f"only {size} rank(s) joined, expected at least {args.min_ranks}")
    with tf.device("/GPU:0" if device == "gpu" else "/CPU:0"):
        check_collectives(args, size, rank, result, failures)
        result["bandwidth"] = bandwidth_sweep(sizes, args.iterations, size, failures)
    result["failures"] = failures
    report(result, sort_keys=False)
    return 1 if failures else 0


def check_collectives(args, size, rank, result, failures):
    """Allreduce (sum, average) per dtype and length, broadcast from a non-zero root, uneven allgather."""

    for dtype_name in args.dtypes.split(","):
        dtype = DTYPES[dtype_name]
        for n in (int(s) for s in args.sizes.split(",")):
            tensor, pattern = contribution(n, rank, dtype)
            for op_name, op, expected in (("sum", hvd.Sum, pattern * size * (size + 1)),
                                          ("average", hvd.Average, pattern * (size + 1))):
                # Horovod: the collective under test.
                reduced = hvd.allreduce(tensor, op=op, name=f"allreduce.{op_name}.{dtype_name}.{n}").numpy()
                exact = bool(np.array_equal(reduced.astype(np.float64), expected.astype(np.float64)))
                result["allreduce"][f"{op_name}/{dtype_name}/{n}"] = float(reduced.astype(np.float64).sum())
                if not exact:
                    failures.append(f"allreduce {op_name} {dtype_name} n={n} is not exact")

    root = size - 1  # a non-zero root whenever there are 2+ ranks
    mine = tf.fill([5], tf.constant(float(rank + 1), tf.float32))
    received = hvd.broadcast(mine, root_rank=root, name="broadcast").numpy()  # Horovod: root's values everywhere.
    result["broadcast"] = {"root": root, "values": received.tolist()}
    if not np.all(received == root + 1):
        failures.append(f"broadcast from root {root} gave {received.tolist()}")

    block = tf.fill([rank + 1, 3], tf.constant(rank, tf.int32))  # rank r sends r+1 rows: uneven first dimensions
    gathered = hvd.allgather(block, name="allgather").numpy()  # Horovod: rows of every rank, in rank order.
    expected_rows = np.concatenate([np.full((r + 1, 3), r) for r in range(size)])
    result["allgather"] = {"shape": list(gathered.shape), "first_column": gathered[:, 0].tolist()}
    if not np.array_equal(gathered, expected_rows):
        failures.append(f"allgather gave shape {gathered.shape}, expected {expected_rows.shape}")


if __name__ == "__main__":
    sys.exit(main())
