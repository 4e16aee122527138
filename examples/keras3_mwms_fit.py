"""MultiWorkerMirroredStrategy with Keras 3 (`import keras`) and `model.fit`, in the shape of TensorFlow's
"Multi-worker training with Keras" tutorial (nothing from tfhpc; shipped at /opt/tfhpc/examples): the strategy from
TF_CONFIG, the model built and compiled in `strategy.scope()`, a tf.data pipeline of the global batch, a `.keras`
ModelCheckpoint given the same path on every worker (the image's Keras writes it from the chief only), then
evaluate and predict. Run one process per worker, each with its
TF_CONFIG (`tfhpc-launch-local-mwms -n 2 python keras3_mwms_fit.py OUT_DIR` sets it on one node):

    TF_CONFIG='{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}' \
        python keras3_mwms_fit.py OUT_DIR

Every worker prints one "RESULT {json}" line: its losses, a digest of its weights, evaluate's and predict's results;
the chief also reloads its checkpoint and reports whether the reloaded weights equal the trained ones.
"""
import hashlib
import json
import os
import sys

import numpy as np
import tensorflow as tf
import keras

out_dir = sys.argv[1]
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])
task_index = tf_config["task"]["index"]

# MWMS: one strategy per process, created before any other TensorFlow operation.
strategy = tf.distribute.MultiWorkerMirroredStrategy()

per_worker_batch_size = 32
global_batch_size = per_worker_batch_size * num_workers  # MWMS: the dataset yields global batches
rng = np.random.default_rng(0)  # the same samples on every worker: tf.data shards them
x = rng.normal(size=(2048, 16)).astype("float32")
y = (x[:, :8].sum(axis=1) > x[:, 8:].sum(axis=1)).astype("int32")


def dataset(batch_size):
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048, seed=1).repeat().batch(batch_size)


def build_and_compile_model():
    keras.utils.set_random_seed(task_index)  # different initial weights per worker: MWMS must make them agree
    model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(learning_rate=0.05), metrics=["accuracy"])
    return model


# MWMS: model and optimizer variables are created in the strategy's scope.
with strategy.scope():
    multi_worker_model = build_and_compile_model()


# MWMS: every worker saves, the same path on every worker: the chief writes it, the others a copy they remove (tf_keras
# does this itself; Keras 3 with the image's Keras patch 0003).
checkpoint = os.path.join(out_dir, "model.keras")
callbacks = [keras.callbacks.ModelCheckpoint(checkpoint)]
history = multi_worker_model.fit(dataset(global_batch_size), epochs=3, steps_per_epoch=30, callbacks=callbacks,
                                 verbose=0)

evaluation = multi_worker_model.evaluate(dataset(global_batch_size).take(8), verbose=0, return_dict=True)
predictions = multi_worker_model.predict(tf.data.Dataset.from_tensor_slices(x[:256]).batch(global_batch_size),
                                         verbose=0)


def digest(weights):
    return hashlib.sha256(b"".join(np.ascontiguousarray(w, dtype=np.float32).tobytes() for w in weights)).hexdigest()


weights = multi_worker_model.get_weights()
report = {"rank": task_index, "workers": num_workers, "keras": keras.__version__,
          "losses": [float(v) for v in history.history["loss"]],
          "accuracy": float(history.history["accuracy"][-1]),
          "weights_digest": digest(weights), "weights_sum": float(sum(float(np.sum(w)) for w in weights)),
          "evaluate": {key: float(value) for key, value in evaluation.items()},
          "predict_shape": list(predictions.shape),
          "predict_accuracy": float(np.mean(np.argmax(predictions, axis=1) == y[:256]))}
if task_index == 0:
    reloaded = keras.models.load_model(checkpoint)
    report["reloaded_digest"] = digest(reloaded.get_weights())
    report["reloaded_optimizer"] = type(reloaded.optimizer).__name__
print("RESULT " + json.dumps(report), flush=True)
