"""The models and optimizers of the training entrypoints, learning-rate scaling, and exact evaluation under Horovod.
TensorFlow (and Horovod) are passed in as `tf` (and `hvd`)."""
import math
import sys

import numpy as np

from .data import IMAGE_SHAPE, NUM_CLASSES, test_dataset
from .errors import fail

LR_SCALING = ("linear", "sqrt", "none")  # --lr-scaling; scaled_lr applies them


def scaled_lr(lr, replicas, scaling):
    """The learning rate for `replicas` workers whose gradients are averaged: linear, as the CSCS Piz Daint course
    and the IDRIS Jean Zay guide scale it, or sqrt, which the IT4Innovations course calls the strict rule."""
    if scaling == "linear":
        return lr * replicas
    if scaling == "sqrt":
        return lr * math.sqrt(replicas)
    if scaling == "none":
        return lr
    fail(f"--lr-scaling {scaling!r} is unknown: choose one of {', '.join(LR_SCALING)}")


def build_model(tf, name):
    layers = tf.keras.layers
    if name == "mlp":  # the IT4Innovations course's example model
        body = [layers.Flatten(), layers.Dense(128, activation="relu")]
    else:  # the Lablup course's CNN
        body = [layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(), layers.Flatten(),
                layers.Dense(64, activation="relu")]
    return tf.keras.Sequential([tf.keras.Input(shape=IMAGE_SHAPE), *body, layers.Dense(NUM_CLASSES)])


def make_optimizer(tf, args, lr):
    if args.optimizer == "adam":
        return tf.keras.optimizers.Adam(learning_rate=lr)
    return tf.keras.optimizers.SGD(learning_rate=lr, momentum=args.momentum)


def optimizer_variables(optimizer):
    """An optimizer's variables as a list: a method in tf_keras, a property in Keras 3."""
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def keras_version(model):
    """The version of the Keras package a model comes from (keras, tf_keras), for the RESULT lines: tf.keras itself
    has no __version__ under tf_keras."""
    return str(sys.modules[type(model).__module__.split(".")[0]].__version__)


def keras_major(model):
    """3 for a Keras 3 model, 2 for tf_keras or TensorFlow < 2.16's built-in Keras."""
    return int(keras_version(model).split(".")[0])


def flat_weights(model):
    return np.concatenate([w.numpy().ravel() for w in model.weights]).astype(np.float64)


def hvd_evaluate(tf, hvd, model, x, y, batch):
    """Exact test loss and accuracy over the whole test set with Horovod: each rank evaluates its own shard and the
    sums are allreduced (averaging per-rank means would weight unequal shards wrongly)."""
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    totals = np.zeros(3)
    for images, labels in test_dataset(tf, x, y, batch, shard=(hvd.size(), hvd.rank())):  # Horovod: own shard.
        logits = model(images, training=False)
        correct = tf.reduce_sum(tf.cast(tf.argmax(logits, 1, output_type=tf.int32) == labels, tf.float64))
        totals += [float(loss_fn(labels, logits)), float(correct), len(labels)]
    totals = hvd.allreduce(tf.constant(totals), op=hvd.Sum, name="evaluate").numpy()  # Horovod: global sums.
    return float(totals[0] / totals[2]), float(totals[1] / totals[2])
