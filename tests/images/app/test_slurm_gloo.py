"""tfhpc-slurm-gloo (Horovod over Gloo under srun, no MPI) on one node: two processes given the environment srun gives
two tasks; the allreduce smoke test checks the values. Across two Slurm nodes: tests/cluster/test_slurm.py."""
from conftest import run_ranks


def slurm_task(task, extra=""):
    return (f"SLURM_JOB_ID=77 SLURM_PROCID={task} SLURM_LOCALID={task} SLURM_NODEID=0 SLURM_STEP_NUM_TASKS=2 "
            f"SLURM_STEP_NODELIST=$(hostname) SLURM_STEP_TASKS_PER_NODE=2 tfhpc-slurm-gloo {extra}"
            "tfhpc-smoke-collectives --sizes 1,1023")


def test_two_tasks_rendezvous_and_allreduce_over_gloo(host, image_layer):
    # one output file per task, as srun keeps them apart; printed once both ended, with their combined status
    reports = run_ranks(host, f"({slurm_task(0)}) > /tmp/task0 2>&1 & first=$!; "
                              f"({slurm_task(1)}) > /tmp/task1 2>&1 & second=$!; "
                              "wait $first && wait $second; status=$?; cat /tmp/task0 /tmp/task1; exit $status")
    assert [(r["size"], r["controller"], r["failures"]) for r in reports] == [(2, "gloo", [])] * 2


def test_outside_srun_is_a_one_line_error(host, image_layer):
    result = host.run("tfhpc-slurm-gloo tfhpc-smoke-collectives")
    assert result.rc == 2 and "not inside an srun step" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
