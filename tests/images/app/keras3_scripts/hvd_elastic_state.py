"""Horovod Elastic's Keras state (hvd.elastic.KerasState) around a Keras 3 model and optimizer (`import keras`):
sync, restore and commit, the optimizer's variables included. Run on 2 ranks:

    horovodrun -np 2 python hvd_elastic_state.py

Each rank starts from its own weights and trains a step on its own samples (Adam: its slots then exist). sync() must
give every rank rank 0's weights and optimizer variables; restore() must bring back what the last sync() or commit()
saved after more steps changed them. Every rank prints one "RESULT {json}" line.
"""
import hashlib
import json

import numpy as np
import tensorflow as tf
import keras
import horovod.tensorflow.keras as hvd

hvd.init()

keras.utils.set_random_seed(hvd.rank())  # each rank its own initial weights
model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
optimizer = keras.optimizers.Adam(learning_rate=0.01)
rng = np.random.default_rng(hvd.rank())  # each rank its own samples
x = rng.normal(size=(8, 4)).astype("float32")
y = rng.normal(size=(8, 1)).astype("float32")


def train_step():
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))


def values():
    return [np.asarray(v) for v in model.variables] + [np.asarray(v) for v in optimizer.variables]


def digest(arrays):
    return hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()[:16]


def gap(a, b):
    return float(max(np.abs(u - v).max() for u, v in zip(a, b)))


train_step()
# Horovod: the state that elastic training syncs on a reset and restores after a failure.
state = hvd.elastic.KerasState(model, optimizer, epoch=10 + hvd.rank())
state.sync()
synced = values()
train_step()
changed = gap(values(), synced)
state.restore()
restored_gap = gap(values(), synced)
train_step()
state.commit()
committed = values()
train_step()
state.restore()

report = {
    "rank": hvd.rank(),
    "keras": keras.__version__,
    "optimizer_variables": len(optimizer.variables),
    "epoch": state.epoch,
    "synced_digest": digest(synced),
    "changed": changed,
    "restored_gap": restored_gap,
    "committed_gap": gap(values(), committed),
}
print("RESULT " + json.dumps(report), flush=True)
