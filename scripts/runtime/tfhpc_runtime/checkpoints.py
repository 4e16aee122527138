"""Epoch and mid-epoch checkpoints that a killed job never leaves half-written, --resume from the newest one, and the
SavedModel export."""
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from .errors import fail
from .files import UMASK, atomic_write_bytes
from .model import keras_major


class Checkpoints:
    """Checkpoints of model + optimizer in <dir>/epoch-NNNN/ (after NNNN epochs) or <dir>/epoch-NNNN-step-SSSSSS/
    (SSSSSS steps into the next epoch, written when a signal stops the run), plus <dir>/latest.json.

    Only the writer (rank 0 / chief) writes there. A checkpoint is first written into a hidden temporary directory
    beside it and then renamed into place, and latest.json is replaced atomically afterwards: a job killed at any
    moment, also during the write, leaves the previous checkpoint intact and never a half-written one that --resume
    would pick up. Non-writers under MultiWorkerMirroredStrategy still take part in the save (it may need collectives)
    but write to a private temporary directory that is deleted at once (TensorFlow's documented pattern).

    The data position of a mid-epoch checkpoint is (epoch, step): every epoch's order is a function of (--seed,
    epoch) alone (data.train_dataset) and the models draw no random numbers while training, so (seed, epoch, step)
    is the whole random state. It holds only for the same ranks, batch, steps per epoch, seed and shuffle buffer
    (`position`), which latest.json records and a mid-epoch resume must match.
    """

    # What a checkpoint must match to be resumed: another --model or --optimizer gives other variables (a traceback
    # from TensorFlow, or a silent partial restore), another --dataset other batches.
    IDENTITY_FLAGS = ("model", "optimizer", "dataset", "keras")  # keras: each writes its own variables
    # How a position recorded in latest.json is named in the one-line error.
    POSITION_NAMES = {"ranks": "ranks", "global_batch": "global batch (--batch-size x ranks)",
                      "steps_per_epoch": "steps per epoch", "seed": "--seed", "shuffle_buffer": "--shuffle-buffer"}

    def __init__(self, directory, writer, keep=2, args=None, position=None):
        self.directory = Path(directory) if directory else None
        self.writer = writer
        self.keep = keep
        self.written = []
        self.identity = {flag: getattr(args, flag) for flag in self.IDENTITY_FLAGS if hasattr(args, flag)}
        self.position = dict(position or {})

    @classmethod
    def for_training(cls, args, writer, ranks, global_batch, steps_per_epoch):
        """The training entrypoints' checkpoints: --checkpoint-dir, --keep-checkpoints, and this run's position."""
        position = {"ranks": ranks, "global_batch": global_batch, "steps_per_epoch": steps_per_epoch,
                    "seed": args.seed, "shuffle_buffer": args.shuffle_buffer}
        return cls(args.checkpoint_dir, writer, keep=args.keep_checkpoints, args=args, position=position)

    def latest(self):
        """(completed epochs, steps done in the next epoch, checkpoint prefix) of the newest complete checkpoint,
        or (0, 0, None) when there is none."""
        if not self.directory:
            return 0, 0, None
        try:
            record = json.loads((self.directory / "latest.json").read_text())
            prefix = self.directory / record["path"]
            epoch, step = int(record["epoch"]), int(record.get("step", 0))
        except FileNotFoundError:
            return 0, 0, None
        except (ValueError, KeyError, TypeError) as error:
            fail(f"{self.directory / 'latest.json'} is unreadable ({error}): remove it to start afresh or "
                 f"point --checkpoint-dir at another run")
        if not Path(str(prefix) + ".index").is_file():
            fail(f"{self.directory / 'latest.json'} names {prefix}, which is missing: restore the directory or "
                 f"drop --resume")
        for flag, value in self.identity.items():
            written = record.get("identity", {}).get(flag, value)
            if written != value:
                fail(f"{self.directory} holds a checkpoint written with --{flag} {written}, not --{flag} {value}: "
                     f"resume with --{flag} {written}, or give a new --checkpoint-dir")
        if step:
            for key, value in self.position.items():
                written = record.get("position", {}).get(key, value)
                if written != value:
                    name = self.POSITION_NAMES.get(key, key)
                    fail(f"{self.directory} holds a checkpoint taken {step} step(s) into epoch {epoch + 1} with "
                         f"{name} {written}, this run has {value}: a mid-epoch position holds only for the same "
                         f"{name}, so resume with {written} to finish that epoch (epoch checkpoints resume with any), "
                         f"or give a new --checkpoint-dir")
        return epoch, step, str(prefix)

    def save(self, checkpoint, epoch, step=0, participate=False):
        """checkpoint: a tf.train.Checkpoint; epoch: completed epochs; step: steps done in the next epoch."""
        if not self.directory:
            return
        steps = self.position.get("steps_per_epoch")
        if steps and step >= steps:  # stopped after an epoch's last step: that is the epoch checkpoint
            epoch, step = epoch + step // steps, step % steps
        if not self.writer:
            if participate:
                scratch = tempfile.mkdtemp(prefix="tfhpc-ckpt-")
                try:
                    checkpoint.write(os.path.join(scratch, "ckpt"))
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
            return
        name = f"epoch-{epoch:04d}" + (f"-step-{step:06d}" if step else "")
        temporary = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for stale in self.directory.glob(".epoch-*.tmp"):  # left by a writer killed during its write
                shutil.rmtree(stale, ignore_errors=True)
            temporary = Path(tempfile.mkdtemp(dir=self.directory, prefix=f".{name}.", suffix=".tmp"))
            os.chmod(temporary, 0o777 & ~UMASK)
            checkpoint.write(str(temporary / "ckpt"))
            final = self.directory / name
            if final.exists():
                shutil.rmtree(final)
            os.rename(temporary, final)
            temporary = None
            record = {"epoch": epoch, "step": step, "path": f"{name}/ckpt",
                      "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "identity": self.identity,
                      "position": self.position}
            atomic_write_bytes(self.directory / "latest.json", (json.dumps(record) + "\n").encode())
        except Exception as error:  # noqa: BLE001 - OSError, or TensorFlow's errors from checkpoint.write
            if temporary:
                shutil.rmtree(temporary, ignore_errors=True)
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            fail(f"cannot write checkpoint {name} into {self.directory} ({reason}): the previous checkpoint is "
                 f"intact; make the directory writable (or free space) and resume", everyone=True)
        self.written.append(name)
        for old in sorted(self.directory.glob("epoch-[0-9][0-9][0-9][0-9]*"))[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)


def save_saved_model(model, path):
    """A SavedModel for serving: Keras 3's model.export (its model.save writes .keras files only), tf_keras'
    model.save in the "tf" format."""
    if keras_major(model) >= 3:
        model.export(path, verbose=False)
    else:
        model.save(path, save_format="tf")


def export_saved_model(model, directory, writer):
    """SavedModel export, as the Lablup course ends its training. Every MWMS worker must take part in the save; the
    writer saves into a hidden temporary directory that is then renamed to `directory`, the others into a private one
    that is deleted."""
    if not writer:
        scratch = tempfile.mkdtemp(prefix="tfhpc-export-")
        try:
            save_saved_model(model, os.path.join(scratch, "model"))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None
    final = Path(directory).resolve()
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        os.chmod(temporary, 0o777 & ~UMASK)
        save_saved_model(model, str(temporary))
        previous = final.with_name(f".{final.name}.old-{os.getpid()}")
        if final.exists():
            os.rename(final, previous)
        os.rename(temporary, final)
        shutil.rmtree(previous, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return str(final)
