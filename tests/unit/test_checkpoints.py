"""Step-level checkpoints, the stop on a signal and --resume auto, on the host: no TensorFlow (a fake checkpoint writes
files as tf.train.Checkpoint.write does: <prefix>.data-00000-of-00001, then <prefix>.index). The image tests
(tests/images/app/test_training.py) and the Slurm test (tests/cluster/test_slurm.py) run them with TensorFlow."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tfhpc import REPO_ROOT
from tfhpc_runtime.checkpoints import Checkpoints
from tfhpc_runtime.cli import Parser
from tfhpc_runtime.preemption import SAVED_AND_STOPPED, StopOnSignal
from tfhpc_runtime.trainflags import add_training_args

STEPS = 46  # steps per epoch of the runs below


class FakeCheckpoint:
    """Writes like tf.train.Checkpoint.write; `kill` makes the process SIGKILL itself halfway, `error` raise."""

    def __init__(self, payload=b"weights", kill=False, error=None):
        self.payload, self.kill, self.error = payload, kill, error

    def write(self, prefix):
        Path(prefix + ".data-00000-of-00001").write_bytes(self.payload)
        if self.error:
            raise self.error
        if self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        Path(prefix + ".index").write_bytes(b"index")
        return prefix


def checkpoints(directory, ranks=2, **flags):
    args = SimpleNamespace(model="cnn", optimizer="sgd", dataset="glyphs", seed=1234, shuffle_buffer=-1,
                           checkpoint_dir=str(directory), keep_checkpoints=2)
    vars(args).update(flags)
    return Checkpoints.for_training(args, True, ranks, 32 * ranks, STEPS)


def listing(directory):
    return sorted(p.name for p in Path(directory).iterdir())


def test_a_mid_epoch_checkpoint_is_resumed_at_its_step(tmp_path):
    saved = checkpoints(tmp_path)
    saved.save(FakeCheckpoint(), 1)
    saved.save(FakeCheckpoint(), 1, 13)
    assert saved.written == ["epoch-0001", "epoch-0001-step-000013"]
    assert checkpoints(tmp_path).latest() == (1, 13, str(tmp_path / "epoch-0001-step-000013" / "ckpt"))
    record = json.loads((tmp_path / "latest.json").read_text())
    assert record["position"] == {"ranks": 2, "global_batch": 64, "steps_per_epoch": STEPS, "seed": 1234,
                                  "shuffle_buffer": -1}


def test_a_stop_after_the_last_step_of_an_epoch_is_that_epochs_checkpoint(tmp_path):
    saved = checkpoints(tmp_path)
    saved.save(FakeCheckpoint(), 1, STEPS)
    assert saved.written == ["epoch-0002"] and checkpoints(tmp_path).latest()[:2] == (2, 0)


def test_mid_epoch_checkpoints_count_towards_keep(tmp_path):
    saved = checkpoints(tmp_path)
    for epoch, step in ((1, 0), (1, 13), (2, 0)):
        saved.save(FakeCheckpoint(), epoch, step)
    assert listing(tmp_path) == ["epoch-0001-step-000013", "epoch-0002", "latest.json"]


def test_no_checkpoint_starts_fresh(tmp_path):
    assert checkpoints(tmp_path / "new").latest() == (0, 0, None)


@pytest.mark.parametrize("flags, ranks, phrases", [
    ({}, 1, ["taken 13 step(s) into epoch 2 with ranks 2, this run has 1", "resume with 2"]),
    ({"seed": 7}, 2, ["--seed 1234, this run has 7"]),
    ({"shuffle_buffer": 100}, 2, ["--shuffle-buffer -1, this run has 100"]),
    ({"optimizer": "adam"}, 2, ["written with --optimizer sgd", "resume with --optimizer sgd"]),
])
def test_a_mid_epoch_checkpoint_of_another_run_is_one_line_and_kept(tmp_path, capsys, flags, ranks, phrases):
    checkpoints(tmp_path).save(FakeCheckpoint(), 1, 13)
    before = {name: (tmp_path / name).stat().st_mtime_ns for name in listing(tmp_path)}
    with pytest.raises(SystemExit) as stopped:
        checkpoints(tmp_path, ranks=ranks, **flags).latest()
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1 and err.startswith("tfhpc: error: "), err
    for phrase in phrases:
        assert phrase in err, (phrase, err)
    assert {name: (tmp_path / name).stat().st_mtime_ns for name in listing(tmp_path)} == before


def test_an_epoch_checkpoint_resumes_with_another_number_of_ranks(tmp_path):
    checkpoints(tmp_path).save(FakeCheckpoint(), 2)
    assert checkpoints(tmp_path, ranks=4).latest()[:2] == (2, 0)


def test_a_kill_during_the_write_leaves_the_previous_checkpoint(tmp_path):
    checkpoints(tmp_path).save(FakeCheckpoint(), 1)
    code = ("import sys; sys.path[:0] = sys.argv[1:3]; from pathlib import Path; "
            "from test_checkpoints import FakeCheckpoint, checkpoints; "
            "checkpoints(Path(sys.argv[3])).save(FakeCheckpoint(kill=True), 1, 13)")
    killed = subprocess.run([sys.executable, "-c", code, str(REPO_ROOT / "scripts" / "runtime"),
                             str(Path(__file__).parent), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert checkpoints(tmp_path).latest() == (1, 0, str(tmp_path / "epoch-0001" / "ckpt"))
    stale = [name for name in listing(tmp_path) if name.endswith(".tmp")]
    assert len(stale) == 1 and stale[0].startswith(".epoch-0001-step-000013."), listing(tmp_path)
    checkpoints(tmp_path).save(FakeCheckpoint(), 1, 20)  # the next save clears what the killed one left
    assert listing(tmp_path) == ["epoch-0001", "epoch-0001-step-000020", "latest.json"]


def test_a_failed_write_is_one_line_and_leaves_the_previous_checkpoint(tmp_path, capsys):
    checkpoints(tmp_path).save(FakeCheckpoint(), 1)
    before = (tmp_path / "latest.json").read_text()
    with pytest.raises(SystemExit) as stopped:
        checkpoints(tmp_path).save(FakeCheckpoint(error=OSError(28, "No space left on device")), 1, 13)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1, err
    assert "cannot write checkpoint epoch-0001-step-000013" in err and "the previous checkpoint is intact" in err
    assert "No space left on device" in err
    assert (tmp_path / "latest.json").read_text() == before and listing(tmp_path) == ["epoch-0001", "latest.json"]


@pytest.fixture
def stop_handlers():
    """StopOnSignal replaces SIGUSR1/SIGTERM handlers, its exit ignores SIGTERM/SIGINT: put pytest's back afterwards."""
    saved = {number: signal.getsignal(number) for number in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)


@pytest.mark.parametrize("name", ["SIGUSR1", "SIGTERM"])
def test_a_signal_stops_every_rank_at_the_same_step_with_status_99(stop_handlers, capsys, name):
    other_ranks = [0.0]  # what the other rank contributes to the sum
    calls = []

    def agree(flag):
        calls.append(flag)
        return flag + other_ranks[0]

    stop = StopOnSignal(agree)
    assert not stop.requested(0, 1)
    other_ranks[0] = 1.0  # another rank was signalled: this one stops too, although it got no signal
    assert stop.requested(0, 2) and stop.at == (0, 2) and stop.signal is None
    other_ranks[0] = 0.0
    stop = StopOnSignal(agree, leave=sys.exit)  # the entrypoints' default, os._exit, would end pytest
    os.kill(os.getpid(), getattr(signal, name))  # only recorded: the process goes on
    assert stop.requested(1, 13) and stop.at == (1, 13)
    calls.clear()
    handlers = record_handlers(stop)
    with pytest.raises(SystemExit) as stopped:
        stop.exit({"rank": 0})
    assert stopped.value.code == SAVED_AND_STOPPED == 99
    assert calls == [0.0, 0.0], "a barrier before the RESULT line and one after it"
    assert handlers[0][0] == stop._record and handlers[1] == (signal.SIG_IGN, signal.SIG_IGN), \
        "SIGTERM/SIGINT ignored once the checkpoint is complete (after the first barrier), not before"
    result = json.loads(capsys.readouterr().out.partition("RESULT ")[2])
    assert result["stopped"]["signal"] == name and result["stopped"]["steps_since_signal"] == 1
    assert (result["stopped"]["epoch"], result["stopped"]["step"]) == (1, 13)
    assert 0 <= result["stopped"]["seconds_since_signal"] < 5


def record_handlers(stop):
    """Wraps stop.agree to record the SIGTERM and SIGINT handlers at each of its calls; returns that record."""
    agree, handlers = stop.agree, []

    def recording(flag):
        handlers.append((signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)))
        return agree(flag)

    stop.agree = recording
    return handlers


# A rank through the stop's last collective, in the launcher's teardown: another rank has exited 99 and Slurm
# (KillOnBadExit=1) or mpirun sends SIGTERM to this one while it still shuts down. Python resets its signal handlers
# before it tears the modules down (TensorFlow's and Horovod's shutdown, seconds), so a SIGTERM there used to kill the
# chief after its checkpoint: srun returned 143 and the job was not requeued.
TEARDOWN = """
import os, subprocess, sys, time
sys.path[:0] = [sys.argv[1]]
from tfhpc_runtime.preemption import StopOnSignal

class Shutdown:  # a module torn down slowly at exit, as TensorFlow's and Horovod's are
    def __del__(self, sleep=time.sleep):
        sleep(30)

shutdown = Shutdown()
calls = []

def agree(flag):  # one rank's view of the collectives of a 2-rank run in which the other rank was signalled
    calls.append(flag)
    if len(calls) == 3:  # the last collective: the other rank exits 99 now, and the launcher's SIGTERM follows
        subprocess.Popen(["sh", "-c", f"sleep 1; kill -TERM {os.getpid()} 2>/dev/null"])
    return flag + 1.0

stop = StopOnSignal(agree)
assert stop.requested(1, 13)
stop.exit({"rank": 0})
"""


def test_a_rank_through_the_stop_exits_99_although_the_launcher_sends_sigterm():
    started = time.monotonic()
    ended = subprocess.run([sys.executable, "-c", TEARDOWN, str(REPO_ROOT / "scripts" / "runtime")],
                           capture_output=True, text=True, timeout=60)
    assert ended.returncode == SAVED_AND_STOPPED, (ended.returncode, ended.stderr)
    assert '"stopped"' in ended.stdout and ended.stdout.startswith("RESULT "), "the RESULT line is out"
    assert time.monotonic() - started < 20, "no interpreter shutdown after the last collective"


def test_a_signal_after_the_last_step_lets_the_run_finish(stop_handlers):
    calls = []
    stop = StopOnSignal(lambda flag: calls.append(flag) or flag)
    stop.end = (2, STEPS)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert not stop.requested(2, STEPS) and stop.at is None and calls == [], "no checkpoint with nothing to train"
    assert stop.requested(2, STEPS - 1), "one step earlier it stops"


@pytest.mark.parametrize("argv, value", [([], None), (["--resume"], "auto"), (["--resume", "auto"], "auto"),
                                         (["--resume", "--epochs", "2"], "auto")])
def test_resume_takes_auto_or_nothing(argv, value):
    assert add_training_args(Parser("test")).parse_args(argv).resume == value


def test_resume_with_another_value_is_one_line(capsys):
    with pytest.raises(SystemExit) as stopped:
        add_training_args(Parser("test")).parse_args(["--resume", "sometimes"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1 and "'sometimes'" in err and "'auto'" in err, err
