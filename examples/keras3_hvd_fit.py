"""Horovod with Keras 3 (`import keras`) and `model.fit`, in the shape of Horovod's Keras example (nothing from
tfhpc): the model and optimizer from Keras, horovod.tensorflow.keras for the DistributedOptimizer and the broadcast
and metric-average callbacks, the model saved as `.keras` by rank 0 and loaded back without Horovod. Run it on 2
ranks (shipped at /opt/tfhpc/examples):

    horovodrun -np 2 python keras3_hvd_fit.py OUT_DIR        # or mpirun -np 2 ..., srun ...

Every rank prints one "RESULT {json}" line: its epoch losses (averaged over the ranks by the callback), its own
loss of the last epoch, and a digest of its weights.
"""
import hashlib
import json
import os
import sys

import numpy as np
import tensorflow as tf
import keras
import horovod.tensorflow.keras as hvd

# Horovod: start Horovod (rank, size, the controller) before anything else uses it.
hvd.init()
out_dir = sys.argv[1]

rng = np.random.default_rng(hvd.rank())  # Horovod: each rank its own samples
x = rng.normal(size=(1024, 16)).astype("float32")
y = (x[:, :8].sum(axis=1) > x[:, 8:].sum(axis=1)).astype("int32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(1024, seed=1).batch(32)

keras.utils.set_random_seed(hvd.rank())  # different initial weights per rank: only the broadcast makes them agree
model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])

# Horovod: the averaged gradient of N ranks' batches is as noisy as one batch N times larger: scale the rate.
scaled_lr = 0.02 * hvd.size()
opt = keras.optimizers.SGD(learning_rate=scaled_lr)

# Horovod: the wrapped optimizer averages the gradients over the ranks before it applies them.
opt = hvd.DistributedOptimizer(opt)

model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer=opt,
              metrics=["accuracy"])


class LastLoss(keras.callbacks.Callback):
    """This rank's own loss of the epoch, before the metric average replaces it."""

    def on_epoch_end(self, epoch, logs=None):
        self.loss = float(logs["loss"])


last_loss = LastLoss()
callbacks = [
    last_loss,
    # Horovod: rank 0's weights (random here, or restored) to every rank before the first step.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    # Horovod: the epoch's metrics (loss, accuracy) as the mean over the ranks, not rank 0's alone.
    hvd.callbacks.MetricAverageCallback(),
]

verbose = 0  # Horovod: progress bars would come from every rank (rank 0 alone: 1 if hvd.rank() == 0 else 0)
history = model.fit(dataset, steps_per_epoch=30, callbacks=callbacks, epochs=3, verbose=verbose)

weights = model.get_weights()
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w, dtype=np.float32).tobytes() for w in weights)).hexdigest()
report = {"rank": hvd.rank(), "size": hvd.size(), "losses": [float(v) for v in history.history["loss"]],
          "own_last_loss": last_loss.loss, "weights_digest": digest}
# Horovod: save the model on worker 0 only; it loads without Horovod.
if hvd.rank() == 0:
    model.save(os.path.join(out_dir, "model.keras"))
    reloaded = keras.models.load_model(os.path.join(out_dir, "model.keras"))
    report["reloaded_optimizer"] = type(reloaded.optimizer).__module__ + "." + type(reloaded.optimizer).__name__
    report["reloaded_equal"] = all(np.array_equal(a, b) for a, b in zip(weights, reloaded.get_weights()))
print("RESULT " + json.dumps(report), flush=True)
