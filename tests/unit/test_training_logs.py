"""--profile-steps and the custom loops' profiler window, on the host: no TensorFlow (a fake records the profiler
calls). The image tests (tests/images/app/test_training.py) run them with TensorFlow and TensorBoard."""
from types import SimpleNamespace

import pytest

from tfhpc_runtime.callbacks import ProfileWindow
from tfhpc_runtime.trainflags import parse_profile_steps


@pytest.mark.parametrize("text, steps", [(None, None), ("5,8", (5, 8)), ("1,1", (1, 1)), (" 2, 3", (2, 3))])
def test_profile_steps_are_parsed(text, steps):
    assert parse_profile_steps(text, "logs") == steps


@pytest.mark.parametrize("text, log_dir, message", [
    ("5", "logs", "--profile-steps '5' must be two step numbers A,B with 1 <= A <= B"),
    ("0,3", "logs", "1 <= A <= B"),
    ("4,2", "logs", "1 <= A <= B"),
    ("a,b", "logs", "e.g. 5,8"),
    ("2,3", None, "--profile-steps needs --log-dir"),
])
def test_bad_profile_steps_are_one_line(capsys, text, log_dir, message):
    with pytest.raises(SystemExit) as stopped:
        parse_profile_steps(text, log_dir)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tfhpc: error: ") and message in err, err


class FakeProfiler:
    def __init__(self):
        self.calls = []
        self.experimental = SimpleNamespace(start=lambda logdir: self.calls.append(("start", logdir)),
                                            stop=lambda: self.calls.append(("stop",)))


def run_window(steps, total):
    fake = FakeProfiler()
    window = ProfileWindow(SimpleNamespace(profiler=fake), "logs", steps)
    for step in range(1, total + 1):
        window.begin(step)
        fake.calls.append(("step", step))
        window.end(step)
    window.close()
    return fake.calls


def test_profile_window_traces_steps_a_to_b():
    calls = run_window((3, 4), 6)
    assert calls[calls.index(("start", "logs")) + 1] == ("step", 3), "started right before step A"
    assert calls[calls.index(("stop",)) - 1] == ("step", 4), "stopped right after step B"
    assert calls.count(("stop",)) == 1


def test_profile_window_stops_at_the_end_when_b_is_beyond_the_run():
    assert run_window((5, 99), 6)[-1] == ("stop",)


def test_profile_window_without_steps_never_starts():
    assert all(call[0] == "step" for call in run_window(None, 4))
