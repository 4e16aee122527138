"""TensorFlow's own backup of MultiWorkerMirroredStrategy training (--backup-dir): in Model.fit Keras'
BackupAndRestore callback every --backup-every-steps steps, in a custom loop a tf.train.CheckpointManager in the
callback's layout (LoopBackup); restored when the same command runs again, so that a worker killed without warning
(SIGKILL, out of memory, a node lost) costs at most that many steps. The signal-driven save of preemption.py stays:
with --backup-dir the step at which the workers agreed to stop is backed up as well, and kept.

Keras (tf_keras in the image: TF_USE_LEGACY_KERAS=1) keeps the chief's backup in <dir>/chief as a
tf.train.CheckpointManager checkpoint of the model (with its optimizer), the epoch and the last batch done, restores
it in on_train_begin and continues Model.fit at the next step (tf_keras/src/distribute/worker_training_state.py).
The other workers take part in every save but write to <dir>/workertemp_<n>, deleted at once. Keras restores
whatever matches and checks nothing else: <dir>/chief/tfhpc-backup.json records the flags and the position (workers,
global batch, steps per epoch, seed, shuffle buffer) that the backup's step count refers to, and a run that differs
stops with one line before anything is written.

Imports neither numpy nor TensorFlow: the scripts pass `tf` in.
"""
import json
import shutil
import time
from pathlib import Path

from .errors import fail
from .files import atomic_write_bytes

RECORD = "tfhpc-backup.json"
COUNTERS = ("ckpt_saved_epoch", "ckpt_saved_batch")  # Keras' variables in the backup: epoch index, last batch done


class Backup:
    """The backup directory of one training run: where it resumes, and whether its backup belongs to this run."""

    IDENTITY_FLAGS = ("model", "optimizer", "dataset", "keras")
    POSITION_NAMES = {"workers": "workers", "global_batch": "global batch (--batch-size x replicas)",
                      "steps_per_epoch": "steps per epoch", "seed": "--seed", "shuffle_buffer": "--shuffle-buffer"}

    def __init__(self, directory, writer, every_steps, identity, position):
        self.directory = Path(directory)
        self.chief_dir = self.directory / "chief"  # BackupAndRestore's chief writes here, every worker reads
        self.writer, self.every_steps = writer, every_steps
        self.identity, self.position = dict(identity), dict(position)

    @classmethod
    def for_training(cls, args, writer, workers, global_batch, steps_per_epoch):
        identity = {flag: getattr(args, flag) for flag in cls.IDENTITY_FLAGS if hasattr(args, flag)}
        position = {"workers": workers, "global_batch": global_batch, "steps_per_epoch": steps_per_epoch,
                    "seed": args.seed, "shuffle_buffer": args.shuffle_buffer}
        return cls(args.backup_dir, writer, args.backup_every_steps, identity, position)

    def check_record(self):
        """One line and exit 2 when the backup was written by another kind of run (nothing is touched)."""
        path = self.chief_dir / RECORD
        try:
            record = json.loads(path.read_text())
            identity, position = record["identity"], record["position"]
        except FileNotFoundError:
            fail(f"{self.chief_dir} holds a backup without {RECORD}, so not one of this entrypoint's: give a new "
                 f"--backup-dir, or remove {self.directory} to start afresh")
        except (ValueError, KeyError, TypeError) as error:
            fail(f"{path} is unreadable ({error}): remove {self.directory} to start afresh, or give a new "
                 f"--backup-dir")
        for flag, value in self.identity.items():
            if identity.get(flag, value) != value:
                fail(f"{self.directory} holds a backup of a run with --{flag} {identity[flag]}, not --{flag} {value}: "
                     f"run with --{flag} {identity[flag]} to continue it, or give a new --backup-dir")
        for key, value in self.position.items():
            if position.get(key, value) != value:
                name = self.POSITION_NAMES[key]
                fail(f"{self.directory} holds a backup of a run with {name} {position[key]}, this run has {value}: "
                     f"its step count holds only for the same {name}, so run with {position[key]} to continue it, "
                     f"or give a new --backup-dir (to change the workers, resume an epoch checkpoint: "
                     f"--checkpoint-dir DIR --resume auto)")

    def resume_point(self, tf):
        """(epoch index, steps done in it, checkpoint prefix) at which Model.fit will continue from the newest backup
        (Keras' own rule: the step after the last batch backed up), or (0, 0, None) when there is none."""
        prefix = tf.train.latest_checkpoint(str(self.chief_dir))
        if not prefix:
            return 0, 0, None
        self.check_record()
        try:
            reader = tf.train.load_checkpoint(prefix)
            epoch, batch = (int(reader.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE")) for name in COUNTERS)
        except (tf.errors.OpError, ValueError) as error:
            fail(f"{prefix} is not a readable BackupAndRestore backup ({str(error).strip().splitlines()[0]}): remove "
                 f"{self.directory} to start afresh, or give a new --backup-dir")
        if batch < 0 or batch + 1 >= self.position["steps_per_epoch"]:
            return epoch + 1, 0, prefix
        return epoch, batch + 1, prefix

    def check_restorable(self, tf, checkpoint, prefix):
        """Read the backup into `checkpoint` (a tf.train.Checkpoint; Keras reads the backup again in on_train_begin),
        so that a backup whose variables do not fit stops with one line instead of TensorFlow's traceback or a
        partial restore."""
        try:
            checkpoint.read(prefix).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            fail(f"{prefix} does not fit this model ({reason[:200]}): give a new --backup-dir, or run with the "
                 f"flags of the run that wrote it")

    def write_record(self):
        """The writer records what this run's backups mean, before the first one."""
        if self.writer:
            record = {"identity": self.identity, "position": self.position}
            atomic_write_bytes(self.chief_dir / RECORD, (json.dumps(record) + "\n").encode())

    def report(self, restored, written, first_step):
        """--backup-dir in the RESULT line: the backup restored, the backups written ([epoch, steps done]) and the
        first step trained (epoch, step, the time.time() at its end)."""
        return {"dir": str(self.directory), "every_steps": self.every_steps, "restored_from": restored,
                "written": written, "first_step": first_step}


class LoopBackup:
    """--backup-dir in a custom loop: model, optimizer and BackupAndRestore's two counters written by a
    tf.train.CheckpointManager into the callback's layout (the chief into <dir>/chief, the others into a scratch
    <dir>/workertemp_<rank> deleted after every save), so that Backup reads and checks it as it does Keras' backup.
    Create it in strategy.scope(); call step_done() after every step and finish() when training has ended."""

    def __init__(self, tf, backup, rank, **objects):
        self.backup = backup
        self.epoch = tf.Variable(-1, dtype=tf.int64, trainable=False)
        self.batch = tf.Variable(-1, dtype=tf.int64, trainable=False)
        self.checkpoint = tf.train.Checkpoint(**{COUNTERS[0]: self.epoch, COUNTERS[1]: self.batch}, **objects)
        directory = backup.chief_dir if backup.writer else backup.directory / f"workertemp_{rank}"
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(directory), max_to_keep=1)
        self.written, self.first_step, self.steps = [], None, 0

    def step_done(self, epoch, done, stopping=False):
        """After a step (`done` steps of epoch index `epoch`): a backup every every_steps steps of this run, and
        at the step where the workers agreed to stop."""
        self.steps += 1
        if self.first_step is None:
            self.first_step = {"epoch": epoch, "step": done - 1, "time": time.time()}
        if self.steps % self.backup.every_steps == 0 or stopping:
            self.epoch.assign(epoch)
            self.batch.assign(done - 1)
            self.manager.save()
            if not self.backup.writer:
                shutil.rmtree(self.manager.directory, ignore_errors=True)
            self.written.append((epoch, done))

    def finish(self):
        """Training has ended: the chief deletes the backup, as BackupAndRestore does."""
        if self.backup.writer:
            shutil.rmtree(self.backup.chief_dir, ignore_errors=True)
