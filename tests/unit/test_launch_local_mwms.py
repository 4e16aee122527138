"""launch-local-mwms takes the worker command and its options as mpirun and horovodrun do: no `--` needed, still
accepted, and the worker's options never read as the launcher's. Run on the host with a tiny Python worker that
prints what it was given."""
import json
import os
import subprocess
import sys

import pytest

from tfhpc import REPO_ROOT

LAUNCHER = REPO_ROOT / "scripts" / "train" / "launch_local_mwms.py"
# A worker that prints its arguments and its TF_CONFIG index on one line.
WORKER = [sys.executable, "-c",
          "import json, os, sys; print(json.dumps([json.loads(os.environ['TF_CONFIG'])['task']['index'], "
          "sys.argv[1:]]))"]


def launch(*arguments):
    env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
    env["PYTHONPATH"] = str(REPO_ROOT / "scripts" / "runtime")
    return subprocess.run([sys.executable, str(LAUNCHER), *arguments], env=env, capture_output=True, text=True,
                          timeout=60)


def workers_saw(result):
    """{worker index: its arguments}, from the '[worker N] ...' lines."""
    assert result.returncode == 0, result.stderr
    seen = {}
    for line in result.stdout.splitlines():
        prefix, _, payload = line.partition("] ")
        index, arguments = json.loads(payload)
        assert prefix == f"[worker {index}"
        seen[index] = arguments
    return seen


@pytest.mark.parametrize("separator", [[], ["--"]], ids=["without --", "with --"])
def test_worker_options_go_to_the_workers(separator):
    result = launch("-n", "2", "--timeout", "30", *separator, *WORKER, "--epochs", "2")
    assert workers_saw(result) == {0: ["--epochs", "2"], 1: ["--epochs", "2"]}


def test_worker_options_named_like_the_launchers_stay_the_workers():
    """-n and --timeout after the command are the worker's: the launcher still starts 2 workers."""
    result = launch("-n", "2", *WORKER, "-n", "5", "--timeout", "1")
    assert workers_saw(result) == {0: ["-n", "5", "--timeout", "1"], 1: ["-n", "5", "--timeout", "1"]}


@pytest.mark.parametrize("arguments", [["-n", "2"], ["-n", "2", "--"]], ids=["nothing", "only --"])
def test_no_command_is_one_line_naming_the_fix(arguments):
    result = launch(*arguments)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "give the worker command" in result.stderr


# Worker 1 ends as the parameter says at once; worker 0 would wait a minute, as a worker waits for a dead peer.
ENDINGS = {"status 3": "sys.exit(3)", "SIGKILL": "os.kill(os.getpid(), signal.SIGKILL)", "stop": "sys.exit(99)"}


@pytest.mark.parametrize("ending, status, words", [
    ("status 3", 3, "worker 1 exited with status 3"),
    ("SIGKILL", 137, "worker 1 was killed by signal 9 (SIGKILL)"),
    ("stop", 99, None),  # a signal's stop (tfhpc_runtime/preemption.py): no error
])
def test_a_failed_worker_is_named_and_the_others_stopped(ending, status, words):
    worker = [sys.executable, "-c",
              "import json, os, signal, sys, time\n"
              "if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 1:\n"
              f"    {ENDINGS[ending]}\n"
              "time.sleep(60)"]
    result = launch("-n", "2", *worker)
    assert result.returncode == status, result.stderr
    if words:
        assert f"tfhpc: error: {words}: stopping the other workers" in result.stderr
    else:
        assert "error" not in result.stderr, result.stderr
