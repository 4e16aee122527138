"""The checks of keras3_scripts/multi_worker_files.py's RESULT lines (docs/keras.md#files-on-many-workers), one
function per feature, shared by the run in the app image (tests/images/app/test_keras_files.py), from the SIF
(tests/sif/test_sif_keras3.py) and in a Slurm job on two nodes (tests/cluster/test_slurm.py). Each takes the two
workers' reports, in rank order, and the Keras ("3" or "2") and strategy ("mwms" or "hvd") of the run."""
from tfhpc import REPO_ROOT

USER_SCRIPT = REPO_ROOT / "tests" / "images" / "app" / "keras3_scripts" / "multi_worker_files.py"


def checkpoints(ranks, keras, strategy):
    for report in ranks:
        assert report["keras"].startswith(f"{keras}.") and report["size"] == 2
        checkpoint = report["checkpoint"]
        assert checkpoint["files"] == ["best.keras", "model.keras", "steps.weights.h5"]
        assert checkpoint["iterations"] == 24  # 3 epochs of 8 steps: the .weights.h5 of step 24 is the last
        assert checkpoint["keras_file"] == checkpoint["weights_file"] == checkpoint["best_file"] \
            == checkpoint["weights"]
    assert ranks[0]["checkpoint"]["weights"] == ranks[1]["checkpoint"]["weights"]


def logs(ranks, keras, strategy):
    for report in ranks:
        assert report["tensorboard"]["event_files"] == 1 and report["tensorboard"]["profiles"] == 1
        lines = report["csv_logger"]["lines"]
        assert lines[0].split(",")[:2] == ["epoch", "loss"] and [line.split(",")[0] for line in lines[1:]] == \
            ["0", "1", "2"]
    assert ranks[0]["csv_logger"] == ranks[1]["csv_logger"]


def backup_by_epoch(ranks, keras, strategy):
    for report in ranks:
        backup = report["backup_epoch"]
        assert backup["after_stop"]  # the backup of epoch 1, written before the stop at epoch 2
        assert backup["resumed_from"] == backup["backed_up"]
        assert backup["epochs"] == [2, 3] and backup["iterations"] == 32
        # delete_checkpoint: Keras 3 removes the directory, tf_keras its `chief/` checkpoint in it
        assert backup["after_end"] == (None if keras == "3" else [])
    assert ranks[0]["backup_epoch"]["weights"] == ranks[1]["backup_epoch"]["weights"]


def backup_by_steps(ranks, keras, strategy):
    for report in ranks:
        backup = report["backup_steps"]
        assert backup["resumed_from"] == backup["backed_up"]  # the weights after step 12, the last backup
        assert backup["epochs"] == [1, 2] and backup["after_end"]  # kept: delete_checkpoint=False
        # tf_keras resumes at step 4 of epoch 1; Keras 3 records the batch but restores the epoch only, and runs
        # epoch 1 whole again (docs/keras.md).
        assert (backup["steps"], backup["iterations"]) == ((16, 28) if keras == "3" else (12, 24))
    assert ranks[0]["backup_steps"]["weights"] == ranks[1]["backup_steps"]["weights"]


def backup_dir_per_worker(ranks):
    # Keras 3 only: tf_keras's workers would resume at different epochs and wait for each other.
    for report in ranks:
        assert report["backup_per_worker"].startswith("BackupAndRestore: the workers restored different epochs"), \
            report["backup_per_worker"]
        assert "give every worker the same backup_dir" in report["backup_per_worker"]


def early_stopping(ranks, keras, strategy):
    for report in ranks:
        stopping = report["early_stopping"]
        assert stopping["epochs"] == [0, 1] and stopping["iterations"] == 16
        assert stopping["weights"] == stopping["epoch_0"]
    assert ranks[0]["early_stopping"]["weights"] == ranks[1]["early_stopping"]["weights"]


def saved_models(ranks, keras, strategy):
    for report in ranks:
        assert report["save_load"]["loaded"] == report["save_load"]["weights"]
        assert "saved_model.pb" in report["export"]["files"] and report["export"]["gap"] < 1e-6
        # tf_keras cannot rebuild the optimizer of a .keras file saved with Horovod's DistributedOptimizer (the
        # files load without it, compile=False); Keras 3 saves Keras' own optimizer class (Horovod patch 0007).
        expected = ["Could not locate class 'SGD'"] if (keras, strategy) == ("2", "hvd") else []
        assert report["load_errors"] == expected


def no_shared_writes(ranks, keras, strategy):
    assert ranks[0]["left"] == ranks[1]["left"]  # one directory
    assert not [path for path in ranks[0]["left"] if "workertemp_" in path]
    # tf_keras's CSVLogger opens the chief's file on every worker (so do Keras 3's without patch 0003).
    expected = ["log.csv"] if (keras, strategy) == ("2", "mwms") else []
    assert [report["shared_writes"] for report in ranks] == [[], expected]


def every_feature(ranks, keras, strategy):
    """Every check of a run; a Keras 3 MWMS run also the one-line stop of a backup directory per worker."""
    checkpoints(ranks, keras, strategy)
    logs(ranks, keras, strategy)
    backup_by_epoch(ranks, keras, strategy)
    backup_by_steps(ranks, keras, strategy)
    early_stopping(ranks, keras, strategy)
    saved_models(ranks, keras, strategy)
    no_shared_writes(ranks, keras, strategy)
    if (keras, strategy) == ("3", "mwms"):
        backup_dir_per_worker(ranks)
