#!/usr/bin/env python3
"""Synthetic throughput benchmark: training steps on random images, timed, with Horovod or with
MultiWorkerMirroredStrategy; the same output either way.

One batch of random images and labels is made once and trained on repeatedly (no input pipeline, no I/O), after
--warmup-batches untimed steps. Each of --iters timed iterations runs --batches-per-iter steps; a worker's rate is
its images (per-replica batch x its replicas x steps) divided by the iteration's time. Reported by every rank (one
"RESULT {json}" line, the same aggregate everywhere) and printed by rank 0:
  per worker : mean, standard deviation and 95 % interval over iterations and workers, and each worker's mean;
  total      : the sum over workers per iteration, its mean, standard deviation and 95 % interval.

    horovodrun -np 2 python synthetic_benchmark.py --mode horovod
    python launch_local_mwms.py -n 2 python synthetic_benchmark.py --mode mwms
    srun python synthetic_benchmark.py --mode horovod --model ResNet50 --image-size 224 --batch-size 64

--model small (default) is a 4-layer CNN that runs in seconds on a CPU; any tf.keras.applications model name
(ResNet50, MobileNetV2, ...) is built with random weights (nothing is downloaded).
"""
import contextlib
import math
import sys
import time

import numpy as np

from tfhpc_runtime.cli import Parser, report
from tfhpc_runtime.cluster import add_mwms_args, make_strategy, plan_cluster, remove_proxies
from tfhpc_runtime.errors import fail
from tfhpc_runtime.gpu import pin_gpu
from tfhpc_runtime.kerasselect import add_keras_arg, select_keras
from tfhpc_runtime.metrics import configure_threads, default_threads, throughput_summary
from tfhpc_runtime.model import keras_version, optimizer_variables


def main():
    parser = Parser(__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="horovod", choices=("horovod", "mwms"),
                        help="horovod: start under horovodrun/mpirun/srun; mwms: TF_CONFIG or Slurm")
    parser.add_argument("--model", default="small", help="small, or a tf.keras.applications model name")
    parser.add_argument("--image-size", type=int, default=None, help="default: 32 for small, 224 otherwise")
    parser.add_argument("--classes", type=int, default=None, help="default: 10 for small, 1000 otherwise")
    parser.add_argument("--batch-size", type=int, default=32, help="per replica")
    parser.add_argument("--warmup-batches", type=int, default=3, help="untimed steps first (tracing, allocation)")
    parser.add_argument("--batches-per-iter", type=int, default=10, help="steps per timed iteration")
    parser.add_argument("--iters", type=int, default=5, help="timed iterations")
    parser.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (unscaled; speed only)")
    parser.add_argument("--fp16-allreduce", action="store_true", help="Horovod: compress gradients to float16")
    parser.add_argument("--intra-threads", type=int, default=default_threads(),
                        help="TensorFlow intra-op threads per rank (0 = cores / ranks on the node)")
    add_mwms_args(parser)
    add_keras_arg(parser)
    args = parser.parse_args()
    for name in ("batch_size", "batches_per_iter", "iters"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.warmup_batches < 0:
        fail(f"--warmup-batches must be 0 or more, got {args.warmup_batches}")
    size_default, classes_default = (32, 10) if args.model == "small" else (224, 1000)
    image_size, classes = args.image_size or size_default, args.classes or classes_default
    if image_size < 32 or classes < 2:
        fail("--image-size must be at least 32 and --classes at least 2")
    plan = plan_cluster(args) if args.mode == "mwms" else None  # MWMS: checked before TensorFlow starts.
    removed = remove_proxies(args.keep_proxy) if args.mode == "mwms" else []  # MWMS: no proxy for gRPC.
    args.keras = select_keras(args.keras)  # before TensorFlow is imported: its import reads the choice

    import tensorflow as tf

    if args.model != "small" and not hasattr(tf.keras.applications, args.model):
        names = sorted(n for n in dir(tf.keras.applications) if n[0].isupper())
        fail(f"--model {args.model!r} is neither 'small' nor a tf.keras.applications model "
             f"({', '.join(names[:8])}, ...)")
    if args.mode == "horovod":
        import horovod.tensorflow as hvd
        hvd.init()  # Horovod: join the job.
        rank, workers, local = hvd.rank(), hvd.size(), hvd.local_size()
        threads = configure_threads(tf, args.intra_threads, local)
        pin_gpu(tf, hvd.local_rank(), hvd.local_size())  # Horovod: one GPU per rank.
        replicas_here, strategy = 1, None
    else:
        hvd = None
        threads = configure_threads(tf, args.intra_threads, plan["local_workers"])
        strategy, cluster = make_strategy(tf, args, plan)  # MWMS: the strategy before any other TF op.
        rank, workers = cluster["rank"], cluster["workers"]
        replicas_here = strategy.num_replicas_in_sync // workers

    tf.keras.utils.set_random_seed(1234)
    shape = (image_size, image_size, 3)
    scope = strategy.scope() if strategy else contextlib.nullcontext()
    with scope:  # MWMS: variables mirrored on every replica.
        model = build(tf, args.model, shape, classes)
        optimizer = tf.keras.optimizers.SGD(learning_rate=args.lr)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    images = tf.random.uniform((args.batch_size, *shape))
    labels = tf.random.uniform((args.batch_size,), maxval=classes, dtype=tf.int32)

    if hvd:
        compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_fn(labels, model(images, training=True)))
            tape = hvd.DistributedGradientTape(tape, compression=compression)  # Horovod: averaged gradients.
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        first = step()
        hvd.broadcast_variables(model.variables, root_rank=0)  # Horovod: rank 0's state, after the first step.
        hvd.broadcast_variables(optimizer_variables(optimizer), root_rank=0)
    else:
        global_batch = args.batch_size * strategy.num_replicas_in_sync

        @tf.function
        def step():
            def replica_step():
                with tf.GradientTape() as tape:
                    loss = tf.nn.compute_average_loss(loss_fn(labels, model(images, training=True)),
                                                      global_batch_size=global_batch)  # MWMS: / global batch.
                gradients = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(gradients, model.trainable_variables))  # MWMS: all-reduced.
                return loss
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step), axis=None)  # MWMS

        first = step()
    losses = [float(first)]
    for _ in range(args.warmup_batches):
        losses.append(float(step()))

    rates = []
    for _ in range(args.iters):
        started = time.perf_counter()
        for _ in range(args.batches_per_iter):
            loss = step()
        losses.append(float(loss))  # fetching the value waits for the last step
        rates.append(args.batch_size * replicas_here * args.batches_per_iter / (time.perf_counter() - started))

    mine = np.array(rates, np.float64)[None, :]
    if hvd:
        table = hvd.allgather(tf.constant(mine)).numpy()  # Horovod: every rank's rates, in rank order.
    else:
        table = gather_workers(tf, strategy, mine, workers, replicas_here)
    result = throughput_summary(table)
    result.update({"rank": rank, "size": workers, "script": "synthetic_benchmark", "mode": args.mode,
                   "keras": keras_version(model), "model": args.model, "image_size": image_size, "classes": classes,
                   "batch_per_replica": args.batch_size, "replicas_per_worker": replicas_here,
                   "iters": args.iters, "batches_per_iter": args.batches_per_iter, "intra_threads": threads,
                   "parameters": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
                   "losses": losses, "removed_proxy_variables": removed, "failures": []})
    if not all(math.isfinite(v) for v in losses):
        result["failures"].append(f"non-finite loss: {losses}")
    if rank == 0:
        per, total = result["images_per_second_per_worker"], result["images_per_second_total"]
        print(f"Model: {args.model} ({result['parameters']} parameters), {args.mode}, batch {args.batch_size} per "
              f"replica, {workers} worker(s)")
        print(f"Img/sec per worker: {per['mean']:.1f} +-{per['ci95']:.1f} (std {per['std']:.1f}; means "
              f"{', '.join(f'{v:.1f}' for v in result['per_worker_mean'])})")
        print(f"Total img/sec on {workers} worker(s): {total['mean']:.1f} +-{total['ci95']:.1f} "
              f"(std {total['std']:.1f})", flush=True)
    report(result)
    return 1 if result["failures"] else 0


def gather_workers(tf, strategy, mine, workers, replicas_here):
    """MWMS: every worker's rates on every worker (strategy.gather over replicas; one row per replica, kept once
    per worker)."""
    value = tf.constant(mine)
    per_replica = strategy.run(lambda: tf.identity(value))
    table = strategy.gather(per_replica, axis=0).numpy()  # MWMS: rows of all replicas, in replica order.
    return table[::replicas_here][:workers]


def build(tf, name, shape, classes):
    if name == "small":
        layers = tf.keras.layers
        return tf.keras.Sequential([
            tf.keras.Input(shape=shape), layers.Conv2D(32, 3, activation="relu"),
            layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(), layers.Conv2D(64, 3, activation="relu"),
            layers.GlobalAveragePooling2D(), layers.Dense(classes)])
    model = getattr(tf.keras.applications, name)
    return model(weights=None, input_shape=shape, classes=classes, classifier_activation=None)


if __name__ == "__main__":
    sys.exit(main())
