"""A user's Keras 3 script in the shape of TensorFlow's "Custom training loop with Keras and
MultiWorkerMirroredStrategy" tutorial (nothing from tfhpc): `import keras` for the model and optimizer,
MultiWorkerMirroredStrategy from TF_CONFIG (one worker without it), the dataset from
`distribute_datasets_from_function` (each worker its shard, each its per-worker batch), the loss averaged over the
global batch, `strategy.run` of a tf.function step. Run one process per worker, each with its TF_CONFIG:

    TF_CONFIG='{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}' \
        python keras3_mwms_custom_loop_sharded.py --batch-size 16 --weights-out weights.npz

2 workers with --batch-size 16 train as 1 worker with --batch-size 32: the same samples in each step, the same
initial weights, the gradients averaged over the global batch. Every worker prints one "RESULT {json}" line; the chief
writes its final weights to --weights-out.
"""
import argparse
import json
import os

import numpy as np
import tensorflow as tf
import keras

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32, help="per worker")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--steps-per-epoch", type=int, default=10)
parser.add_argument("--weights-out")
args = parser.parse_args()

tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
num_workers = len(tf_config.get("cluster", {}).get("worker", [None]))
task_index = tf_config.get("task", {}).get("index", 0)

strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch_size = args.batch_size * num_workers

rng = np.random.default_rng(0)
x = rng.normal(size=(1024, 16)).astype("float32")
y = (x[:, :8].sum(axis=1) > x[:, 8:].sum(axis=1)).astype("int32")


def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024, seed=1).repeat()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.batch(batch_size)


with strategy.scope():
    keras.utils.set_random_seed(0)  # the same initial weights whatever the number of workers
    model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(learning_rate=0.1)
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
initial = model.get_weights()


@tf.function
def train_step(iterator):
    def step_fn(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(features, training=True)
            per_example_loss = loss_object(labels, predictions)
            loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
losses = []
for epoch in range(args.epochs):
    total = 0.0
    for step in range(args.steps_per_epoch):
        total += float(train_step(iterator))
    losses.append(total / args.steps_per_epoch)

weights = model.get_weights()
if task_index == 0 and args.weights_out:
    np.savez(args.weights_out, **{f"w{i}": w for i, w in enumerate(weights)})
print("RESULT " + json.dumps({
    "rank": task_index, "workers": num_workers, "global_batch": global_batch_size,
    "steps_per_epoch": args.steps_per_epoch, "losses": losses,
    "max_weight_change": max(float(np.abs(a - b).max()) for a, b in zip(weights, initial))}), flush=True)
