#!/usr/bin/env python3
"""Allreduce timing probe, mounted into the container by `make bench` (not shipped in the image).

    mpirun -np 2 python3 allreduce.py --impl mpi4py             # raw MPI_Allreduce through mpi4py
    mpirun -np 2 python3 allreduce.py --impl horovod            # Horovod, MPI controller and MPI operations
    horovodrun -np 2 --gloo python3 allreduce.py --impl horovod # Horovod over Gloo
    python3 allreduce.py --impl memcpy                          # one core copying the same sizes: the limit

For every size (bytes of float32) each rank runs `--reps` timed blocks of n operations after a warm-up; n is chosen
so that a block lasts about --block-seconds (the ranks agree on the largest n-estimate, so they stay in step) and the
block's time is the slowest rank's. With --fused-sizes (Horovod only) those sizes are also run as operations that allreduce
16 tensors of S/16 bytes at once inside one tf.function, as DistributedGradientTape does with gradients: the pattern
tensor fusion serves (reported under "fused16.<size>").
Rank 0 prints one line "RESULT {json}" with the seconds per operation of every rep.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np

FUSED_TENSORS = 16


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", required=True, choices=("mpi4py", "horovod", "memcpy"))
    parser.add_argument("--sizes", required=True, help="bytes, comma-separated")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--block-seconds", type=float, default=0.1)
    parser.add_argument("--max-ops", type=int, default=2000)
    parser.add_argument("--fused-sizes", default="", help="Horovod: also these sizes as 16 tensors of S/16 at once")
    args = parser.parse_args()
    cases = [(int(s), 1) for s in args.sizes.split(",")]
    if args.fused_sizes and args.impl == "horovod":
        cases += [(int(s), FUSED_TENSORS) for s in args.fused_sizes.split(",")]

    if args.impl == "mpi4py":
        from mpi4py import MPI  # here: in the image, for --impl mpi4py only
        comm = MPI.COMM_WORLD
        rank, ranks = comm.Get_rank(), comm.Get_size()
        agree = lambda value: comm.allreduce(value, op=MPI.MAX)  # noqa: E731
        barrier = comm.Barrier

        def prepare(size, parts):
            send = np.ones(size // 4, np.float32)
            receive = np.empty_like(send)
            return lambda: comm.Allreduce(send, receive, op=MPI.SUM)
        info = {"library": MPI.Get_library_version().splitlines()[0]}
    elif args.impl == "horovod":
        import tensorflow as tf  # here: in the image, for --impl horovod only (seconds to import)
        import horovod.tensorflow as hvd  # here: as tensorflow above
        hvd.init()
        rank, ranks = hvd.rank(), hvd.size()

        def agree(value):
            return float(np.max(hvd.allgather(tf.constant([float(value)], tf.float64), name="bench.agree").numpy()))

        def barrier():
            hvd.allreduce(tf.constant([0.0]), op=hvd.Sum, name="bench.barrier").numpy()

        def prepare(size, parts):
            parts = max(1, min(parts, size // 4))
            tensors = [tf.ones([size // 4 // parts], tf.float32) for _ in range(parts)]
            # An eager op (or tf.function call) returns once its kernels are done (TF's synchronous eager mode), so
            # the result is complete without .numpy(), which would copy it (EagerTensor.numpy returns a copy): a cost
            # the mpi4py run does not have.
            if parts == 1:
                name = f"bench.{size}"
                return lambda: hvd.allreduce(tensors[0], op=hvd.Sum, name=name)

            @tf.function
            def fused():
                # All K allreduces are enqueued before any completes: Horovod fuses what arrives within a cycle.
                return [hvd.allreduce(t, op=hvd.Sum, name=f"bench.{size}.{i}") for i, t in enumerate(tensors)]
            return fused
        info = {"controller": "mpi" if hvd.mpi_enabled() else "gloo" if hvd.gloo_enabled() else "unknown",
                "env": {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_") and "ADDR" not in k
                        and "PORT" not in k}}
    else:
        rank, ranks = 0, 1
        agree = lambda value: value  # noqa: E731
        barrier = lambda: None  # noqa: E731

        def prepare(size, parts):
            source = np.ones(size // 4, np.float32)
            target = np.empty_like(source)
            return lambda: np.copyto(target, source)
        info = {}

    seconds = {}
    for size, parts in cases:
        operation = prepare(size, parts)
        operation()  # warm-up: first-touch of the buffers, Horovod's response cache, tf.function tracing
        barrier()
        started = time.perf_counter()
        operation()
        estimate = time.perf_counter() - started
        ops = int(min(args.max_ops, max(1, math.ceil(args.block_seconds / max(agree(estimate), 1e-7)))))
        ops = int(agree(ops))
        times = []
        for _ in range(args.reps):
            barrier()
            started = time.perf_counter()
            for _ in range(ops):
                operation()
            times.append(agree((time.perf_counter() - started) / ops))
        seconds[str(size) if parts == 1 else f"fused{parts}.{size}"] = times
        del operation
    if rank == 0:  # the times are already the slowest rank's; one line keeps launchers from interleaving output
        print("RESULT " + json.dumps({"rank": rank, "ranks": ranks, "impl": args.impl,
                                      "seconds_per_op": seconds, **info}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
