"""train-mwms-fit --backup-dir on the host, without TensorFlow: the flags' one-line errors before TensorFlow starts,
the record that ties a backup to its run, and where a run continues from Keras' counters (a fake `tf` reads them).
The image tests (tests/images/app/test_training.py) and the Slurm test (tests/cluster/test_slurm.py) run the backup
with TensorFlow."""
import json
from types import SimpleNamespace

import pytest

from tfhpc_runtime.backup import RECORD, Backup
from tfhpc_runtime.cli import Parser
from tfhpc_runtime.trainflags import add_backup_args, add_training_args, check_training_args

STEPS = 46


def parse(argv):
    return add_backup_args(add_training_args(Parser("test"))).parse_args(argv)


def one_line_error(capsys, call):
    with pytest.raises(SystemExit) as stopped:
        call()
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1 and err.startswith("tfhpc: error: "), err
    return err


@pytest.mark.parametrize("argv, phrases", [
    (["--backup-dir", "/proc/1/tfhpc-backup"], ["--backup-dir /proc/1/tfhpc-backup: /proc/1 is not writable"]),
    (["--backup-dir", "b", "--backup-every-steps", "0"], ["--backup-every-steps must be at least 1, got 0"]),
    (["--backup-dir", "b", "--checkpoint-dir", "c", "--resume"], ["drop --resume", "drop --backup-dir"]),
])
def test_bad_backup_flags_are_one_line_before_tensorflow(capsys, tmp_path, monkeypatch, argv, phrases):
    monkeypatch.chdir(tmp_path)
    err = one_line_error(capsys, lambda: check_training_args(parse(argv)))
    for phrase in phrases:
        assert phrase in err, (phrase, err)
    assert list(tmp_path.iterdir()) == [], "nothing written"


def test_the_default_backs_up_every_10_steps_and_without_the_flag_nothing():
    assert (parse(["--backup-dir", "b"]).backup_every_steps, parse([]).backup_dir) == (10, None)


def backup(directory, workers=2, **flags):
    args = SimpleNamespace(model="cnn", optimizer="sgd", dataset="glyphs", seed=1234, shuffle_buffer=-1,
                           backup_dir=str(directory), backup_every_steps=10)
    vars(args).update(flags)
    return Backup.for_training(args, True, workers, 32 * workers, STEPS)


def fake_tf(prefix, epoch, batch):
    """tf.train.latest_checkpoint and load_checkpoint of a BackupAndRestore backup with Keras' two counters."""
    tensors = {"ckpt_saved_epoch/.ATTRIBUTES/VARIABLE_VALUE": epoch,
               "ckpt_saved_batch/.ATTRIBUTES/VARIABLE_VALUE": batch}
    reader = SimpleNamespace(get_tensor=tensors.__getitem__)
    train = SimpleNamespace(latest_checkpoint=lambda directory: prefix, load_checkpoint=lambda path: reader)
    return SimpleNamespace(train=train, errors=SimpleNamespace(OpError=RuntimeError))


@pytest.mark.parametrize("epoch, batch, resumed", [(1, 12, (1, 13)), (0, STEPS - 1, (1, 0)), (2, 0, (2, 1)),
                                                   (3, -1, (4, 0))])
def test_a_run_continues_after_the_last_batch_backed_up(tmp_path, epoch, batch, resumed):
    backup(tmp_path).write_record()
    prefix = str(tmp_path / "chief" / "ckpt-3")
    assert backup(tmp_path).resume_point(fake_tf(prefix, epoch, batch)) == (*resumed, prefix)


def test_no_backup_starts_fresh(tmp_path):
    assert backup(tmp_path).resume_point(fake_tf(None, 0, 0)) == (0, 0, None)


@pytest.mark.parametrize("flags, workers, phrases", [
    ({"model": "mlp"}, 2, ["--model cnn, not --model mlp", "run with --model cnn"]),
    ({}, 4, ["with workers 2, this run has 4", "run with 2", "--checkpoint-dir DIR --resume auto"]),
    ({"seed": 7}, 2, ["--seed 1234, this run has 7"]),
])
def test_a_backup_of_another_run_is_one_line_and_kept(tmp_path, capsys, flags, workers, phrases):
    backup(tmp_path).write_record()
    record = (tmp_path / "chief" / RECORD).read_bytes()
    err = one_line_error(capsys, lambda: backup(tmp_path, workers, **flags).resume_point(fake_tf("p", 1, 12)))
    for phrase in phrases:
        assert phrase in err, (phrase, err)
    assert (tmp_path / "chief" / RECORD).read_bytes() == record


def test_a_backup_without_the_record_is_not_ours(tmp_path, capsys):
    (tmp_path / "chief").mkdir()
    err = one_line_error(capsys, lambda: backup(tmp_path).resume_point(fake_tf("p", 1, 12)))
    assert f"without {RECORD}" in err and "give a new --backup-dir" in err, err


def test_only_the_writer_records(tmp_path):
    Backup(tmp_path, False, 10, {}, {}).write_record()
    assert not (tmp_path / "chief").exists()
    backup(tmp_path).write_record()
    assert json.loads((tmp_path / "chief" / RECORD).read_text())["position"] == {
        "workers": 2, "global_batch": 64, "steps_per_epoch": STEPS, "seed": 1234, "shuffle_buffer": -1}
