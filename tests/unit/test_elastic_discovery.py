"""Horovod Elastic without Horovod: the Slurm discovery script (tfhpc-slurm-hosts) on fake allocations, with fake
scontrol and sinfo on PATH and hosts that do or do not answer; the position an epoch continues at after a reset;
the one-line refusals of --elastic. tests/cluster/test_elastic.py runs the elastic training on three nodes."""
import json
import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tfhpc import REPO_ROOT
from tfhpc_runtime.elastic import (check_elastic_args, expand_counts, expand_hostlist, resume_step,
                                   unusable_in_sinfo, usable_hosts)

SCRIPT = REPO_ROOT / "scripts" / "launch" / "slurm_hosts.py"


def run_script(env, *args, path=None):
    environment = {"PATH": path or os.environ["PATH"],
                   "PYTHONPATH": str(REPO_ROOT / "scripts" / "runtime"), **env}
    result = subprocess.run([sys.executable, str(SCRIPT), *args], env=environment, capture_output=True, text=True,
                            timeout=60)
    return result.returncode, result.stdout, result.stderr


@pytest.fixture
def listening():
    """A TCP port on 127.0.0.1 that accepts connections, and one that refuses them."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    refused = closed.getsockname()[1]
    closed.close()
    yield server.getsockname()[1], refused
    server.close()


@pytest.mark.parametrize("text, hosts", [
    ("node1", ["node1"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("node[01-03,7],gpu5", ["node01", "node02", "node03", "node7", "gpu5"]),
    ("a[8-10]-ib,b2", ["a8-ib", "a9-ib", "a10-ib", "b2"]),
])
def test_host_lists_expand_as_scontrol_show_hostnames(text, hosts):
    assert expand_hostlist(text) == hosts


def test_count_lists_expand_per_node():
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert expand_counts("4") == [4]
    with pytest.raises(ValueError, match="not a Slurm count list"):
        expand_counts("2(3)")


def test_sinfo_states_that_drop_a_node():
    output = "n1 idle\nn2 down*\nn3 mix\nn4 drain\nn5 alloc*\nn6 alloc\nn7 drng\nn8 fail\n"
    assert unusable_in_sinfo(output) == {"n2", "n4", "n5", "n7", "n8"}


def test_a_host_that_does_not_answer_is_left_out(listening):
    port, _ = listening
    hosts = [("127.0.0.1", 2), ("192.0.2.1", 2)]  # 192.0.2.0/24: TEST-NET-1, never routed
    assert usable_hosts(hosts, port=port, timeout=0.5) == [("127.0.0.1", 2)]
    assert usable_hosts(hosts, port=0) == hosts  # no reachability check
    assert usable_hosts(hosts, "127.0.0.1 down\n", port=0) == [("192.0.2.1", 2)]


def test_resumed_epochs_continue_after_the_samples_done():
    assert resume_step(12 * 96, 64, 46) == 18  # 12 steps of 3 ranks x 32 = 18 steps of 2 ranks x 32
    assert resume_step(13 * 96, 64, 46) == 19  # rounded down: at most one step's samples are seen twice
    assert resume_step(0, 64, 46) == 0
    assert resume_step(40 * 96, 64, 50) == 49  # --steps-per-epoch 50 with fewer ranks: the epoch's last step left


def fake_slurm(tmp_path, states):
    """scontrol and sinfo that answer like Slurm's for nodes n1..n3 (sinfo: the given states)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "n1\\nn2\\nn3\\n"\n')
    (bin_dir / "sinfo").write_text("#!/bin/sh\nprintf '" + "".join(f"{h} {s}\\n" for h, s in states.items()) + "'\n")
    for tool in ("scontrol", "sinfo"):
        (bin_dir / tool).chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def test_discovery_prints_usable_hosts_with_their_slots(tmp_path):
    path = fake_slurm(tmp_path, {"n1": "alloc", "n2": "down*", "n3": "mix"})
    rc, out, err = run_script({"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_NTASKS_PER_NODE": "2"}, "--port", "0",
                              path=path)
    assert (rc, out, err) == (0, "n1:2\nn3:2\n", "")
    rc, out, err = run_script({"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "4,2(x2)"}, "--port", "0",
                              path=path)
    assert (rc, out) == (0, "n1:4\nn3:2\n"), err


def test_discovery_without_slurm_tools_expands_the_list_itself(listening):
    port, refused = listening
    env = {"SLURM_JOB_NODELIST": "localhost,127.0.0.1", "SLURM_TASKS_PER_NODE": "1(x2)"}
    assert run_script(env, "--port", str(port), path="/usr/bin:/bin") == (0, "localhost:1\n127.0.0.1:1\n", "")
    assert run_script(env, "--port", str(refused), path="/usr/bin:/bin") == (0, "", "")


@pytest.mark.parametrize("env, message", [
    ({}, "not inside a Slurm allocation (SLURM_JOB_NODELIST is unset): run it in a job"),
    ({"SLURM_JOB_NODELIST": "n[1-x]"}, "cannot read the allocation's hosts ('n[1-x]' is not a Slurm host list"),
    ({"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x2)"},
     "SLURM_TASKS_PER_NODE='2(x2)' gives 2 count(s) for 3 host(s): set SLURM_NTASKS_PER_NODE"),
])
def test_discovery_bad_input_is_one_line_and_exit_2(env, message):
    rc, out, err = run_script(env, path="/usr/bin:/bin")
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tfhpc: error: ") and message in err, err


def elastic_args(**overrides):
    values = {"elastic": True, "global_batch_size": None, "different_init_per_rank": False, "resume": None,
              "checkpoint_dir": None, "epochs": 3, "commit_steps": 1}
    return SimpleNamespace(**{**values, **overrides})


@pytest.mark.parametrize("overrides, env, message", [
    ({}, {}, "--elastic needs horovodrun's elastic mode (HOROVOD_ELASTIC=1 is not set): start it as `horovodrun "
             "--min-np 2"),
    ({"global_batch_size": 64}, {"HOROVOD_ELASTIC": "1"}, "--global-batch-size cannot be kept when --elastic"),
    ({"different_init_per_rank": True}, {"HOROVOD_ELASTIC": "1"}, "--different-init-per-rank has no effect"),
    ({"commit_steps": 0}, {"HOROVOD_ELASTIC": "1"}, "--commit-steps must be at least 1, got 0"),
])
def test_elastic_refusals_are_one_line(capsys, overrides, env, message):
    with pytest.raises(SystemExit) as stopped:
        check_elastic_args(elastic_args(**overrides), env)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_elastic_refuses_a_mid_epoch_checkpoint_but_resumes_an_epoch_one(tmp_path, capsys):
    env = {"HOROVOD_ELASTIC": "1"}
    args = elastic_args(resume="auto", checkpoint_dir=str(tmp_path))
    check_elastic_args(args, env)  # no checkpoint yet: starts fresh
    (tmp_path / "latest.json").write_text(json.dumps({"epoch": 2, "step": 0, "path": "epoch-0002/ckpt"}))
    check_elastic_args(args, env)
    (tmp_path / "latest.json").write_text(json.dumps({"epoch": 2, "step": 13, "path": "epoch-0002-step-000013/ckpt"}))
    with pytest.raises(SystemExit):
        check_elastic_args(args, env)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a mid-epoch checkpoint (13 step(s) into an epoch)" in err, err
    (tmp_path / "latest.json").write_text(json.dumps({"epoch": 3, "step": 0, "path": "epoch-0003/ckpt"}))
    with pytest.raises(SystemExit):
        check_elastic_args(args, env)  # every epoch done: refused before any rank could join and wait
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has already done 3 epoch(s): raise --epochs above 3" in err, err
    check_elastic_args(elastic_args(elastic=False, global_batch_size=64), {})  # without --elastic: nothing checked


@pytest.mark.parametrize("keras", ["3", "2"])
def test_elastic_runs_with_either_keras(capsys, keras):
    check_elastic_args(elastic_args(keras=keras), {"HOROVOD_ELASTIC": "1"})  # Keras 3: Horovod patch 0009
    assert capsys.readouterr().err == ""
