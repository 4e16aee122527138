#!/usr/bin/env python3
"""Horovod + tf.keras training smoke test (Keras 3 or tf_keras: --keras): a small classifier trained on synthetic
data with hvd.DistributedOptimizer and the broadcast, metric-average and learning-rate warm-up callbacks.

Each rank starts from different random weights on purpose (seed + rank): only the broadcast of the initial state
makes them agree, and only averaged gradients keep them equal. Every rank prints a JSON line (prefix "RESULT ") with
its loss history and a fingerprint of its final weights; the exit status is non-zero unless the loss fell and the
weights are identical on all ranks.

On a GPU node each rank trains on its own GPU (--device auto, the default); without one it says so and uses the CPU.
"""
import argparse
import socket
import sys

import numpy as np

from tfhpc_runtime.cli import report
from tfhpc_runtime.gpu import DeviceError, choose_device, select_gpu
from tfhpc_runtime.kerasselect import add_keras_arg, select_keras
from tfhpc_runtime.model import keras_version


def synthetic_classification(samples, features, classes, seed):
    rng = np.random.default_rng(seed)  # the same data set on every rank; each rank then takes its shard
    centers = rng.normal(scale=3.0, size=(classes, features))
    labels = rng.integers(0, classes, size=samples)
    points = centers[labels] + rng.normal(size=(samples, features))
    return points.astype("float32"), labels.astype("int32")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.01, help="single-worker learning rate (scaled by size)")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--min-ranks", type=int, default=2)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"),
                        help="auto: each rank's GPU when there is one, else the CPU (said in one line)")
    add_keras_arg(parser)
    args = parser.parse_args()
    select_keras(args.keras)
    # Here, not at the top: TensorFlow reads the Keras choice when it is imported.
    import tensorflow as tf
    import horovod.tensorflow.keras as hvd

    hvd.init()  # Horovod: initialize.
    gpus = tf.config.list_physical_devices("GPU")
    try:
        device, note = choose_device(args.device, len(gpus), tf.test.is_built_with_cuda())
        if device == "gpu":
            select_gpu(tf, hvd.local_rank(), hvd.local_size())  # Horovod: one GPU per rank.
    except DeviceError as error:
        print(f"smoke-train: error: {error}", file=sys.stderr)
        return 2
    if device == "cpu":
        tf.config.set_visible_devices([], "GPU")  # the CPU path really runs on the CPU, also on a GPU node
    if note and hvd.rank() == 0:
        print(f"smoke-train: {note}", flush=True)
    tf.keras.utils.set_random_seed(args.seed + hvd.rank())  # different initial weights per rank, on purpose

    x, y = synthetic_classification(args.samples, 8, 4, args.seed)
    dataset = (tf.data.Dataset.from_tensor_slices((x, y))
               .shard(hvd.size(), hvd.rank())  # Horovod: each rank reads its own part of the data.
               .shuffle(1024, seed=args.seed).batch(args.batch_size).repeat())
    steps_per_epoch = args.samples // (args.batch_size * hvd.size())  # Horovod: the epoch is split across ranks.

    model = tf.keras.Sequential([tf.keras.Input(shape=(8,)),
                                 tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(4)])
    optimizer = tf.keras.optimizers.SGD(learning_rate=args.lr * hvd.size(),  # Horovod: scale LR with the workers.
                                        momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer)  # Horovod: average gradients across ranks.
    model.compile(optimizer=optimizer,
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)  # Horovod: its ops have no XLA kernels
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # Horovod: rank 0's initial weights everywhere.
        hvd.callbacks.MetricAverageCallback(),  # Horovod: report metrics averaged over ranks.
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=args.lr * hvd.size(), warmup_epochs=2,
                                                 steps_per_epoch=steps_per_epoch),  # Horovod: gentle start.
    ]
    history = model.fit(dataset, epochs=args.epochs, steps_per_epoch=steps_per_epoch, callbacks=callbacks,
                        verbose=2 if hvd.rank() == 0 else 0)  # Horovod: only rank 0 prints progress.

    flat = np.concatenate([w.numpy().ravel() for w in model.weights]).astype(np.float64)
    everyone = hvd.allgather(tf.constant(flat[None, :])).numpy()  # Horovod: every rank's weights, to compare.
    max_difference = float(np.max(np.abs(everyone - everyone[0])))
    losses = [float(v) for v in history.history["loss"]]
    failures = []
    if hvd.size() < args.min_ranks:
        failures.append(f"only {hvd.size()} rank(s) joined, expected at least {args.min_ranks}")
    if not losses[-1] < 0.5 * losses[0]:
        failures.append(f"loss did not fall by half: {losses}")
    if max_difference != 0.0:
        failures.append(f"weights differ across ranks by up to {max_difference}")
    result = {"host": socket.gethostname(), "rank": hvd.rank(), "size": hvd.size(), "device": device, "losses": losses,
              "accuracy": float(history.history["accuracy"][-1]),
              "weights_sum": float(flat.sum()), "max_weight_difference_across_ranks": max_difference,
              "keras_package": type(model).__module__.split(".")[0], "keras": keras_version(model), "failures": failures}
    report(result, sort_keys=False)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
