"""Keras callbacks of the fit entrypoints and TensorBoard scalars for the custom loops. TensorFlow is passed in as
`tf`; the callback classes are defined once it is imported (keras_callbacks)."""
import argparse
import os
import socket
import time
from pathlib import Path

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
        """Checkpoints.save after every epoch (participate: non-writers also run the save, see Checkpoints)."""

        def __init__(self, checkpoints, checkpoint, participate=False):
            super().__init__()
            self.checkpoints, self.checkpoint, self.participate = checkpoints, checkpoint, participate

        def on_epoch_end(self, epoch, logs=None):
            self.checkpoints.save(self.checkpoint, epoch + 1, participate=self.participate)

    class EpochScalars(tf.keras.callbacks.Callback):
        """Epoch metrics as TensorBoard scalars (ScalarLog), for images without the tensorboard package."""

        def __init__(self, log_dir):
            super().__init__()
            self.log = ScalarLog(tf, log_dir)

        def on_epoch_end(self, epoch, logs=None):
            self.log.write(epoch + 1, logs or {})

        def on_train_end(self, logs=None):
            self.log.close()

    return argparse.Namespace(EpochLog=EpochLog, StepDecay=StepDecay, SaveEachEpoch=SaveEachEpoch,
                              EpochScalars=EpochScalars)


class ScalarLog:
    """Scalars in TensorBoard's format in <log_dir>/train without the tensorboard package (tf.summary needs it): the
    event file is written directly, as TFRecords of Event protocol buffers. Used by the custom loops and, when
    tensorboard is missing, by the fit entrypoints."""

    def __init__(self, tf, log_dir):
        from tensorflow.core.util import event_pb2
        self.event_pb2 = event_pb2
        directory = Path(log_dir) / "train"
        directory.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.v2"
        self.writer = tf.io.TFRecordWriter(str(directory / name))
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def _write(self, event):
        self.writer.write(event.SerializeToString())
        self.writer.flush()

    def write(self, step, values):
        event = self.event_pb2.Event(wall_time=time.time(), step=step)
        for key, value in sorted(values.items()):
            event.summary.value.add(tag=f"epoch_{key}", simple_value=float(value))
        self._write(event)

    def close(self):
        self.writer.close()


def tensorboard_callback(tf, log_dir):
    """Keras' TensorBoard callback (as the IT4Innovations course uses it: scalars, graph, histograms) when the
    tensorboard package is installed, else epoch scalars written without it."""
    import importlib.util
    if importlib.util.find_spec("tensorboard"):
        return tf.keras.callbacks.TensorBoard(log_dir=log_dir, histogram_freq=1)
    return keras_callbacks(tf).EpochScalars(log_dir)
