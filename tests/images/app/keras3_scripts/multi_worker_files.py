"""What a Keras `fit` on 2 workers writes and reads when the workers share ONE directory: the same user script with
Keras 3 (`import keras`) or tf_keras (`--keras 2`: `import tf_keras as keras`), under MultiWorkerMirroredStrategy
(every worker gets the same paths, as on one worker) or Horovod (its documented form: the callbacks that write files
run on rank 0 only; BackupAndRestore, which every rank needs, gets a directory per rank). Run on 2 workers:

    tfhpc-launch-local-mwms -n 2 python multi_worker_files.py --strategy mwms --keras 3 OUT
    horovodrun -np 2 python multi_worker_files.py --strategy hvd --keras 2 OUT

The features, each a `fit` (or a save) of the same small model, then a barrier, then every worker reads what was
written: ModelCheckpoint (`.keras` every epoch, `.weights.h5` every 4 steps, `save_best_only`), TensorBoard (scalars
and a profile), CSVLogger; BackupAndRestore by epoch (stopped at epoch 2, resumed, `delete_checkpoint`) and by steps
(stopped mid-epoch, resumed, kept); EarlyStopping with `restore_best_weights`; `model.save` +
`keras.saving.load_model` and `model.export` (the tutorial's form: the chief's path, the others' a temporary one).
Every worker prints one "RESULT {json}" line: per feature, the files found, the digests of what it loaded and of its
own weights, the epochs run; at the end, every path left under OUT.
"""
import argparse
import faulthandler
import hashlib
import json
import os
import shutil
import sys
import tempfile

import h5py
import numpy as np

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("out", help="the directory every worker shares")
parser.add_argument("--strategy", choices=["mwms", "hvd"], required=True)
parser.add_argument("--keras", choices=["3", "2"], default="3", help="3: `import keras`; 2: tf_keras")
parser.add_argument("--strict-writes", action="store_true",
                    help="MWMS: fail at the first file a non-chief worker opens for writing at a path of the chief's")
args = parser.parse_args()
faulthandler.enable()  # a crash of TensorFlow's C++ names the Python line it came from
if args.keras == "2":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow is imported: Horovod's tf.keras is then tf_keras

import tensorflow as tf  # noqa: E402

if args.keras == "2":
    import tf_keras as keras  # noqa: E402
else:
    import keras  # noqa: E402

STEPS, BATCH = 8, 16  # steps per epoch, samples per worker and step
rng = np.random.default_rng(0)
x = rng.normal(size=(STEPS * BATCH * 2, 8)).astype("float32")
y = (x @ np.arange(1, 9, dtype="float32")[:, None] / 10).astype("float32")

if args.strategy == "mwms":
    # MWMS: one strategy per process, created before any other TensorFlow operation.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank, size = strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync
    scope = strategy.scope

    def barrier():
        """Every worker has reached this line (an all-reduce of a constant)."""
        strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)

    def data():
        # MWMS: the dataset yields global batches, sharded over the workers.
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH * size), {}
else:
    import contextlib
    import horovod.tensorflow.keras as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    scope = contextlib.nullcontext

    def barrier():
        hvd.allreduce(tf.constant(1.0), name="barrier")

    def data():
        # Horovod: each rank its own samples, its own batches.
        return x[rank::size], {"y": y[rank::size], "batch_size": BATCH, "shuffle": False}

chief = rank == 0
out = args.out
shared_writes = set()  # MWMS: the paths under OUT that this non-chief worker opened for writing (the chief's paths)


def note_write(path):
    """Python's own file opens (an audit hook), h5py's and tf.io.gfile's: a non-chief worker must write only under a
    workertemp_* directory (the patched Keras 3's and tf_keras's private paths) or outside OUT. TensorFlow's C++
    writers (TensorBoard's event files, tf_keras' checkpoints) are counted from the files instead."""
    if args.strategy != "mwms" or chief or not isinstance(path, (str, bytes, os.PathLike)):
        return
    relative = os.path.relpath(os.path.abspath(os.fsdecode(path)), os.path.abspath(out))
    if relative.startswith("..") or "workertemp_" in relative:
        return
    shared_writes.add(relative)
    if args.strict_writes:
        raise RuntimeError(f"worker {rank} writes {relative}, a file the chief writes")


def audit(event, event_args):
    if event == "open" and (any(m in (event_args[1] or "") for m in "wax+")
                            or (event_args[2] or 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)):
        note_write(event_args[0])


sys.addaudithook(audit)


class TracedFile(h5py.File):
    def __init__(self, name, mode="r", *more, **options):
        if mode != "r":
            note_write(name)
        super().__init__(name, mode, *more, **options)


h5py.File = TracedFile  # Keras' HDF5 writers (.weights.h5) look it up at each call


class TracedGFile(tf.io.gfile.GFile):
    def __init__(self, name, mode="r"):
        if "w" in mode or "a" in mode:  # tf_keras reads a .keras file with "r+b"
            note_write(name)
        super().__init__(name, mode)


tf.io.gfile.GFile = tf.compat.v2.io.gfile.GFile = TracedGFile  # tf_keras's CSVLogger writes with it


def build():
    keras.utils.set_random_seed(rank)  # different initial weights per worker: the strategy must make them agree
    with scope():
        model = keras.Sequential([keras.Input(shape=(8,)), keras.layers.Dense(16, activation="tanh"),
                                  keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(learning_rate=0.05)
        if args.strategy == "hvd":
            optimizer = hvd.DistributedOptimizer(optimizer)  # Horovod: average the gradients over the ranks
        model.compile(optimizer=optimizer, loss="mse")
    return model


def digest(model_or_weights):
    weights = model_or_weights if isinstance(model_or_weights, list) else model_or_weights.get_weights()
    return hashlib.sha256(b"".join(np.ascontiguousarray(w, dtype=np.float32).tobytes() for w in weights)).hexdigest()[:16]


def files(path):
    """The paths under `path`, relative to it, sorted (None: `path` does not exist)."""
    if not os.path.exists(path):
        return None
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)


class Stopped(Exception):
    """A job stopped in the middle of a fit."""


class Epochs(keras.callbacks.Callback):
    """The epochs a fit runs, the weights it starts from (after any restore) and those after each step; raises at
    epoch `stop_epoch`, batch `stop_batch` (a job stopped there)."""

    def __init__(self, stop_epoch=None, stop_batch=0):
        super().__init__()
        self.epochs, self.stop_epoch, self.stop_batch, self.epoch = [], stop_epoch, stop_batch, None
        self.start, self.steps, self.epoch_ends = None, [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.epochs.append(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if self.start is None:
            self.start = digest(self.model)
        if self.epoch == self.stop_epoch and batch == self.stop_batch:
            raise Stopped(f"stopped at epoch {self.epoch}, batch {batch}")

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append(digest(self.model))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_ends.append(digest(self.model))


def fit(model, epochs, callbacks):
    inputs, kwargs = data()
    if args.strategy == "hvd":
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), *callbacks]
    return model.fit(inputs, epochs=epochs, steps_per_epoch=STEPS, callbacks=callbacks, verbose=0, **kwargs)


def stopped_fit(model, epochs, callbacks):
    """A fit stopped by its Epochs callback, as a job is by its time limit; then every worker waits for the others
    (a job's restart starts all workers anew)."""
    try:
        fit(model, epochs, callbacks)
    except Stopped:
        pass
    barrier()


def on_chief(callbacks):
    """Horovod's documented form: callbacks that write files on rank 0 only. MWMS: on every worker."""
    return callbacks if args.strategy == "mwms" or chief else []


load_errors = set()


def load(path):
    """keras.saving.load_model(path); where that fails, the error is recorded and the model loaded without its
    optimizer (tf_keras cannot rebuild an optimizer that Horovod wrapped: docs/keras.md)."""
    try:
        return keras.saving.load_model(path)
    except TypeError as error:
        load_errors.add(str(error).split(".")[0])
        return keras.saving.load_model(path, compile=False)


def iterations(model):
    return int(np.asarray(model.optimizer.iterations))


report = {"rank": rank, "size": size, "keras": keras.__version__, "strategy": args.strategy}

# ModelCheckpoint (3 forms), TensorBoard and CSVLogger in one fit of 3 epochs of 8 steps.
model = build()
ckpt = os.path.join(out, "ckpt")
fit(model, 3, on_chief([
    keras.callbacks.ModelCheckpoint(os.path.join(ckpt, "model.keras")),
    keras.callbacks.ModelCheckpoint(os.path.join(ckpt, "steps.weights.h5"), save_weights_only=True, save_freq=4),
    keras.callbacks.ModelCheckpoint(os.path.join(ckpt, "best.keras"), monitor="loss", save_best_only=True),
    # The profiler on the chief only: on both workers of one host, TensorFlow's profiler crashed in stop() now and
    # then with tf_keras ("free(): invalid size", docs/keras.md).
    keras.callbacks.TensorBoard(log_dir=os.path.join(out, "logs"), profile_batch=(2, 3) if chief else 0),
    keras.callbacks.CSVLogger(os.path.join(out, "log.csv")),
]))
barrier()
reference = build()
reference.load_weights(os.path.join(ckpt, "steps.weights.h5"))
logs = files(os.path.join(out, "logs")) or []
with open(os.path.join(out, "log.csv")) as csv_file:
    csv_lines = csv_file.read().splitlines()
report["checkpoint"] = {
    "files": files(ckpt), "weights": digest(model), "iterations": iterations(model),
    "keras_file": digest(load(os.path.join(ckpt, "model.keras"))),
    "weights_file": digest(reference),
    "best_file": digest(load(os.path.join(ckpt, "best.keras"))),
}
report["tensorboard"] = {
    "event_files": len([f for f in logs if "events.out.tfevents" in f]),
    "profiles": len([f for f in logs if f.endswith(".xplane.pb")]),
    "top": sorted(os.listdir(os.path.join(out, "logs"))),
}
report["csv_logger"] = {"lines": csv_lines}
barrier()

# BackupAndRestore by epoch: stopped at the start of epoch 2 of 4, resumed from the chief's state, then deleted.
backup = os.path.join(out, "backup" if args.strategy == "mwms" else f"backup-rank{rank}")
model = build()
stopped = Epochs(stop_epoch=2)
stopped_fit(model, 4, [stopped, keras.callbacks.BackupAndRestore(backup)])
after_stop = files(backup)
model = build()  # a new process would build the model anew
resumed = Epochs()
fit(model, 4, [resumed, keras.callbacks.BackupAndRestore(backup)])
barrier()
report["backup_epoch"] = {"after_stop": after_stop, "backed_up": stopped.epoch_ends[-1], "resumed_from": resumed.start,
                          "epochs": resumed.epochs, "iterations": iterations(model), "weights": digest(model),
                          "after_end": files(backup)}

# BackupAndRestore every 4 steps: stopped at epoch 1, batch 6 (the last backup after step 12), resumed, kept.
backup = os.path.join(out, "backup-steps" if args.strategy == "mwms" else f"backup-steps-rank{rank}")
model = build()
stopped = Epochs(stop_epoch=1, stop_batch=6)
stopped_fit(model, 3, [stopped, keras.callbacks.BackupAndRestore(backup, save_freq=4, delete_checkpoint=False)])
after_stop = files(backup)
model = build()
resumed = Epochs()
fit(model, 3, [resumed, keras.callbacks.BackupAndRestore(backup, save_freq=4, delete_checkpoint=False)])
barrier()
report["backup_steps"] = {"after_stop": after_stop, "backed_up": stopped.steps[11], "resumed_from": resumed.start,
                          "epochs": resumed.epochs, "steps": len(resumed.steps), "iterations": iterations(model),
                          "weights": digest(model), "after_end": files(backup)}

# MWMS, Keras 3: a backup directory per worker (or one on node-local disks) holds the chief's state on the chief only:
# the fit resumed from it must stop at its start, on every worker, with one line. (tf_keras's workers would resume at
# different epochs and wait for each other.)
if args.strategy == "mwms" and args.keras == "3":
    own = os.path.join(out, f"backup-worker{rank}")
    stopped_fit(build(), 4, [Epochs(stop_epoch=2), keras.callbacks.BackupAndRestore(own)])
    try:
        fit(build(), 4, [keras.callbacks.BackupAndRestore(own)])
        report["backup_per_worker"] = None
    except ValueError as error:
        report["backup_per_worker"] = str(error)
    barrier()
    shutil.rmtree(own, ignore_errors=True)

# EarlyStopping with restore_best_weights: no epoch improves the loss by 10, the fit stops after epoch 1 with the
# weights of epoch 0.
model = build()
epochs = Epochs()
best = keras.callbacks.EarlyStopping(monitor="loss", min_delta=10, patience=1, restore_best_weights=True)
fit(model, 5, [epochs, best])
report["early_stopping"] = {"epochs": epochs.epochs, "weights": digest(model), "epoch_0": epochs.epoch_ends[0],
                            "iterations": iterations(model)}


def chief_writes(save, path):
    """TensorFlow's multi-worker tutorial: every worker saves (saving may need them all), the chief to `path`, the
    others to a temporary directory they remove. Horovod's documented form: rank 0 saves alone. Then every worker
    waits until the chief's file is complete."""
    if chief:
        save(path)
    elif args.strategy == "mwms":
        copy = tempfile.mkdtemp()
        save(os.path.join(copy, os.path.basename(path)))
        shutil.rmtree(copy)
    barrier()


# model.save and keras.saving.load_model, model.export and tf.saved_model.load: on every worker, what the chief wrote.
saved = os.path.join(out, "saved.keras")
chief_writes(model.save, saved)
report["save_load"] = {"weights": digest(model), "loaded": digest(load(saved))}
barrier()
exported = os.path.join(out, "exported")
chief_writes(model.export, exported)
reloaded = tf.saved_model.load(exported)  # kept: its functions need its variables
served = reloaded.serve(tf.constant(x[:32]))
report["export"] = {"files": [f for f in files(exported) if not f.startswith("variables/")],
                    "gap": float(np.abs(np.asarray(served) - model.predict(x[:32], verbose=0)).max())}
barrier()
report["left"] = files(out)
report["shared_writes"] = sorted(shared_writes)
report["load_errors"] = sorted(load_errors)
print("RESULT " + json.dumps(report), flush=True)
