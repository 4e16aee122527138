"""Save and stop on SIGUSR1 and SIGTERM: the signal the shipped Slurm job scripts forward ahead of the time limit
(#SBATCH --signal=B:USR1@...) and the one Slurm sends at the limit or on preemption.

The handler only records the signal. At every step boundary all ranks add up their records in one scalar collective
(`agree`: Horovod's allreduce, MultiWorkerMirroredStrategy's reduce), so every rank learns at the same step that one
of them was signalled and none is left waiting in a collective. The chief then writes a step-level checkpoint, and
every rank exits with SAVED_AND_STOPPED, which the job scripts turn into a requeue; `--resume auto` continues there.

Imports neither numpy nor TensorFlow: the scripts pass `agree` in.
"""
import signal
import sys
import time

from .cli import report

SAVED_AND_STOPPED = 99  # exit status of every rank after a signal-driven checkpoint; the job scripts requeue on it
STOP_SIGNALS = ("SIGUSR1", "SIGTERM")


class StopOnSignal:
    """Records SIGUSR1/SIGTERM; requested() is the ranks' common answer, exit() ends every rank alike.

    Create it first thing, so that a signal during start-up is recorded too. agree (set once the framework runs):
    float -> float, the sum over all ranks of the value each passes; a collective, so every rank must call
    requested() at the same steps (after every step in the entrypoints)."""

    def __init__(self, agree=None):
        self.agree = agree
        self.signal = None  # name of the first signal received by this rank
        self.received = None  # time.monotonic() when it arrived
        self.steps_since_signal = 0  # steps this rank finished between the signal and the ranks' agreement
        self.at = None  # (epoch index, steps done in it) at which the ranks stopped
        self.end = None  # (last epoch index, steps per epoch): a signal after the last step lets the run finish
        for name in STOP_SIGNALS:
            signal.signal(getattr(signal, name), self._record)

    def _record(self, number, frame):
        if self.signal is None:
            self.signal, self.received = signal.Signals(number).name, time.monotonic()

    def requested(self, epoch, steps_done):
        """True on every rank once any rank has been signalled; call after every step on every rank. After the
        last step of the run it is False without a collective: the run ends (status 0) rather than leave a
        checkpoint with nothing left to train."""
        if (epoch, steps_done) == self.end:
            return False
        if self.signal:
            self.steps_since_signal += 1
        if self.agree(1.0 if self.signal else 0.0) > 0:
            self.at = (epoch, steps_done)
            return True
        return False

    def exit(self, result):
        """After the checkpoint: wait for every rank (a launcher stops the other ranks at the first exit, so none may
        leave before the chief's checkpoint is complete), print the RESULT line with where and how fast the ranks
        stopped, wait again so that every rank's line is out, and exit with SAVED_AND_STOPPED."""
        self.agree(0.0)
        epoch, step = self.at
        result["stopped"] = {
            "epoch": epoch, "step": step, "signal": self.signal, "steps_since_signal": self.steps_since_signal,
            "seconds_since_signal": round(time.monotonic() - self.received, 3) if self.received else None}
        report(result)
        self.agree(0.0)
        sys.exit(SAVED_AND_STOPPED)
