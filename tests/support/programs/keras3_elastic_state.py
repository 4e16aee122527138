"""Horovod Elastic's Keras state with a Keras 3 model and optimizer, run by tests/images/app/test_keras3.py under
`horovodrun --gloo` in elastic mode (a host discovery script, one host):

    horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script ./discover \
        python keras3_elastic_state.py KERAS MODE

KERAS: `keras` (import keras) or `tf.keras` (Keras 3 too under TF_USE_LEGACY_KERAS=0). Each rank starts from its own
initial weights; hvd.elastic.run syncs rank 0's state; model.fit runs with horovod.tensorflow.keras.elastic's commit,
batch and epoch callbacks (Horovod's elastic Keras example: `fit(epochs=EPOCHS - state.epoch)`); in epoch 2, after
step 13, every rank fails once:
- MODE restore: the script catches the failure, restores the last commit, puts other values into rank 1's weights
  and epoch, syncs (rank 0's state to every rank) and fits on from state.epoch;
- MODE reset: the failure is HorovodInternalError (as a failed collective raises it): hvd.elastic.run restores the
  last commit, shuts Horovod down, starts it again, syncs and runs the training function again.
Every rank prints one "RESULT {json}" line with what it saw at each point, for the test to compare.
"""
import hashlib
import json
import sys

import numpy as np
import tensorflow as tf

if sys.argv[1] == "tf.keras":
    keras = tf.keras
else:
    import keras
import horovod.tensorflow.keras as hvd
from horovod.common.exceptions import HorovodInternalError

MODE = sys.argv[2]
EPOCHS, STEPS, COMMIT_EVERY, FAIL_AT = 3, 20, 5, (1, 12)  # fails after step 13 of epoch 2; last commit after step 10

hvd.init()
rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(1024, 16)).astype("float32")
y = (x[:, :8].sum(axis=1) > x[:, 8:].sum(axis=1)).astype("int32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)

keras.utils.set_random_seed(hvd.rank())
model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)])
optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.05, momentum=0.9))
model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer=optimizer)


def snapshot(**extra):
    """A digest of the weights and the optimizer's variables (iterations, learning rate, momentums) and more."""
    values = model.get_weights() + [np.asarray(v) for v in optimizer.variables]
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(v).tobytes() for v in values)).hexdigest()
    return {"digest": digest, "iterations": int(optimizer.iterations.numpy()), "optimizer_variables": len(values) - 4,
            "epoch": state.epoch, "batch": state.batch, **extra}


class State(hvd.elastic.KerasState):
    """KerasState that notes what each commit saved."""

    def commit(self):
        super().commit()
        report["commits"].append(snapshot())


class Failure(Exception):
    pass


class FailOnce(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == FAIL_AT and not report["failed"]:
            report["failed"].append(snapshot())
            raise (HorovodInternalError if MODE == "reset" else Failure)(f"injected at epoch, batch {FAIL_AT}")


def fit(callbacks):
    # Horovod's elastic Keras example: the epochs left, counted from 0 (UpdateEpochStateCallback adds state.epoch).
    history = model.fit(dataset, steps_per_epoch=STEPS, epochs=EPOCHS - state.epoch, verbose=0,
                        callbacks=[hvd.elastic.UpdateBatchStateCallback(state),
                                   hvd.elastic.UpdateEpochStateCallback(state),
                                   hvd.elastic.CommitStateCallback(state, batches_per_commit=COMMIT_EVERY), *callbacks])
    report["fits"].append({"initial_epoch": state.epoch - len(history.history["loss"]),
                           "losses": [float(v) for v in history.history["loss"]]})


report = {"rank": hvd.rank(), "size": hvd.size(), "keras": keras.__version__, "mode": MODE, "commits": [],
          "syncs": [], "resets": [], "fits": [], "failed": []}
state = State(model, optimizer, batch=0, epoch=0)
report["initial"] = snapshot()
state.register_reset_callbacks([lambda: report["resets"].append(snapshot(size=hvd.size()))])


@hvd.elastic.run
def train(state):
    report["syncs"].append(snapshot())  # hvd.elastic.run synced the state just before
    try:
        fit([FailOnce()])
    except Failure:
        state.restore()
        report["restored"] = snapshot()
        if hvd.rank() == 1:  # values that the sync must replace by rank 0's
            model.layers[0].kernel.assign(model.layers[0].kernel + 1.0)
            state.epoch = 99
        state.sync()
        report["synced"] = snapshot()
        fit([])


train(state)
report["final"] = snapshot()
print("RESULT " + json.dumps(report), flush=True)
