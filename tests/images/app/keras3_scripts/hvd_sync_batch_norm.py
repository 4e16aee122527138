"""hvd.SyncBatchNormalization in a Keras 3 model (tf.keras is Keras 3 under TF_USE_LEGACY_KERAS=0, the layer's base
class is tf.keras.layers.BatchNormalization). Run on 2 ranks:

    TF_USE_LEGACY_KERAS=0 horovodrun -np 2 python hvd_sync_batch_norm.py

Each rank normalizes its own 4 samples in one training call; the layer's batch statistics (momentum 0: the moving
mean and variance are the batch's) must be those of the 8 samples of both ranks, and its output the 8 samples
normalized with them. Every rank prints one "RESULT {json}" line.
"""
import json

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

hvd.init()
assert tf.keras.__version__.startswith("3."), "run with TF_USE_LEGACY_KERAS=0 (tf.keras is then Keras 3)"

rng = np.random.default_rng(0)
everyone = rng.normal(loc=3.0, scale=2.0, size=(hvd.size() * 4, 3)).astype("float32")  # the samples of all ranks
own = everyone[hvd.rank() * 4:(hvd.rank() + 1) * 4]  # Horovod: each rank its own samples

# Horovod: the batch statistics of this layer are averaged over the ranks.
layer = hvd.SyncBatchNormalization(momentum=0.0, epsilon=1e-3)
model = tf.keras.Sequential([tf.keras.Input(shape=(3,)), layer])
outputs = model(own, training=True).numpy()

mean, variance = everyone.mean(axis=0), everyone.var(axis=0)
expected = (own - mean) / np.sqrt(variance + 1e-3)
report = {
    "rank": hvd.rank(),
    "keras": tf.keras.__version__,
    "layer_class": type(layer).__mro__[1].__module__,
    "moving_mean_gap": float(np.abs(layer.moving_mean.numpy() - mean).max()),
    "moving_variance_gap": float(np.abs(layer.moving_variance.numpy() - variance).max()),
    "output_gap": float(np.abs(outputs - expected).max()),
    # a rank's own statistics differ from the global ones: the test is not trivial
    "own_mean_gap": float(np.abs(own.mean(axis=0) - mean).max()),
}
print("RESULT " + json.dumps(report), flush=True)
