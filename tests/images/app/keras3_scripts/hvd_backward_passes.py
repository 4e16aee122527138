"""hvd.DistributedOptimizer(backward_passes_per_step=2) around a Keras 3 optimizer (`import keras`) in model.fit:
local gradient aggregation, as Horovod does it with tf_keras. Run on 2 ranks:

    horovodrun -np 2 python hvd_backward_passes.py

Each rank fits 8 batches of its own samples, from the same initial weights, with plain SGD. The weights after the
fit must be those of a loop without Horovod that applies, every 2 batches, the average of the gradients of those 2
batches of every rank (average_aggregated_gradients=True), all taken at the weights of before. Every rank prints one
"RESULT {json}" line.
"""
import hashlib
import json

import numpy as np
import tensorflow as tf
import keras
import horovod.tensorflow.keras as hvd

hvd.init()
PASSES, STEPS, BATCH, LR = 2, 8, 16, 0.1


def samples(rank):
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(STEPS * BATCH, 5)).astype("float32")
    return x, (x @ np.arange(1, 6, dtype="float32")[:, None] + 0.5).astype("float32")


def build():
    keras.utils.set_random_seed(0)  # the same initial weights on every rank and in the reference
    return keras.Sequential([keras.Input(shape=(5,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])


model = build()
# Horovod: sum the gradients of 2 batches locally, allreduce and apply them every 2nd batch.
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=LR), backward_passes_per_step=PASSES,
                               average_aggregated_gradients=True)
model.compile(optimizer=opt, loss="mse")
x, y = samples(hvd.rank())  # Horovod: each rank its own samples
model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)

# The reference, without Horovod: the samples of every rank, the same update rule.
reference = build()
data = [samples(rank) for rank in range(hvd.size())]
for start in range(0, STEPS, PASSES):
    grads = []
    for rank_x, rank_y in data:
        for step in range(start, start + PASSES):
            xb, yb = rank_x[step * BATCH:(step + 1) * BATCH], rank_y[step * BATCH:(step + 1) * BATCH]
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(reference(xb) - yb))
            grads.append(tape.gradient(loss, reference.trainable_variables))
    for i, var in enumerate(reference.trainable_variables):
        var.assign(var - LR * tf.add_n([g[i] for g in grads]) / len(grads))

weights = model.get_weights()
report = {
    "rank": hvd.rank(),
    "keras": keras.__version__,
    "iterations": int(opt.iterations.numpy()),
    "counter": int(opt._agg_helper.counter.numpy()),
    "reference_gap": float(max(np.abs(w - r).max() for w, r in zip(weights, reference.get_weights()))),
    "moved": float(max(np.abs(w - r).max() for w, r in zip(weights, build().get_weights()))),
    "weights_digest": hashlib.sha256(b"".join(w.tobytes() for w in weights)).hexdigest()[:16],
}
print("RESULT " + json.dumps(report), flush=True)
