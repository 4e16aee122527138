"""Per-epoch checkpoints that a killed job never leaves half-written, --resume from the latest one, and the
SavedModel export."""
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from .cli import fail
from .files import UMASK, atomic_write_bytes


class Checkpoints:
    """Per-epoch checkpoints of model + optimizer + epoch in <dir>/epoch-NNNN/, plus <dir>/latest.json.

    Only the writer (rank 0 / chief) writes there. A checkpoint is first written into a hidden temporary directory
    beside it and then renamed into place, and latest.json is replaced atomically afterwards: a job killed at any
    moment leaves the previous checkpoint intact and never a half-written one that --resume would pick up.
    Non-writers under MultiWorkerMirroredStrategy still take part in the save (it may need collectives) but write to
    a private temporary directory that is deleted at once (TensorFlow's documented pattern).
    """

    # What a checkpoint must match to be resumed: another --model or --optimizer gives other variables (a traceback
    # from TensorFlow, or a silent partial restore), another --dataset other batches.
    IDENTITY_FLAGS = ("model", "optimizer", "dataset")

    def __init__(self, directory, writer, keep=2, args=None):
        self.directory = Path(directory) if directory else None
        self.writer = writer
        self.keep = keep
        self.written = []
        self.identity = {flag: getattr(args, flag) for flag in self.IDENTITY_FLAGS if hasattr(args, flag)}

    def latest(self):
        """(epoch, checkpoint prefix) of the latest complete checkpoint, or (0, None)."""
        if not self.directory:
            return 0, None
        try:
            record = json.loads((self.directory / "latest.json").read_text())
            prefix = self.directory / record["path"]
        except FileNotFoundError:
            return 0, None
        except (ValueError, KeyError) as error:
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
        return int(record["epoch"]), str(prefix)

    def save(self, checkpoint, epoch, participate=False):
        """checkpoint: a tf.train.Checkpoint; epoch: number of completed epochs."""
        if not self.directory:
            return
        if not self.writer:
            if participate:
                scratch = tempfile.mkdtemp(prefix="tfhpc-ckpt-")
                try:
                    checkpoint.write(os.path.join(scratch, "ckpt"))
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"epoch-{epoch:04d}"
        temporary = Path(tempfile.mkdtemp(dir=self.directory, prefix=f".{name}.", suffix=".tmp"))
        try:
            os.chmod(temporary, 0o777 & ~UMASK)
            checkpoint.write(str(temporary / "ckpt"))
            final = self.directory / name
            if final.exists():
                shutil.rmtree(final)
            os.rename(temporary, final)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        record = {"epoch": epoch, "path": f"{name}/ckpt", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "identity": self.identity}
        atomic_write_bytes(self.directory / "latest.json", (json.dumps(record) + "\n").encode())
        self.written.append(name)
        for old in sorted(self.directory.glob("epoch-[0-9][0-9][0-9][0-9]"))[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)


def export_saved_model(model, directory, writer):
    """SavedModel export, as the Lablup course ends its training. Every MWMS worker must take part in the save; the
    writer saves into a hidden temporary directory that is then renamed to `directory`, the others into a private one
    that is deleted."""
    if not writer:
        scratch = tempfile.mkdtemp(prefix="tfhpc-export-")
        try:
            model.save(os.path.join(scratch, "model"), save_format="tf")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None
    final = Path(directory).resolve()
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        os.chmod(temporary, 0o777 & ~UMASK)
        model.save(str(temporary), save_format="tf")
        previous = final.with_name(f".{final.name}.old-{os.getpid()}")
        if final.exists():
            os.rename(final, previous)
        os.rename(temporary, final)
        shutil.rmtree(previous, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return str(final)
