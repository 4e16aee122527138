"""Which GPU a rank takes (tfhpc_runtime.gpu, used by the training entrypoints and the smoke tests), on the host: no
GPU is touched, the choice is."""
from types import SimpleNamespace

import pytest

from tfhpc_runtime.gpu import DeviceError, gpu_for_rank, pin_gpu, select_gpu


@pytest.mark.parametrize("local_rank, local_size, visible, index", [
    (0, 4, 0, None),  # CPU node
    (3, 4, 1, 0),     # srun --gpus-per-task=1: every task sees its own GPU as device 0
    (2, 4, 4, 2),     # one rank per GPU, all GPUs visible: the local rank's GPU
    (1, 2, 8, 1),     # fewer ranks than GPUs
])
def test_gpu_for_rank(local_rank, local_size, visible, index):
    assert gpu_for_rank(local_rank, local_size, visible) == index


def test_more_ranks_than_gpus_is_refused_with_the_launch_fix():
    with pytest.raises(DeviceError, match="4 ranks on this node but 2 GPUs visible") as refused:
        gpu_for_rank(3, 4, 2)
    assert "--gpus-per-task=1" in str(refused.value)


class FakeTensorFlow:
    """The few tf.config calls select_gpu makes, recorded."""

    def __init__(self, gpus):
        self.calls = []
        self.config = SimpleNamespace(
            list_physical_devices=lambda kind: [f"GPU:{i}" for i in range(gpus)],
            set_visible_devices=lambda device, kind: self.calls.append(("visible", device)),
            experimental=SimpleNamespace(set_memory_growth=lambda device, on: self.calls.append(("growth", device))))


@pytest.mark.parametrize("memory_growth", [True, False])
def test_select_gpu_makes_the_ranks_gpu_the_only_one(memory_growth):
    tf = FakeTensorFlow(gpus=4)
    assert select_gpu(tf, 2, 4, memory_growth=memory_growth) == 2
    assert tf.calls == [("visible", "GPU:2")] + ([("growth", "GPU:2")] if memory_growth else [])


def test_select_gpu_on_a_cpu_node_changes_nothing():
    tf = FakeTensorFlow(gpus=0)
    assert select_gpu(tf, 1, 2) is None and tf.calls == []


def test_training_ranks_stop_in_one_line_naming_the_launch_fix(monkeypatch, capsys):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    with pytest.raises(SystemExit) as stopped:
        pin_gpu(FakeTensorFlow(gpus=2), 3, 4)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "4 ranks on this node but 2 GPUs visible" in err and "--gpus-per-task=1" in err
