"""Keras callbacks of the fit entrypoints, Keras' TensorBoard callback with the profiler, and the profiler window of
the custom loops. TensorFlow is passed in as `tf`; the callback classes are defined once it is imported
(keras_callbacks)."""
import argparse
import time

from .cli import log


def keras_callbacks(tf):
    """Keras callbacks the fit entrypoints share (defined once TensorFlow is imported)."""

    class EpochLog(tf.keras.callbacks.Callback):
        """The Lablup course's PrintLR: the learning rate at the end of each epoch, recorded in the history and
        printed."""

        def __init__(self, chief):
            super().__init__()
            self.chief = chief

        def on_epoch_end(self, epoch, logs=None):
            lr = float(tf.keras.backend.get_value(self.model.optimizer.learning_rate))
            if logs is not None:
                logs["lr_at_end"] = lr
            log(self.chief, f"learning rate at the end of epoch {epoch + 1}: {lr:.6g}")

    class StepDecay(tf.keras.callbacks.Callback):
        """The Lablup course's decay(): the learning rate divided by 10 at each listed epoch (after any warm-up)."""

        def __init__(self, lr, epochs, warmup=0):
            super().__init__()
            self.lr, self.epochs, self.warmup = lr, epochs, warmup

        def on_epoch_begin(self, epoch, logs=None):
            if epoch >= self.warmup:
                self.model.optimizer.learning_rate.assign(self.lr * 0.1 ** sum(epoch >= e for e in self.epochs))

    class SaveEachEpoch(tf.keras.callbacks.Callback):
        """Checkpoints.save after every epoch (participate: non-writers also run the save, see Checkpoints), except
        an epoch a signal cut short (Keras still ends it with on_epoch_end): SaveOnSignal saved that one."""

        def __init__(self, checkpoints, checkpoint, participate=False, stop=None):
            super().__init__()
            self.checkpoints, self.checkpoint, self.participate, self.stop = checkpoints, checkpoint, participate, stop

        def on_epoch_end(self, epoch, logs=None):
            if not (self.stop and self.stop.at):
                self.checkpoints.save(self.checkpoint, epoch + 1, participate=self.participate)

    class SaveOnSignal(tf.keras.callbacks.Callback):
        """preemption.StopOnSignal in Model.fit: after every batch the ranks agree whether one was signalled; if so,
        a checkpoint of this step and model.stop_training. first_step: steps of the first epoch done before this
        fit (a run resumed mid-epoch)."""

        def __init__(self, stop, checkpoints, checkpoint, participate=False, first_step=0):
            super().__init__()
            self.stop, self.checkpoints, self.checkpoint = stop, checkpoints, checkpoint
            self.participate, self.first_step, self.epoch = participate, first_step, 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            done = self.first_step + batch + 1
            if self.stop.requested(self.epoch, done):
                self.checkpoints.save(self.checkpoint, self.epoch, done, participate=self.participate)
                self.model.stop_training = True

    class BackupEverySteps(tf.keras.callbacks.BackupAndRestore):
        """Keras' BackupAndRestore every backup.every_steps steps into backup.directory (backup.Backup), plus a backup
        of the step at which a signal stopped the workers (StopOnSignal `stop`; list this callback after
        SaveOnSignal), kept for the next run; the backup of a run that ends is deleted. Records for the RESULT line
        the backups written and the first step this run trained (epoch, step, wall-clock time at its end)."""

        def __init__(self, backup, stop):
            super().__init__(str(backup.directory), save_freq=backup.every_steps)
            self.stop, self.epoch, self.written, self.first_step = stop, 0, [], None

        def _backup(self, epoch, batch=0):  # Keras' own hook for every backup
            super()._backup(epoch=epoch, batch=batch)
            self.written.append((int(epoch), int(batch) + 1))

        def on_epoch_begin(self, epoch, logs=None):
            super().on_epoch_begin(epoch, logs)
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            super().on_train_batch_end(batch, logs)
            if self.stop.at and self.written[-1:] != [(int(self.epoch), int(batch) + 1)]:
                self._backup(epoch=self.epoch, batch=batch)
            if self.first_step is None:
                self.first_step = {"epoch": int(self.epoch), "step": int(batch), "time": time.time()}

        def on_train_end(self, logs=None):
            self.delete_checkpoint = not self.stop.at
            super().on_train_end(logs)

    class BackupSteps(tf.keras.callbacks.Callback):
        """--backup-dir with Keras 3, whose BackupAndRestore restores the epoch but not the step: backup.LoopBackup
        (model, optimizer and the two counters, in tf_keras' layout) every backup.every_steps steps and at the step
        at which a signal stopped the workers (list it after SaveOnSignal). Every worker takes part. first_step:
        steps of the first epoch done before this fit."""

        def __init__(self, loop_backup, stop, first_step=0):
            super().__init__()
            self.loop_backup, self.stop, self.first_step, self.epoch = loop_backup, stop, first_step, 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            self.loop_backup.step_done(int(self.epoch), self.first_step + batch + 1, stopping=bool(self.stop.at))

        def on_epoch_end(self, epoch, logs=None):
            self.first_step = 0

    class StepLog(tf.keras.callbacks.Callback):
        """--log-steps: 'epoch E/EPOCHS step S/STEPS' every `every` steps."""

        def __init__(self, every, epochs, steps, first_step=0):
            super().__init__()
            self.every, self.epochs, self.steps, self.first_step, self.epoch = every, epochs, steps, first_step, 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            log_step(True, self.every, self.epoch, self.epochs, self.first_step + batch + 1, self.steps)

    class ShiftBatches(tf.keras.callbacks.Callback):
        """Hands `inner` the batch numbers of the whole epoch in a fit that resumes `offset` steps into it (Horovod's
        warm-up computes the learning rate from the batch number)."""

        def __init__(self, inner, offset):
            super().__init__()
            self.inner, self.offset = inner, offset

        def set_model(self, model):
            super().set_model(model)
            self.inner.set_model(model)

        def set_params(self, params):
            super().set_params(params)
            self.inner.set_params(params)

        def on_train_begin(self, logs=None):
            self.inner.on_train_begin(logs)

        def on_epoch_begin(self, epoch, logs=None):
            self.inner.on_epoch_begin(epoch, logs)

        def on_train_batch_begin(self, batch, logs=None):
            self.inner.on_train_batch_begin(batch + self.offset, logs)

        def on_train_batch_end(self, batch, logs=None):
            self.inner.on_train_batch_end(batch + self.offset, logs)

        def on_epoch_end(self, epoch, logs=None):
            self.inner.on_epoch_end(epoch, logs)

        def on_train_end(self, logs=None):
            self.inner.on_train_end(logs)

    return argparse.Namespace(EpochLog=EpochLog, StepDecay=StepDecay, SaveEachEpoch=SaveEachEpoch,
                              SaveOnSignal=SaveOnSignal, BackupEverySteps=BackupEverySteps, BackupSteps=BackupSteps,
                              StepLog=StepLog,
                              ShiftBatches=ShiftBatches)


def elastic_callbacks(tf, commit_state_callback=None):
    """The fit entrypoint's progress kept in a state object (Record), and with Horovod Elastic the commit of that state
    (Commit, from Horovod's CommitStateCallback, passed in as commit_state_callback)."""

    class Record(tf.keras.callbacks.Callback):
        """After every batch the samples done in the epoch, after every epoch its averaged metrics and the next epoch,
        in `state`; each step's end in `timeline`. Horovod's UpdateEpochStateCallback and UpdateBatchStateCallback
        record Keras' epoch counter of a fit restarted from 0 and the index of the last batch; the fits here keep the
        absolute epoch (initial_epoch) and may continue mid-epoch with another number of ranks, so samples are
        counted instead."""

        def __init__(self, state, global_batch, first_step, timeline, ranks):
            super().__init__()
            self.state, self.global_batch, self.first_step = state, global_batch, first_step
            self.timeline, self.ranks = timeline, ranks

        def on_train_batch_end(self, batch, logs=None):
            self.state.samples = (self.first_step + batch + 1) * self.global_batch
            self.timeline.step(self.ranks)

        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}
            self.state.losses = self.state.losses + [float(logs["loss"])]
            self.state.accuracies = self.state.accuracies + [float(logs["accuracy"])]
            self.state.learning_rates = self.state.learning_rates + [float(logs["lr_at_end"])]
            self.state.epoch, self.state.samples, self.first_step = epoch + 1, 0, 0

    callbacks = argparse.Namespace(Record=Record)
    if commit_state_callback:
        class Commit(commit_state_callback):
            """Horovod's commit every N batches and at each epoch's end, except after an epoch's last batch: the
            epoch's end commits once Record has its metrics, so that a reset never resumes between an epoch's last
            step and its end."""

            def on_batch_end(self, batch, logs=None):
                if batch + 1 < self.params["steps"]:
                    super().on_batch_end(batch, logs)

        callbacks.Commit = Commit
    return callbacks


def log_step(enabled, every, epoch, epochs, done, steps):
    """--log-steps: one line every `every` steps (done: steps done in epoch index `epoch`)."""
    if enabled and every and done % every == 0:
        log(True, f"epoch {epoch + 1}/{epochs} step {done}/{steps}")


def tensorboard_callback(tf, log_dir, profile_steps=None):
    """Keras' TensorBoard callback as the IT4Innovations course uses it (epoch scalars, graph, weight histograms) in
    <log_dir>/train, and with profile_steps (A, B) a profiler trace of this run's steps A to B (counted from 1) in
    <log_dir>/plugins/profile (tf_keras) or <log_dir>/train/plugins/profile (Keras 3): TensorBoard's profile plugin
    finds either."""
    return tf.keras.callbacks.TensorBoard(log_dir=log_dir, histogram_freq=1, profile_batch=profile_steps or 0)


class ProfileWindow:
    """The TensorFlow profiler over steps A to B of a custom loop, counted from 1 in this run as Keras' profile_batch
    counts them: begin(step) before a step, end(step) after it, close() after the loop. The trace goes to
    <log_dir>/plugins/profile/<time>/, where TensorBoard's profile plugin looks. Without steps it does nothing (the
    ranks that do not log)."""

    def __init__(self, tf, log_dir, steps=None):
        self.tf, self.log_dir = tf, log_dir
        self.first, self.last = steps or (0, 0)
        self.running = False

    def begin(self, step):
        if step == self.first:
            self.tf.profiler.experimental.start(self.log_dir)
            self.running = True

    def end(self, step):
        if self.running and step >= self.last:
            self.close()

    def close(self):
        if self.running:
            self.tf.profiler.experimental.stop()
            self.running = False
