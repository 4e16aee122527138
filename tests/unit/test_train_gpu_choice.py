"""Which GPU a training rank takes (scripts/train/common.py), on the host: no GPU is touched, the choice is."""
import sys

import pytest

from tfhpc import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts" / "train"))
import common  # noqa: E402


@pytest.mark.parametrize("local_rank, local_size, visible, index", [
    (0, 4, 0, None),  # CPU node
    (3, 4, 1, 0),     # srun --gpus-per-task=1: every task sees its own GPU as device 0
    (2, 4, 4, 2),     # one rank per GPU, all GPUs visible: the local rank's GPU
    (1, 2, 8, 1),     # fewer ranks than GPUs
])
def test_gpu_for_rank(local_rank, local_size, visible, index):
    assert common.gpu_for_rank(local_rank, local_size, visible) == index


def test_more_ranks_than_gpus_is_one_line_naming_the_launch_fix(monkeypatch, capsys):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    with pytest.raises(SystemExit) as stopped:
        common.gpu_for_rank(3, 4, 2)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "4 ranks on this node but 2 GPUs visible" in err and "--gpus-per-task=1" in err
