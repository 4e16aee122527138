"""A user's Keras 3 script in the shape of Horovod's Keras example (examples/tensorflow2/tensorflow2_keras_mnist.py
with the warm-up and schedule of examples/keras/keras_imagenet_resnet50.py; nothing from tfhpc): `import keras` for
the model and optimizer, horovod.tensorflow.keras for the DistributedOptimizer, the broadcast, metric-average,
learning-rate warm-up and schedule callbacks, the model saved as `.keras` by rank 0, loaded with hvd.load_model
on every rank and trained on.
Run it on 2 ranks:

    horovodrun -np 2 python keras3_hvd_keras_callbacks.py OUT_DIR

Every rank prints one "RESULT {json}" line: the learning rate at the end of each epoch, its weights' digest, what
hvd.load_model returned and the digest of the loaded model's weights after one more epoch (each rank its own
samples: equal on the ranks only if the loaded optimizer averages the gradients).
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

rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(1024, 16)).astype("float32")
y = (x[:, :8].sum(axis=1) > x[:, 8:].sum(axis=1)).astype("int32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(1024, seed=1).batch(32)

keras.utils.set_random_seed(hvd.rank())
model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])

# Horovod: the averaged gradient of N ranks is as noisy as one batch N times larger: scale the rate.
scaled_lr = 0.02 * hvd.size()
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=scaled_lr, momentum=0.9))
model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer=opt,
              metrics=["accuracy"])


class LearningRates(keras.callbacks.Callback):
    """The optimizer's learning rate at the end of each epoch."""

    def __init__(self):
        super().__init__()
        self.values = []

    def on_epoch_end(self, epoch, logs=None):
        self.values.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


learning_rates = LearningRates()
callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    # Horovod: the learning rate grows from scaled_lr / size to scaled_lr over the first 2 epochs...
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2, steps_per_epoch=30),
    # ... stays there for epoch 2, then is divided by 10 from epoch 3.
    hvd.callbacks.LearningRateScheduleCallback(initial_lr=scaled_lr, start_epoch=2, end_epoch=3, multiplier=1.),
    hvd.callbacks.LearningRateScheduleCallback(initial_lr=scaled_lr, start_epoch=3, multiplier=lambda epoch: 1e-1),
    learning_rates,
]
history = model.fit(dataset, steps_per_epoch=30, callbacks=callbacks, epochs=4, verbose=0)

weights = model.get_weights()
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w, dtype=np.float32).tobytes() for w in weights)).hexdigest()
report = {"rank": hvd.rank(), "size": hvd.size(), "losses": [float(v) for v in history.history["loss"]],
          "learning_rates": learning_rates.values, "weights_digest": digest}
# Horovod: save the model on worker 0 only.
path = os.path.join(out_dir, "model.keras")
if hvd.rank() == 0:
    model.save(path)
hvd.allreduce(tf.constant(0.0), name="saved")  # every rank waits for the file

# Horovod: every rank loads the model with its optimizer wrapped in a DistributedOptimizer again, and trains on.
loaded = hvd.load_model(path)
report["loaded_optimizer"] = type(loaded.optimizer).__module__ + "." + type(loaded.optimizer).__name__
report["loaded_distributed"] = type(loaded.optimizer) is not keras.optimizers.SGD
report["loaded_iterations"] = int(loaded.optimizer.iterations.numpy())
report["loaded_learning_rate"] = float(loaded.optimizer.learning_rate.numpy())
report["loaded_equal"] = all(np.array_equal(a, b) for a, b in zip(weights, loaded.get_weights()))
loaded.fit(dataset, steps_per_epoch=30, epochs=1, verbose=0)
report["trained_on_digest"] = hashlib.sha256(
    b"".join(np.ascontiguousarray(w, dtype=np.float32).tobytes() for w in loaded.get_weights())).hexdigest()
print("RESULT " + json.dumps(report), flush=True)
