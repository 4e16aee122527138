"""Horovod with Keras 3 (`import keras`) and a custom training loop, in the shape of Horovod's TensorFlow 2 example
(nothing from tfhpc): the model and optimizer from Keras, each step's gradients averaged by hvd.DistributedGradientTape,
the variables broadcast from rank 0 after the first step. Run it on 2 ranks (shipped at /opt/tfhpc/examples):

    horovodrun -np 2 python keras3_hvd_custom_loop.py        # or mpirun -np 2 ..., srun ...

Every rank prints one "RESULT {json}" line: its epoch losses, a digest of its weights, and how far the allreduce
of its first keras.Variable is from that variable (0 when the ranks agree).
"""
import hashlib
import json

import numpy as np
import tensorflow as tf
import keras
import horovod.tensorflow as hvd

# Horovod: start Horovod (rank, size, the controller) before anything else uses it.
hvd.init()

rng = np.random.default_rng(hvd.rank())  # Horovod: each rank its own samples
x = rng.normal(size=(1024, 16)).astype("float32")
y = (x[:, :8].sum(axis=1) > x[:, 8:].sum(axis=1)).astype("int32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(1024, seed=1).batch(32)

keras.utils.set_random_seed(hvd.rank())  # different initial weights per rank: only the broadcast makes them agree
model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

# Horovod: scale the learning rate by the number of workers.
opt = keras.optimizers.SGD(learning_rate=0.02 * hvd.size())


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        probs = model(images, training=True)
        loss_value = loss(labels, probs)

    # Horovod: the wrapped tape averages each gradient over the ranks.
    tape = hvd.DistributedGradientTape(tape)

    grads = tape.gradient(loss_value, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))

    # Horovod: every rank starts from rank 0's weights and optimizer state. After the first step, when the optimizer
    # has created its variables (Keras 3 creates them on the first apply).
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)

    return loss_value


steps_per_epoch = 30
losses = []
for epoch in range(3):
    epoch_losses = []
    for batch, (images, labels) in enumerate(dataset.skip(epoch * steps_per_epoch).take(steps_per_epoch)):
        epoch_losses.append(float(training_step(images, labels, epoch == 0 and batch == 0)))
    # Horovod: average the epoch loss over the ranks.
    losses.append(float(hvd.allreduce(tf.constant(np.mean(epoch_losses)), name=f"loss_{epoch}")))

weights = model.get_weights()
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w, dtype=np.float32).tobytes() for w in weights)).hexdigest()
kernel = model.trainable_variables[0]
allreduce_gap = float(tf.reduce_max(tf.abs(hvd.allreduce(kernel, name="kernel") - kernel.value)))
print("RESULT " + json.dumps({"rank": hvd.rank(), "size": hvd.size(), "losses": losses, "weights_digest": digest,
                              "allreduce_gap": allreduce_gap}), flush=True)
