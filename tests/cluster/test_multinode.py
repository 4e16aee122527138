"""Two nodes (containers of the app image with sshd, on their own network): ranks on different hosts, checked by value.

- horovodrun -H node1:1,node2:1 over MPI and over Gloo: the allreduce smoke test (exact sums) and the Keras smoke
  training (loss halves; identical final weights on both ranks, compared by allgather inside the test script);
- mpirun -H node1,node2 with mpi4py: the allreduce of the ranks' values;
- MultiWorkerMirroredStrategy, one worker per node from TF_CONFIG: the same final weights on both workers;
- a node killed in the middle of a job: the job ends non-zero within 60 s and the harness names the dead node;
- an unknown host in a host list: a one-line error.
"""
import json
import re
import time

import pytest

from support.results import results

HOSTS = "node1:1,node2:1"


@pytest.mark.parametrize("transport", ["", "--gloo"])
def test_horovodrun_across_two_nodes_allreduces_exactly(image_cluster, transport):
    rc, out = image_cluster.run("node1", f"horovodrun -np 2 -H {HOSTS} {transport} tfhpc-smoke-collectives "
                                         "--sizes 1,1023,1048576", timeout=300)
    reports = results(out)
    assert rc == 0, out
    assert [(r["rank"], r["size"]) for r in reports] == [(0, 2), (1, 2)], out
    assert {r["host"] for r in reports} == {"node1", "node2"}  # one rank on each node
    assert all(r["local_size"] == 1 and not r["failures"] for r in reports), reports
    assert reports[0]["controller"] == ("gloo" if transport else "mpi")
    # sum over ranks of (rank + 1) * pattern: identical checksums on both ranks
    assert reports[0]["allreduce"] == reports[1]["allreduce"]


# Training over Gloo across the nodes is the full tier's: horovodrun --gloo's launch and collectives across them are
# test_horovodrun_across_two_nodes_allreduces_exactly's, the training on that launch is the MPI case's.
@pytest.mark.parametrize("transport", ["", pytest.param("--gloo", marks=pytest.mark.full(
    "Gloo across the nodes: the exact collectives over horovodrun --gloo; the training: over MPI"))])
def test_keras_training_across_two_nodes_ends_with_identical_weights(image_cluster, transport):
    rc, out = image_cluster.run("node1", f"horovodrun -np 2 -H {HOSTS} {transport} tfhpc-smoke-train --epochs 3",
                                timeout=600)
    reports = results(out)
    assert rc == 0, out
    assert {r["host"] for r in reports} == {"node1", "node2"}
    for report in reports:
        assert report["max_weight_difference_across_ranks"] == 0.0
        assert report["losses"][-1] < 0.5 * report["losses"][0], report["losses"]
    assert reports[0]["weights_sum"] == reports[1]["weights_sum"]


def test_mpirun_with_mpi4py_across_two_nodes(image_cluster):
    code = ("import json, socket; from mpi4py import MPI; c = MPI.COMM_WORLD; "
            "print('RESULT ' + json.dumps({'rank': c.rank, 'size': c.size, 'host': socket.gethostname(), "
            "'sum': c.allreduce(10 ** c.rank)}))")
    rc, out = image_cluster.run("node1", f"mpirun -np 2 -H node1,node2 python -c \"{code}\"", timeout=120)
    reports = results(out)
    assert rc == 0, out
    assert [(r["size"], r["sum"]) for r in reports] == [(2, 11), (2, 11)]  # 10**0 + 10**1
    assert {r["host"] for r in reports} == {"node1", "node2"}


def test_mwms_one_worker_per_node_from_tf_config(image_cluster):
    workers = [f"{host}:23456" for host in ("node1", "node2")]
    commands = {}
    for index, host in enumerate(("node1", "node2")):
        tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
        commands[host] = (f"TF_CONFIG='{tf_config}' tfhpc-train-mwms-fit --cluster tf_config --epochs 2 "
                          "--train-samples 2000 --test-samples 400 --verbose 0")
    finished = image_cluster.run_all(commands, timeout=600)
    reports = {}
    for host, (rc, out) in finished.items():
        assert rc == 0, f"{host}:\n{out}"
        (reports[host],) = results(out)
    assert [reports[h]["replicas_in_sync"] for h in ("node1", "node2")] == [2, 2]
    assert reports["node1"]["is_chief"] and not reports["node2"]["is_chief"]
    assert reports["node1"]["weights_sum"] == reports["node2"]["weights_sum"]
    assert reports["node1"]["losses"][-1] < reports["node1"]["losses"][0]


def test_unknown_host_is_a_one_line_error(image_cluster):
    from tfhpc import UserError
    with pytest.raises(UserError, match=r"^unknown cluster node 'node9': this cluster has node1, node2$"):
        image_cluster.run("node9", "true")
    rc, out = image_cluster.run("node1", "tfhpc-doctor --hosts node1,node9")
    failures = [line for line in out.splitlines() if "[FAIL]" in line]
    assert rc == 1 and len(failures) == 1 and "hosts: node9 does not resolve" in failures[0], out
    rc, out = image_cluster.run("node1", "tfhpc-doctor --hosts node1,node2")
    assert rc == 0 and "[ ok ] hosts: node1, node2 resolve" in out, out


# PRRTE releases (Open MPI 5's launcher) whose mpirun can exit 0 after losing a node. Measured: Debian 13's Open MPI
# 5.0.7 (PRRTE 3.0.8) prints "PRTE has lost communication with a remote daemon", ends the job within seconds, and then
# exits 0 in about half the runs (3 of 5); so does the latest stack's Open MPI wheel (PRRTE 3.0.14) in most runs (3 of
# 4). PRRTE's errmgr rework (openpmix/prrte#2603) is in neither. Open MPI 4.1 (no PRRTE) exits non-zero, which this
# test asserts, as it does for any PRRTE not listed.
LOST_NODE_EXITS_0 = {version: f"PRRTE {version}'s mpirun can exit 0 after losing a node (docs/known-issues.md)"
                     for version in ("3.0.8", "3.0.14")}


def test_killed_node_ends_the_job_within_60_seconds_and_is_named(image_cluster):
    # Last in this module: it kills node2.
    import threading
    finished = {}

    def job():
        started = time.monotonic()
        finished["result"] = image_cluster.run("node1", f"horovodrun -np 2 -H {HOSTS} tfhpc-smoke-train "
                                                        "--epochs 200 --samples 8192", timeout=300)
        finished["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=job)
    thread.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until both ranks train (python runs on node2)
        if image_cluster.nodes["node2"].exec_run(["pgrep", "-f", "hvd_keras_train"]).exit_code == 0:
            break
        time.sleep(1)
    else:
        pytest.fail("the training never started on node2")
    time.sleep(5)
    killed_at = time.monotonic()
    image_cluster.nodes["node2"].kill()
    thread.join(timeout=90)
    assert not thread.is_alive(), "the job still runs 90 s after node2 died"
    rc, out = finished["result"]
    ended_after = time.monotonic() - killed_at
    assert ended_after <= 60, f"the job ended {ended_after:.0f} s after the kill"
    assert image_cluster.dead() == ["node2"]
    assert image_cluster.report().startswith(f"cluster {image_cluster.name}: node(s) not running: node2")
    if rc == 0 and "PRTE has lost communication with a remote daemon" in out:
        _, prrte = image_cluster.run("node1", "prterun --version")
        release = re.search(r"\(PRRTE\) (\S+)", prrte)
        if release and release.group(1) in LOST_NODE_EXITS_0:
            pytest.xfail(LOST_NODE_EXITS_0[release.group(1)])
    assert rc != 0, out
