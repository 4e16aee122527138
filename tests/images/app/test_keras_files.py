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
The matrix these tests prove is in docs/keras.md#files-on-many-workers; the checks are tests/support/keras_files.py's,
which the SIF's and the Slurm job's runs of the same script share.
"""
import pytest

from conftest import CONFIG, run_ranks, script
from support import keras_files
from support.keras_files import USER_SCRIPT
from support.patches import KERAS_PATCHES
from test_keras3 import assert_fails_without, put

WORK = "/tmp/tfhpc-keras-files"
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
    keras_files.checkpoints(reports(keras, strategy), keras, strategy)


@pytest.mark.parametrize("keras, strategy", RUNS)
def test_tensorboard_and_csv_logger_write_the_chiefs_logs_once(image_layer, reports, keras, strategy):
    keras_files.logs(reports(keras, strategy), keras, strategy)


@pytest.mark.parametrize("keras, strategy", RUNS)
def test_backup_and_restore_by_epoch_resumes_from_the_backup_and_deletes_it(image_layer, reports, keras, strategy):
    keras_files.backup_by_epoch(reports(keras, strategy), keras, strategy)


@pytest.mark.parametrize("keras, strategy", RUNS)
def test_backup_and_restore_by_steps_resumes_from_the_last_backup(image_layer, reports, keras, strategy):
    keras_files.backup_by_steps(reports(keras, strategy), keras, strategy)


def test_a_backup_dir_per_mwms_worker_stops_at_the_start_with_one_line(image_layer, reports):
    keras_files.backup_dir_per_worker(reports("3", "mwms"))


@pytest.mark.parametrize("keras, strategy", RUNS)
def test_early_stopping_restores_the_best_weights_on_every_worker(image_layer, reports, keras, strategy):
    keras_files.early_stopping(reports(keras, strategy), keras, strategy)


@pytest.mark.parametrize("keras, strategy", RUNS)
def test_saved_and_exported_models_load_on_every_worker(image_layer, reports, keras, strategy):
    keras_files.saved_models(reports(keras, strategy), keras, strategy)


@pytest.mark.parametrize("keras, strategy", RUNS)
def test_no_worker_writes_the_chiefs_files_or_leaves_a_temporary_one(image_layer, reports, keras, strategy):
    keras_files.no_shared_writes(reports(keras, strategy), keras, strategy)


@pytest.mark.patch_reversal
def test_the_script_fails_without_the_patch(host, image_layer, work):
    name = "0003-multi-worker-callback-files.patch"
    assert name in CONFIG.keras_patches, f"{name} is no longer listed: drop its test"
    assert_fails_without(host, f"{work}/without-{name}", "keras", KERAS_PATCHES, [name],
                         command(work, "3", "mwms", "--strict-writes"), "log.csv, a file the chief writes")
