"""A user's Keras 3 script in the shape of Horovod's TensorFlow 2 example (examples/tensorflow2/tensorflow2_mnist.py;
nothing from tfhpc), with the data sharded by rank and a learning rate that does not grow with the number of ranks:
`import keras` for the model and optimizer, hvd.DistributedGradientTape, the variables broadcast from rank 0 after
the first step. Run it on 2 ranks, then on 1 with twice the batch:

    horovodrun -np 2 python keras3_hvd_custom_loop_sharded.py --batch-size 16 --weights-out two.npz
    python keras3_hvd_custom_loop_sharded.py --batch-size 32 --weights-out one.npz

Rank r takes samples r, r + size, ... in order, so the 2 ranks' batches of a step together are the 1 rank's batch,
and the averaged gradients are its gradients: both runs end with the same weights. Every rank prints one
"RESULT {json}" line; rank 0 writes its final weights to --weights-out.
"""
import argparse
import json

import numpy as np
import tensorflow as tf
import keras
import horovod.tensorflow as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--steps-per-epoch", type=int, default=10)
parser.add_argument("--weights-out")
args = parser.parse_args()

# Horovod: start Horovod (rank, size, the controller) before anything else uses it.
hvd.init()

rng = np.random.default_rng(0)
x = rng.normal(size=(1024, 16)).astype("float32")
y = (x[:, :8].sum(axis=1) > x[:, 8:].sum(axis=1)).astype("int32")
# Horovod: each rank its shard of the samples.
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shard(hvd.size(), hvd.rank()).repeat().batch(args.batch_size)

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
opt = keras.optimizers.SGD(learning_rate=0.1)  # the global batch stays the same: no learning-rate scaling
initial = model.get_weights()


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        probs = model(images, training=True)
        loss_value = loss(labels, probs)

    # Horovod: the wrapped tape averages each gradient over the ranks.
    tape = hvd.DistributedGradientTape(tape)

    grads = tape.gradient(loss_value, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))

    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)

    return loss_value


losses = []
batches = iter(dataset)
for epoch in range(args.epochs):
    epoch_losses = []
    for step in range(args.steps_per_epoch):
        images, labels = next(batches)
        epoch_losses.append(float(training_step(images, labels, epoch == 0 and step == 0)))
    # Horovod: average the epoch loss over the ranks.
    losses.append(float(hvd.allreduce(tf.constant(np.mean(epoch_losses)), name=f"loss_{epoch}")))

weights = model.get_weights()
if hvd.rank() == 0 and args.weights_out:
    np.savez(args.weights_out, **{f"w{i}": w for i, w in enumerate(weights)})
print("RESULT " + json.dumps({
    "rank": hvd.rank(), "size": hvd.size(), "global_batch": args.batch_size * hvd.size(),
    "steps_per_epoch": args.steps_per_epoch, "losses": losses,
    "max_weight_change": max(float(np.abs(a - b).max()) for a, b in zip(weights, initial))}), flush=True)
