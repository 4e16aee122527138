"""A user's Keras 3 script in the shape of TensorFlow's "Multi-worker training with Keras" tutorial, its fault
tolerance part (nothing from tfhpc): `import keras`, MultiWorkerMirroredStrategy from TF_CONFIG, a learning rate
that decays (keras.optimizers.schedules.ExponentialDecay), the BackupAndRestore and TensorBoard callbacks, then a
second `fit` with EarlyStopping. Run one process per worker, each with its TF_CONFIG, twice with the same OUT_DIR:
the second run resumes from the backup.

    TF_CONFIG='{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}' \
        python keras3_mwms_callbacks.py OUT_DIR EPOCHS

Every worker prints one "RESULT {json}" line: the epochs its first `fit` ran, the learning rate and step count
after it, the files of its backup directory, the epochs the EarlyStopping `fit` ran and its weights' digest.
"""
import hashlib
import json
import os
import sys

import numpy as np
import tensorflow as tf
import keras

out_dir, epochs = sys.argv[1], int(sys.argv[2])
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])
task_index = tf_config["task"]["index"]

# MWMS: one strategy per process, created before any other TensorFlow operation.
strategy = tf.distribute.MultiWorkerMirroredStrategy()

per_worker_batch_size = 32
global_batch_size = per_worker_batch_size * num_workers
rng = np.random.default_rng(0)
x = rng.normal(size=(2048, 16)).astype("float32")
y = (x[:, :8].sum(axis=1) > x[:, 8:].sum(axis=1)).astype("int32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048, seed=1).repeat().batch(global_batch_size)
steps_per_epoch = 30

with strategy.scope():
    keras.utils.set_random_seed(task_index)
    model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(2)])
    # The learning rate halves every epoch (30 steps).
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=steps_per_epoch, decay_rate=0.5)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(learning_rate=schedule), metrics=["accuracy"])


class Epochs(keras.callbacks.Callback):
    """The epochs a fit runs."""

    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)


# MWMS: one backup directory and one log directory for every worker: the chief writes them, every worker restores
# the chief's backup (tf_keras does this itself; Keras 3 with the image's Keras patch 0003).
backup_dir = os.path.join(out_dir, "backup")
first = Epochs()
callbacks = [first,
             keras.callbacks.BackupAndRestore(backup_dir=backup_dir, delete_checkpoint=False),
             keras.callbacks.TensorBoard(log_dir=os.path.join(out_dir, "logs"))]
history = model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch, callbacks=callbacks, verbose=0)
learning_rate = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
iterations = int(keras.ops.convert_to_numpy(model.optimizer.iterations))

# EarlyStopping: no epoch improves the loss by 10, so the fit stops after its second epoch.
stopping = Epochs()
model.fit(dataset, epochs=5, steps_per_epoch=steps_per_epoch, verbose=0,
          callbacks=[stopping, keras.callbacks.EarlyStopping(monitor="loss", min_delta=10, patience=0)])

weights = model.get_weights()
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w, dtype=np.float32).tobytes() for w in weights)).hexdigest()
print("RESULT " + json.dumps({
    "rank": task_index, "workers": num_workers, "epochs_run": first.epochs,
    "losses": [float(v) for v in history.history["loss"]], "learning_rate": learning_rate,
    "iterations": iterations, "backup_files": sorted(os.listdir(backup_dir)),
    "early_stopping_epochs": stopping.epochs, "weights_digest": digest}), flush=True)
