"""Horovod's partial distribution with Keras 3 (`import keras`): hvd.PartialDistributedGradientTape and
horovod.keras.PartialDistributedOptimizer with a local layer, whose gradient stays on its rank (scaled by 1/size),
while the other layers' gradients are averaged over the ranks. Run on 2 ranks:

    horovodrun -np 2 python hvd_partial_distributed.py

Each rank starts from the same weights and trains on its own samples. Every rank prints one "RESULT {json}" line:
the gaps between what the tape and the optimizer return and what they must return (the rank's own gradient / size
for the local layer, the average of the ranks' own gradients for the others), and digests of the weights after 5
steps of the optimizer (the global layer equal on the ranks, the local layer not).
"""
import hashlib
import json

import numpy as np
import tensorflow as tf
import keras
import horovod.keras as hvd_keras
import horovod.tensorflow as hvd

hvd.init()

keras.utils.set_random_seed(0)  # the same initial weights on every rank
model = keras.Sequential([keras.Input(shape=(6,)), keras.layers.Dense(4, name="local"),
                          keras.layers.Dense(1, name="shared")])
local_layer = model.get_layer("local")
rng = np.random.default_rng(hvd.rank())  # Horovod: each rank its own samples
x = rng.normal(size=(16, 6)).astype("float32")
y = rng.normal(size=(16, 1)).astype("float32")


def loss_fn():
    return tf.reduce_mean(tf.square(model(x, training=True) - y))


def gap(a, b):
    return float(max(np.abs(np.asarray(u) - np.asarray(v)).max() for u, v in zip(a, b)))


variables = model.trainable_variables
is_local = [any(v is w for w in local_layer.trainable_variables) for v in variables]
with tf.GradientTape(persistent=True) as tape:
    loss = loss_fn()
own = tape.gradient(loss, variables)
average = [hvd.allreduce(g, op=hvd.Average) for g in own]
expected = [g / hvd.size() if local else a for g, a, local in zip(own, average, is_local)]

# Horovod: the local layer's gradients are left out of the allreduce.
partial_tape = hvd.PartialDistributedGradientTape(tape, local_layers=[local_layer])
tape_grads = partial_tape.gradient(loss, variables)

# Horovod: the optimizer's counterpart; compute_gradients returns the gradients it applies.
opt = hvd_keras.PartialDistributedOptimizer(keras.optimizers.SGD(learning_rate=0.05), local_layers=[local_layer])
opt_grads = [g for g, _ in opt.compute_gradients(loss_fn, variables)]
for step in range(5):
    opt.apply_gradients(opt.compute_gradients(loss_fn, variables))


def digest(layer):
    return hashlib.sha256(b"".join(w.tobytes() for w in layer.get_weights())).hexdigest()[:16]


report = {
    "rank": hvd.rank(),
    "keras": keras.__version__,
    "tape_gap": gap(tape_grads, expected),
    "optimizer_gap": gap(opt_grads, expected),
    "local_gradient_differs": bool(np.abs(np.asarray(own[0]) - np.asarray(average[0])).max() > 1e-3),
    "iterations": int(opt.iterations.numpy()),
    "local_digest": digest(local_layer),
    "shared_digest": digest(model.get_layer("shared")),
}
print("RESULT " + json.dumps(report), flush=True)
