"""MultiWorkerMirroredStrategy with a custom training loop and Keras 3 (`import keras`), in the shape of TensorFlow's
"Custom training loop with Keras and MultiWorkerMirroredStrategy" tutorial. One process per worker, each with its
TF_CONFIG (tfhpc's launchers set it: `launch-local-mwms -n 2 python keras3_mwms_custom_loop.py`, or
`tfhpc-slurm-resolver`-style jobs under srun):

    TF_CONFIG='{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}' \\
        python keras3_mwms_custom_loop.py --epochs 3

Every worker prints one "RESULT {json}" line: the epoch losses and a digest of its weights (equal on all workers).
"""
import argparse
import hashlib
import json
import os

import keras
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps-per-epoch", type=int, default=30)
parser.add_argument("--batch-size", type=int, default=32, help="per worker")
parser.add_argument("--learning-rate", type=float, default=0.05)
args = parser.parse_args()

# MWMS: one strategy per process, before any other TensorFlow operation; TF_CONFIG names the workers.
strategy = tf.distribute.MultiWorkerMirroredStrategy()
workers = strategy.num_replicas_in_sync
task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {"index": 0})["index"]
global_batch = args.batch_size * workers  # MWMS: the dataset yields global batches, each worker gets its share

rng = np.random.default_rng(0)  # the same samples everywhere: the strategy shards them between the workers
x = rng.normal(size=(2048, 16)).astype("float32")
y = (x[:, :8].sum(axis=1) > x[:, 8:].sum(axis=1)).astype("int32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048, seed=1).repeat().batch(global_batch)
# MWMS: split each global batch between the workers.
iterator = iter(strategy.experimental_distribute_dataset(dataset))

# MWMS: variables (the model's and the optimizer's) are created in the strategy's scope, so they are mirrored.
with strategy.scope():
    keras.utils.set_random_seed(task)  # different initial weights per worker: the strategy makes them agree
    model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(learning_rate=args.learning_rate)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


@tf.function
def train_step(iterator):
    def step(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            per_example = loss_fn(labels, model(features, training=True))
            # MWMS: average over the global batch, so that the gradients the strategy sums are the global mean's.
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))  # MWMS: all-reduced across workers
        return loss

    # MWMS: run the step on each worker's share, then add up the per-worker losses.
    return strategy.reduce("SUM", strategy.run(step, args=(next(iterator),)), axis=None)


losses = []
for epoch in range(args.epochs):
    total = sum(float(train_step(iterator)) for _ in range(args.steps_per_epoch))
    losses.append(total / args.steps_per_epoch)
    if task == 0:
        print(f"epoch {epoch + 1}/{args.epochs}: loss {losses[-1]:.4f}", flush=True)

weights = b"".join(np.ascontiguousarray(w, dtype=np.float32).tobytes() for w in model.get_weights())
print("RESULT " + json.dumps({"rank": task, "size": workers, "losses": losses,
                              "weights_digest": hashlib.sha256(weights).hexdigest()}), flush=True)
