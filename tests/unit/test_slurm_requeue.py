"""The job scripts' requeue decision, on the host: the script runs under bash with a fake srun, scontrol and apptainer
on PATH, gets SIGUSR1 as from `#SBATCH --signal=B:USR1@120`, and the fake step ends as the ranks would. The real
thing runs on the Slurm test cluster (tests/cluster/test_slurm.py); this checks every branch in a second.

The case that made the fix: the ranks saved (the chief replaced latest.json) but Slurm ended the step with SIGTERM
after the first rank's exit 99 (KillOnBadExit=1), so srun returned 143, not 99: the job must requeue all the same."""
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tfhpc import REPO_ROOT

SCRIPTS = {"horovod-srun-pmix.sbatch": ["tfhpc-train-hvd-fit"], "mwms-slurm-resolver.sbatch": []}
BEFORE = '{"epoch": 1, "step": 0, "path": "epoch-0001/ckpt"}\n'  # the checkpoint of the previous epoch
AFTER = '{"epoch": 1, "step": 21, "path": "epoch-0001-step-000021/ckpt"}\n'  # the stop's

FAKE_SRUN = r"""#!/bin/bash
# srun --overlap ... pkill -USR1 ...: the forward; anything else: the training step
if [ "$1" = --overlap ]; then touch "$FAKE/forwarded"; sleep "${FAKE_FORWARD_SECONDS:-0}"; exit "${FAKE_FORWARD_STATUS:-0}"; fi
if [ "$FAKE_SIGNAL" = yes ]; then
    while [ ! -e "$FAKE/forwarded" ]; do sleep 0.02; done
fi
if [ -n "$FAKE_WRITES" ]; then printf '%s' "$FAKE_WRITES" > "$FAKE_LATEST.tmp" && mv "$FAKE_LATEST.tmp" "$FAKE_LATEST"; fi
exit "$FAKE_STATUS"
"""
FAKE_SCONTROL = '#!/bin/bash\necho "$*" >> "$FAKE/scontrol"\n'
FAKE_APPTAINER = "#!/bin/bash\nexit 0\n"


def catches_usr1(pid):
    """True once bash has run `trap forward USR1` (SigCgt holds bit USR1 - 1)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGUSR1 - 1)))
    return False


def run_job(tmp_path, script, status, writes=None, signalled=True, checkpoint_args=("--checkpoint-dir", "ckpt"),
            forward_seconds=0, forward_status=0):
    """Run the job script; the fake step waits for the forwarded USR1 (signalled), writes `writes` to latest.json
    and exits with `status`; the forward (srun --overlap pkill) takes forward_seconds after it reached the ranks and
    exits with forward_status.
    Returns (script's status, its output, what scontrol got)."""
    fake = tmp_path / "fake"
    (fake / "bin").mkdir(parents=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL), ("apptainer", FAKE_APPTAINER)):
        (fake / "bin" / name).write_text(text)
        (fake / "bin" / name).chmod(0o755)
    (tmp_path / "ckpt").mkdir()
    latest = tmp_path / "ckpt" / "latest.json"
    latest.write_text(BEFORE)
    env = {"PATH": f"{fake / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "TFHPC_SIF": str(tmp_path / "app.sif"),
           "SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "2", "SLURM_CPUS_PER_TASK": "2",
           "FAKE": str(fake), "FAKE_LATEST": str(latest), "FAKE_STATUS": str(status), "FAKE_WRITES": writes or "",
           "FAKE_SIGNAL": "yes" if signalled else "no", "FAKE_FORWARD_SECONDS": str(forward_seconds),
           "FAKE_FORWARD_STATUS": str(forward_status)}
    command = ["bash", str(REPO_ROOT / "scripts" / "slurm" / script), *SCRIPTS[script], *checkpoint_args,
               "--resume", "auto"]
    job = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        if signalled:
            deadline = time.monotonic() + 20
            while job.poll() is None and not catches_usr1(job.pid):
                assert time.monotonic() < deadline, "the job script never trapped USR1"
                time.sleep(0.02)
            job.send_signal(signal.SIGUSR1)  # Slurm's warning before the time limit
        output, _ = job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
    scontrol = (fake / "scontrol").read_text() if (fake / "scontrol").exists() else ""
    return job.returncode, output, scontrol


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("status", [99, 143, 137, 1])
def test_a_stop_that_saved_requeues_whatever_signal_ended_the_step(tmp_path, script, status):
    code, output, scontrol = run_job(tmp_path, script, status, writes=AFTER)
    assert (code, scontrol) == (0, "requeue 42\n"), output
    assert "save and stop" in output
    assert ("after the checkpoint" in output) == (status != 99), output


@pytest.mark.parametrize("script", SCRIPTS)
def test_ranks_that_exit_before_the_forward_returns_are_seen_with_their_status(tmp_path, script):
    """The ranks save and exit within a fraction of a second, the srun of the forward can take longer: the step
    ends while the trap runs, and the script must see its 99, not wait's 138 for the trap."""
    code, output, scontrol = run_job(tmp_path, script, 99, forward_seconds=0.5)
    assert (code, scontrol) == (0, "requeue 42\n"), output
    assert "after the checkpoint" not in output, output


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_node_whose_rank_had_already_stopped_does_not_end_the_script(tmp_path, script):
    """On a busy node the forward's pkill can start after that node's rank stopped at the other rank's signal (the
    ranks agree on the stop at the next step): pkill finds nothing there and exits 1, and srun with it. Under
    `set -e` that status ended the script inside its trap, before the requeue (seen on the test cluster)."""
    code, output, scontrol = run_job(tmp_path, script, 99, writes=AFTER, forward_status=1)
    assert (code, scontrol) == (0, "requeue 42\n"), output
    assert "left to signal on some node" in output, output


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_checkpoint_dir_may_be_given_with_an_equals_sign(tmp_path, script):
    code, output, scontrol = run_job(tmp_path, script, 143, writes=AFTER, checkpoint_args=("--checkpoint-dir=ckpt",))
    assert (code, scontrol) == (0, "requeue 42\n"), output


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_step_killed_before_the_checkpoint_fails_the_job(tmp_path, script):
    code, output, scontrol = run_job(tmp_path, script, 143)  # latest.json still the previous epoch's
    assert (code, scontrol) == (143, ""), output


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_step_that_failed_without_a_new_checkpoint_is_not_requeued(tmp_path, script):
    """srun's 1 after the script's own USR1 (a step Slurm aborted, seen on the test cluster) requeues only with a
    latest.json the stop wrote; without one the job fails with that status."""
    code, output, scontrol = run_job(tmp_path, script, 1)
    assert (code, scontrol) == (1, ""), output


@pytest.mark.parametrize("script", SCRIPTS)
def test_without_the_scripts_own_usr1_nothing_is_requeued(tmp_path, script):
    """scancel (SIGTERM to every task): the ranks save and exit, but a cancelled job stays cancelled."""
    for status in (99, 143):
        code, output, scontrol = run_job(tmp_path / str(status), script, status, writes=AFTER, signalled=False)
        assert (code, scontrol) == (status, ""), output


@pytest.mark.parametrize("script", SCRIPTS)
def test_without_a_checkpoint_dir_only_99_requeues(tmp_path, script):
    code, output, scontrol = run_job(tmp_path / "143", script, 143, writes=AFTER, checkpoint_args=())
    assert (code, scontrol) == (143, ""), output
    code, output, scontrol = run_job(tmp_path / "99", script, 99, checkpoint_args=())
    assert (code, scontrol) == (0, "requeue 42\n"), output

