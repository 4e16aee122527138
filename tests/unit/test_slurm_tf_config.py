"""tfhpc-slurm-tf-config without Slurm: the TF_CONFIG it writes for a step's tasks, and its one-line refusals.
tests/cluster/test_slurm.py runs it on the 2-node Slurm cluster."""
import os
import subprocess
import sys

from tfhpc import REPO_ROOT
from tfhpc_runtime.cluster import slurm_tf_config

SCRIPT = REPO_ROOT / "scripts" / "launch" / "slurm_tf_config.py"


def test_every_task_is_a_worker_in_rank_order_on_the_ports_of_its_node():
    hosts, tasks = ["n1", "n2"], [2, 1]
    configs = [slurm_tf_config(hosts, tasks, rank, host, local, 10064)
               for rank, (host, local) in enumerate([("n1", 0), ("n1", 1), ("n2", 0)])]
    assert {str(c["cluster"]) for c in configs} == {"{'worker': ['n1:10064', 'n1:10065', 'n2:10064']}"}
    assert [c["task"] for c in configs] == [{"type": "worker", "index": i} for i in range(3)]


def test_tasks_out_of_node_order_get_no_tf_config():
    # srun -m cyclic: rank 1 on n2, which the worker list puts at index 2.
    assert slurm_tf_config(["n1", "n2"], [2, 1], 1, "n2", 0, 10064) is None


def run(env, *args):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "TF_CONFIG"},
           "PYTHONPATH": str(REPO_ROOT / "scripts" / "runtime"), **env}
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


def test_outside_an_srun_step_is_a_one_line_error():
    result = run({}, "python", "train.py")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "tfhpc: error: not inside an srun step (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST, "
        "SLURM_STEP_TASKS_PER_NODE, SLURM_NODEID, SLURM_LOCALID unset): start it as "
        "`srun apptainer exec image.sif tfhpc-slurm-tf-config python train.py`"]


def test_a_tf_config_already_set_or_no_command_is_a_one_line_error():
    result = run({"TF_CONFIG": "{}"}, "python", "train.py")
    assert result.returncode == 2 and "TF_CONFIG is already set" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = run({})
    assert result.returncode == 2 and result.stderr.strip() == (
        "tfhpc: error: no command given: srun apptainer exec image.sif tfhpc-slurm-tf-config python train.py")
