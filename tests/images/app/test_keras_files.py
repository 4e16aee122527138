"""Keras' files on 2 workers that share ONE directory, side by side: the same user script
(keras3_scripts/multi_worker_files.py) with Keras 3 and with tf_keras, under MultiWorkerMirroredStrategy (every
worker given the same paths) and under Horovod (its documented form: the writing callbacks on rank 0 only, a backup
directory per rank). One run per (Keras, strategy) covers every feature; the tests read its RESULT lines:
- ModelCheckpoint (`.keras` every epoch, `.weights.h5` every 4 steps, `save_best_only`): the three files, each
  loading to the trained weights on both workers, which are equal;
- TensorBoard (scalars and a profile) and CSVLogger: one event file and one profile (the chief's), the CSV's rows;
- BackupAndRestore by epoch and by steps: the fit stopped, resumed from the backed-up weights on both workers, the
  epochs and steps each Keras runs then, the backup deleted or kept as asked;
- Keras 3 under MWMS with a backup directory per worker (the chief's state on the chief only): one line at the start
  of the resumed fit on every worker;
- EarlyStopping(restore_best_weights=True): both workers stop after the same epoch with the best epoch's weights;
- model.save + keras.saving.load_model, model.export + tf.saved_model.load (the tutorial's form);
- no workertemp_* left behind, and no file of the chief's opened for writing by the other MWMS worker (Keras 3:
  none; tf_keras's CSVLogger writes from every worker).
Keras patch 0003 (versions.toml's keras_patches) makes the Keras 3 MWMS cells work: without it the same script,
told to fail at the first file the other worker opens at one of the chief's paths, fails there (a deterministic
stand-in for the race it causes: HDF5 "unable to lock file", a FileExistsError, then aborted collectives).
The matrix these tests prove is in docs/keras.md#files-on-many-workers.
"""
import pytest

from conftest import CONFIG, run_ranks, script
from support.patches import KERAS_PATCHES
from test_keras3 import assert_fails_without, put
from tfhpc import REPO_ROOT

WORK = "/tmp/tfhpc-keras-files"
USER_SCRIPT = REPO_ROOT / "tests" / "images" / "app" / "keras3_scripts" / "multi_worker_files.py"
# (Keras, strategy). The test tier runs the product's code path, Keras 3 under MWMS with patch 0003; the full tier
# adds the matrix's other columns, which no code of the images changes: tf_keras's own file utilities, and the
# Horovod form (the writing callbacks on rank 0), whose Keras 3 training the Horovod patches' tests run.
BASELINE = pytest.mark.full("the Keras 3 MWMS run proves patch 0003; this column is upstream's, unpatched")
RUNS = [pytest.param("3", "mwms", id="keras3-mwms")] + [
    pytest.param(keras, strategy, id=f"keras{keras}-{strategy}", marks=BASELINE)
    for keras, strategy in [("2", "mwms"), ("3", "hvd"), ("2", "hvd")]]

pytestmark = pytest.mark.skipif(not CONFIG.keras_patches, reason="the stack has no Keras 3 (TensorFlow < 2.16)")


def command(work, keras, strategy, options=""):
    out = f"{work}/keras{keras}-{strategy}"
    if strategy == "mwms":
        launcher = f"python {script('train/launch_local_mwms.py')} -n 2 --timeout 300 --"
    else:  # each rank's output in a file of its own: the RESULT lines are long
        launcher = f"horovodrun -np 2 --gloo --output-filename {out}-ranks"
    return (f"rm -rf {out} {out}-ranks && mkdir -p {out} && cd {work} && {launcher} python {work}/{USER_SCRIPT.name} "
            f"--strategy {strategy} --keras {keras} {options} {out}")


@pytest.fixture(scope="module")
def work(host):
    host.check_output(f"rm -rf {WORK} && mkdir -p {WORK}")
    put(host, USER_SCRIPT.read_text(), f"{WORK}/{USER_SCRIPT.name}")
    return WORK


@pytest.fixture(scope="module")
def reports(host, work):
    """reports(keras, strategy): the RESULT lines of that run on 2 workers, run once for every test that asks."""
    done = {}

    def get(keras, strategy):
        if (keras, strategy) not in done:
            out = f"{work}/keras{keras}-{strategy}-ranks" if strategy == "hvd" else None
            done[keras, strategy] = run_ranks(host, command(work, keras, strategy), 2, output_dir=out)
        return done[keras, strategy]
    return get


@pytest.mark.parametrize("keras, strategy", RUNS)
def test_model_checkpoints_load_to_the_trained_weights_on_every_worker(image_layer, reports, keras, strategy):
    ranks = reports(keras, strategy)
    for report in ranks:
        assert report["keras"].startswith(f"{keras}.") and report["size"] == 2
        checkpoint = report["checkpoint"]
        assert checkpoint["files"] == ["best.keras", "model.keras", "steps.weights.h5"]
        assert checkpoint["iterations"] == 24  # 3 epochs of 8 steps: the .weights.h5 of step 24 is the last
        assert checkpoint["keras_file"] == checkpoint["weights_file"] == checkpoint["best_file"] == checkpoint["weights"]
    assert ranks[0]["checkpoint"]["weights"] == ranks[1]["checkpoint"]["weights"]


@pytest.mark.parametrize("keras, strategy", RUNS)
def test_tensorboard_and_csv_logger_write_the_chiefs_logs_once(image_layer, reports, keras, strategy):
    ranks = reports(keras, strategy)
    for report in ranks:
        assert report["tensorboard"]["event_files"] == 1 and report["tensorboard"]["profiles"] == 1
        lines = report["csv_logger"]["lines"]
        assert lines[0].split(",")[:2] == ["epoch", "loss"] and [line.split(",")[0] for line in lines[1:]] == \
            ["0", "1", "2"]
    assert ranks[0]["csv_logger"] == ranks[1]["csv_logger"]


@pytest.mark.parametrize("keras, strategy", RUNS)
def test_backup_and_restore_by_epoch_resumes_from_the_backup_and_deletes_it(image_layer, reports, keras, strategy):
    ranks = reports(keras, strategy)
    for report in ranks:
        backup = report["backup_epoch"]
        assert backup["after_stop"]  # the backup of epoch 1, written before the stop at epoch 2
        assert backup["resumed_from"] == backup["backed_up"]
        assert backup["epochs"] == [2, 3] and backup["iterations"] == 32
        # delete_checkpoint: Keras 3 removes the directory, tf_keras its `chief/` checkpoint in it
        assert backup["after_end"] == (None if keras == "3" else [])
    assert ranks[0]["backup_epoch"]["weights"] == ranks[1]["backup_epoch"]["weights"]


@pytest.mark.parametrize("keras, strategy", RUNS)
def test_backup_and_restore_by_steps_resumes_from_the_last_backup(image_layer, reports, keras, strategy):
    ranks = reports(keras, strategy)
    for report in ranks:
        backup = report["backup_steps"]
        assert backup["resumed_from"] == backup["backed_up"]  # the weights after step 12, the last backup
        assert backup["epochs"] == [1, 2] and backup["after_end"]  # kept: delete_checkpoint=False
        # tf_keras resumes at step 4 of epoch 1; Keras 3 records the batch but restores the epoch only, and runs
        # epoch 1 whole again (docs/keras.md).
        assert (backup["steps"], backup["iterations"]) == ((16, 28) if keras == "3" else (12, 24))
    assert ranks[0]["backup_steps"]["weights"] == ranks[1]["backup_steps"]["weights"]


def test_a_backup_dir_per_mwms_worker_stops_at_the_start_with_one_line(image_layer, reports):
    # Keras 3 only: tf_keras's workers would resume at different epochs and wait for each other.
    for report in reports("3", "mwms"):
        assert report["backup_per_worker"].startswith("BackupAndRestore: the workers restored different epochs"), \
            report["backup_per_worker"]
        assert "give every worker the same backup_dir" in report["backup_per_worker"]


@pytest.mark.parametrize("keras, strategy", RUNS)
def test_early_stopping_restores_the_best_weights_on_every_worker(image_layer, reports, keras, strategy):
    ranks = reports(keras, strategy)
    for report in ranks:
        stopping = report["early_stopping"]
        assert stopping["epochs"] == [0, 1] and stopping["iterations"] == 16
        assert stopping["weights"] == stopping["epoch_0"]
    assert ranks[0]["early_stopping"]["weights"] == ranks[1]["early_stopping"]["weights"]


@pytest.mark.parametrize("keras, strategy", RUNS)
def test_saved_and_exported_models_load_on_every_worker(image_layer, reports, keras, strategy):
    for report in reports(keras, strategy):
        assert report["save_load"]["loaded"] == report["save_load"]["weights"]
        assert "saved_model.pb" in report["export"]["files"] and report["export"]["gap"] < 1e-6
        # tf_keras cannot rebuild the optimizer of a .keras file saved with Horovod's DistributedOptimizer (the
        # files load without it, compile=False); Keras 3 saves Keras' own optimizer class (Horovod patch 0007).
        expected = ["Could not locate class 'SGD'"] if (keras, strategy) == ("2", "hvd") else []
        assert report["load_errors"] == expected


@pytest.mark.parametrize("keras, strategy", RUNS)
def test_no_worker_writes_the_chiefs_files_or_leaves_a_temporary_one(image_layer, reports, keras, strategy):
    ranks = reports(keras, strategy)
    assert ranks[0]["left"] == ranks[1]["left"]  # one directory
    assert not [path for path in ranks[0]["left"] if "workertemp_" in path]
    # tf_keras's CSVLogger opens the chief's file on every worker (so do Keras 3's without patch 0003).
    expected = ["log.csv"] if (keras, strategy) == ("2", "mwms") else []
    assert [report["shared_writes"] for report in ranks] == [[], expected]


@pytest.mark.patch_reversal
def test_the_script_fails_without_the_patch(host, image_layer, work):
    name = "0003-multi-worker-callback-files.patch"
    assert name in CONFIG.keras_patches, f"{name} is no longer listed: drop its test"
    assert_fails_without(host, f"{work}/without-{name}", "keras", KERAS_PATCHES, [name],
                         command(work, "3", "mwms", "--strict-writes"), "log.csv, a file the chief writes")
