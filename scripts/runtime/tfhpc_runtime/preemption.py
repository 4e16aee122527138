"""Save and stop on SIGUSR1 and SIGTERM: the signal the shipped Slurm job scripts forward ahead of the time limit
(#SBATCH --signal=B:USR1@...) and the one Slurm sends at the limit or on preemption.

The handler only records the signal. At every step boundary all ranks add up their records in one scalar collective
(`agree`: Horovod's allreduce, MultiWorkerMirroredStrategy's reduce), so every rank learns at the same step that one
of them was signalled and none is left waiting in a collective. The chief then writes a step-level checkpoint, and
every rank exits with SAVED_AND_STOPPED, which the job scripts turn into a requeue; `--resume auto` continues there.

The exit is the delicate part: a launcher ends the other ranks as soon as one exits non-zero (Slurm's KillOnBadExit=1,
mpirun), and the interpreter's shutdown (TensorFlow, Horovod, gRPC: seconds, different on every rank) runs with
SIGTERM back at its default action (Python resets its handlers before it tears the modules down). A rank that left
first thus had the chief killed by SIGTERM after its checkpoint (srun: status 143, the job not requeued). So once the
checkpoint is complete the ranks ignore SIGTERM/SIGINT, and after the last collective they leave at once (os._exit
after flushing), all within milliseconds, with nothing left to lose.

Imports neither numpy nor TensorFlow: the scripts pass `agree` in.
"""
import logging
import os
import signal
import sys
import threading
import time

from .cli import report

SAVED_AND_STOPPED = 99  # exit status of every rank after a signal-driven checkpoint; the job scripts requeue on it
STOP_SIGNALS = ("SIGUSR1", "SIGTERM")
TEARDOWN_SIGNALS = ("SIGTERM", "SIGINT")  # what a launcher sends the ranks left when one has exited
EXIT_WAIT_SECONDS = 60  # at most this long from the complete checkpoint to the exit, should a peer hang


class StopOnSignal:
    """Records SIGUSR1/SIGTERM; requested() is the ranks' common answer, exit() ends every rank alike.

    Create it first thing, so that a signal during start-up is recorded too. agree (set once the framework runs):
    float -> float, the sum over all ranks of the value each passes; a collective, so every rank must call
    requested() at the same steps (after every step in the entrypoints)."""

    def __init__(self, agree=None, leave=os._exit):
        self.agree = agree
        self.leave = leave  # how exit() ends the process: os._exit, no interpreter shutdown (the tests pass sys.exit)
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
        """After the checkpoint (the chief has written it, or is writing it: the others may call exit() first):

        1. wait for every rank: once this collective returns the chief's checkpoint and latest.json are complete;
        2. ignore SIGTERM/SIGINT from now on: a launcher that tears the job down because another rank has already
           exited 99 must not kill this one with status 143 (a job script would see a failure, not a stop);
        3. print the RESULT line with where and how fast the ranks stopped, and wait again so that every rank's line
           is out;
        4. leave at once with SAVED_AND_STOPPED: stdout, stderr and the logging handlers flushed, no interpreter
           shutdown, so that all ranks exit within milliseconds of that last collective.

        From step 1 on the rank leaves with SAVED_AND_STOPPED after EXIT_WAIT_SECONDS at the latest, should a peer
        never reach the last collective: the checkpoint is complete by then."""
        self.agree(0.0)
        for name in TEARDOWN_SIGNALS:
            signal.signal(getattr(signal, name), signal.SIG_IGN)  # SIG_IGN, unlike a handler, lasts through exit
        watchdog = threading.Timer(EXIT_WAIT_SECONDS, self._leave_after_wait)
        watchdog.daemon = True
        watchdog.start()
        epoch, step = self.at
        result["stopped"] = {
            "epoch": epoch, "step": step, "signal": self.signal, "steps_since_signal": self.steps_since_signal,
            "seconds_since_signal": round(time.monotonic() - self.received, 3) if self.received else None}
        report(result)
        try:
            self.agree(0.0)
        except Exception as error:  # noqa: BLE001 - a peer gone (Gloo, gRPC raise): the checkpoint is complete
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            print(f"tfhpc: the last collective of the stop failed ({reason}): the checkpoint is complete, exiting "
                  f"with status {SAVED_AND_STOPPED}", file=sys.stderr, flush=True)
        finally:
            watchdog.cancel()
        _flush()
        self.leave(SAVED_AND_STOPPED)

    def _leave_after_wait(self):
        print(f"tfhpc: the checkpoint is complete but the other ranks did not reach the last collective of the "
              f"stop within {EXIT_WAIT_SECONDS} s: exiting with status {SAVED_AND_STOPPED}", file=sys.stderr, flush=True)
        _flush()
        os._exit(SAVED_AND_STOPPED)  # from a thread: sys.exit would end the thread only


def _flush():
    """What os._exit would otherwise lose: Python's buffered output and the logging handlers' (TensorFlow logs
    through Python's logging)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    logging.shutdown()
