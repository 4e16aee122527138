"""Horovod with tf_keras (tf.keras under TF_USE_LEGACY_KERAS=1, Keras 2) and `model.fit`, in the IT4Innovations
course's Horovod workflow (nothing from tfhpc): hvd.DistributedOptimizer, the broadcast and metric-average callbacks,
and Keras' TensorBoard callback on rank 0 only. The image and SIF tests run it unchanged on 2 ranks:

    mpirun -np 2 python tf_keras_hvd_fit_tensorboard.py LOG_DIR

Every rank prints one "RESULT {json}" line.
"""
import json
import sys

import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

hvd.init()
log_dir = sys.argv[1]
rng = np.random.default_rng(hvd.rank())  # each rank its own samples
x = rng.normal(size=(512, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int32")

model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(16, activation="relu"),
                             tf.keras.layers.Dense(2)])
optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=0.05 * hvd.size()))
model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
if hvd.rank() == 0:
    callbacks.append(tf.keras.callbacks.TensorBoard(log_dir=log_dir, histogram_freq=1))
history = model.fit(x, y, batch_size=32, epochs=3, callbacks=callbacks, verbose=0)
losses = [float(v) for v in history.history["loss"]]
print("RESULT " + json.dumps({"rank": hvd.rank(), "size": hvd.size(), "losses": losses}), flush=True)
