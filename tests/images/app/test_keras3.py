"""Keras 3 (`import keras`, the Keras of TensorFlow >= 2.16) on 2 ranks, with user scripts written from TensorFlow's
multi-worker tutorial and Horovod's TensorFlow 2 examples (examples/keras3_*.py), and proof that each
patch of versions.toml's keras_patches and of the Keras 3 Horovod patches (0006, 0007) is needed.

Each script runs once, on 2 ranks (MultiWorkerMirroredStrategy: 2 workers on localhost ports; Horovod: horovodrun
-np 2), and its RESULT lines serve every assertion on it:
- MultiWorkerMirroredStrategy + fit: the loss falls below 75 % of its first-epoch value, both workers end with
  bit-equal weights (different initial weights per worker), the chief's `.keras` ModelCheckpoint reloads to the
  same weights, evaluate reports the same loss and accuracy on both, predict returns every row;
- hvd.DistributedGradientTape (custom loop, broadcast_variables): the loss falls, the ranks (different samples and
  initial weights) end with bit-equal weights, and the allreduce of a keras.Variable equals it;
- horovod.tensorflow.keras.DistributedOptimizer + BroadcastGlobalVariablesCallback + MetricAverageCallback: the loss
  falls, the weights are bit-equal, the epoch losses are the average of the ranks' own, and the model rank 0 saves
  loads without Horovod as Keras' own SGD;
- MultiWorkerMirroredStrategy + BackupAndRestore, TensorBoard, ExponentialDecay, then EarlyStopping, run twice with
  one backup directory for both workers: the second run resumes after the first's last epoch, the learning rate is the
  schedule's, EarlyStopping ends both workers' fit after the same epoch, the chief writes the event files;
- hvd learning-rate warm-up and schedule callbacks and hvd.load_model (Horovod patch 0008): the learning rates of
  each epoch, the loaded model's optimizer wrapped again with its state, the ranks equal after training on;
- custom loops (Horovod, MWMS): 2 ranks with batch 16 end with the weights of 1 rank with batch 32, to 1e-4.
Without a patch (a copy of the installed package, as symbolic links, with that patch reversed, first on PYTHONPATH),
the same script fails with the error the patch's header names.

These tests live with the app layer, although the Keras patches are the tensorflow layer's: the scripts need
Horovod and the MWMS launcher, and a run on every image below would multiply the time for no new coverage.
"""
import json
import shlex

import pytest

from conftest import CONFIG, run_ranks, script
from support.patches import HOROVOD_PATCHES, KERAS_PATCHES, PURELIB, REVERSE
from support.weights import check_two_like_one
from tfhpc import REPO_ROOT

WORK = "/tmp/tfhpc-keras3-tests"
USER_SCRIPTS = REPO_ROOT / "examples"  # shipped in the image at /opt/tfhpc/examples

pytestmark = pytest.mark.skipif(not CONFIG.keras_patches, reason="the stack has no Keras 3 (TensorFlow < 2.16)")


def put(host, text, path):
    host.check_output(f"printf '%s' {shlex.quote(text)} > {path}")


@pytest.fixture(scope="module")
def work(host):
    host.check_output(f"rm -rf {WORK} && mkdir -p {WORK}/mwms {WORK}/hvd-fit {WORK}/mwms-callbacks "
                      f"{WORK}/hvd-callbacks")
    for user_script in USER_SCRIPTS.glob("keras3_*.py"):
        put(host, user_script.read_text(), f"{WORK}/{user_script.name}")
    return WORK


def mwms(work, out_dir):
    return (f"python {script('train/launch_local_mwms.py')} -n 2 --timeout 180 -- "
            f"python {work}/keras3_mwms_fit.py {out_dir}")


def mwms_callbacks(work, epochs):
    return (f"python {script('train/launch_local_mwms.py')} -n 2 --timeout 180 -- "
            f"python {work}/keras3_mwms_callbacks.py {work}/mwms-callbacks {epochs}")


def hvd_loop(work):
    return f"horovodrun -np 2 python {work}/keras3_hvd_custom_loop.py"


def hvd_fit(work, out_dir):
    return f"horovodrun -np 2 python {work}/keras3_hvd_fit.py {out_dir}"


def hvd_callbacks(work, out_dir):
    return f"horovodrun -np 2 python {work}/keras3_hvd_keras_callbacks.py {out_dir}"


@pytest.fixture(scope="module")
def mwms_reports(host, work):
    return run_ranks(host, mwms(work, f"{work}/mwms"), 2)


@pytest.fixture(scope="module")
def loop_reports(host, work):
    return run_ranks(host, hvd_loop(work), 2)


@pytest.fixture(scope="module")
def fit_reports(host, work):
    return run_ranks(host, hvd_fit(work, f"{work}/hvd-fit"), 2)


@pytest.fixture(scope="module")
def hvd_callbacks_reports(host, work):
    return run_ranks(host, hvd_callbacks(work, f"{work}/hvd-callbacks"), 2)


@pytest.fixture(scope="module")
def callbacks_reports(host, work):
    """The MWMS callbacks script run twice with the same backup directory: 2 epochs, then resumed to 3."""
    first = run_ranks(host, mwms_callbacks(work, 2), 2)
    resumed = run_ranks(host, mwms_callbacks(work, 3), 2)
    events = host.check_output(f"find {work}/mwms-callbacks/logs -name 'events.out.tfevents*' | wc -l")
    return first, resumed, int(events)


def assert_learned_with_equal_weights(reports):
    for report in reports:
        assert report["losses"][-1] < 0.75 * report["losses"][0], report["losses"]
    assert reports[0]["weights_digest"] == reports[1]["weights_digest"]


def test_mwms_fit_learns_and_the_workers_agree(image_layer, mwms_reports):
    assert all(report["workers"] == 2 and report["keras"].startswith("3.") for report in mwms_reports)
    assert_learned_with_equal_weights(mwms_reports)
    assert mwms_reports[0]["losses"] == mwms_reports[1]["losses"]


def test_mwms_chief_checkpoint_reloads_to_the_trained_weights(image_layer, mwms_reports):
    chief = mwms_reports[0]
    assert chief["reloaded_digest"] == chief["weights_digest"]
    assert chief["reloaded_optimizer"] == "SGD"
    assert "reloaded_digest" not in mwms_reports[1]


def test_mwms_evaluate_and_predict(image_layer, mwms_reports):
    assert mwms_reports[0]["evaluate"] == mwms_reports[1]["evaluate"]
    assert mwms_reports[0]["evaluate"]["accuracy"] > 0.8
    for report in mwms_reports:
        assert report["predict_shape"] == [256, 2]
        assert report["predict_accuracy"] > 0.8


def test_mwms_backup_and_restore_resumes_after_the_last_epoch(image_layer, callbacks_reports):
    first, resumed, _ = callbacks_reports
    for report in first:
        assert report["epochs_run"] == [0, 1]
        assert report["backup_files"] == ["latest.weights.h5", "training_metadata.json"]
    for report in resumed:  # asked for 3 epochs, the backup holds 2: only epoch 2 runs, from step 60
        assert report["epochs_run"] == [2]
        assert report["iterations"] == 90
    assert first[0]["weights_digest"] == first[1]["weights_digest"]
    assert resumed[0]["weights_digest"] == resumed[1]["weights_digest"]
    assert resumed[0]["losses"][0] < first[0]["losses"][-1]


def test_mwms_early_stopping_ends_every_worker_after_the_same_epoch(image_layer, callbacks_reports):
    first, resumed, _ = callbacks_reports
    # min_delta 10, patience 0: the second epoch does not improve, the fit ends there (of 5 epochs).
    assert [report["early_stopping_epochs"] for report in first] == [[0, 1], [0, 1]]
    # After a restore, Keras 3 numbers the next fit's epochs from the restored epoch: still 2 epochs.
    assert [len(report["early_stopping_epochs"]) for report in resumed] == [2, 2]


def test_mwms_learning_rate_schedule_and_tensorboard(image_layer, callbacks_reports):
    first, resumed, events = callbacks_reports
    # ExponentialDecay(0.05, decay_steps=30, decay_rate=0.5): halved every epoch of 30 steps.
    for report in first:
        assert report["iterations"] == 60
        assert report["learning_rate"] == pytest.approx(0.05 * 0.5 ** 2, rel=1e-6)
    for report in resumed:
        assert report["learning_rate"] == pytest.approx(0.05 * 0.5 ** 3, rel=1e-6)
    # Both workers are given one log directory: the chief writes its event files there, once per run; the other
    # worker writes beside it and removes its copy (Keras patch 0003).
    assert events == 2




EQUIVALENCE = {
    # name -> (2 ranks, 1 rank), each a function of the work directory and the script's arguments
    "hvd_custom_loop": (
        lambda work, args: f"horovodrun -np 2 python {work}/keras3_hvd_custom_loop_sharded.py {args}",
        lambda work, args: f"python {work}/keras3_hvd_custom_loop_sharded.py {args}"),
    "mwms_custom_loop": (
        lambda work, args: (f"python {script('train/launch_local_mwms.py')} -n 2 --timeout 180 -- "
                            f"python {work}/keras3_mwms_custom_loop_sharded.py {args}"),
        lambda work, args: f"python {work}/keras3_mwms_custom_loop_sharded.py {args}"),
}


@pytest.mark.parametrize("name", list(EQUIVALENCE))
def test_two_ranks_train_like_one_with_twice_the_batch(host, image_layer, work, name):
    two, one = EQUIVALENCE[name]
    # The same initial weights and samples per step (2 ranks x 16 = 1 x 32), the same learning rate: after 20 steps
    # the weights differ by rounding only.
    reports = run_ranks(host, two(work, f"--batch-size 16 --weights-out {work}/{name}-eq2.npz"), 2)
    single = run_ranks(host, one(work, f"--batch-size 32 --weights-out {work}/{name}-eq1.npz"), 1)
    check_two_like_one(host, f"keras3 {name}", reports, single, f"{work}/{name}-eq2.npz", f"{work}/{name}-eq1.npz")


def test_horovod_gradient_tape_learns_and_the_ranks_agree(image_layer, loop_reports):
    assert_learned_with_equal_weights(loop_reports)
    assert [report["allreduce_gap"] for report in loop_reports] == [0.0, 0.0]


def test_horovod_keras_distributed_optimizer_learns_and_the_ranks_agree(image_layer, fit_reports):
    assert_learned_with_equal_weights(fit_reports)


def test_horovod_metric_average_callback_averages_the_epoch_losses(image_layer, fit_reports):
    own = [report["own_last_loss"] for report in fit_reports]
    assert own[0] != own[1]  # each rank its own samples
    for report in fit_reports:
        assert report["losses"][-1] == pytest.approx(sum(own) / 2, rel=1e-5)


def test_horovod_keras_model_saved_by_rank_0_loads_without_horovod(image_layer, fit_reports):
    assert fit_reports[0]["reloaded_optimizer"] == "keras.src.optimizers.sgd.SGD"
    assert fit_reports[0]["reloaded_equal"] is True


def test_horovod_learning_rate_warmup_and_schedule_callbacks(image_layer, hvd_callbacks_reports):
    # Warm-up from 0.04 / 2 to 0.04 over epochs 0-1 (0.03 at the end of epoch 0), 0.04 in epoch 2, 0.004 from epoch 3.
    for report in hvd_callbacks_reports:
        assert report["learning_rates"] == pytest.approx([0.03, 0.04, 0.04, 0.004], rel=1e-6)
    assert_learned_with_equal_weights(hvd_callbacks_reports)


def test_horovod_load_model_wraps_the_keras3_optimizer_and_keeps_its_state(image_layer, hvd_callbacks_reports):
    for report in hvd_callbacks_reports:
        assert report["loaded_equal"] is True
        assert report["loaded_distributed"] is True
        assert report["loaded_optimizer"] == "keras.src.optimizers.sgd.SGD"
        assert report["loaded_iterations"] == 120
        assert report["loaded_learning_rate"] == pytest.approx(0.004, rel=1e-6)
    # One more epoch, each rank its own samples: the ranks stay equal only because the gradients are averaged.
    assert hvd_callbacks_reports[0]["trained_on_digest"] == hvd_callbacks_reports[1]["trained_on_digest"]
    assert hvd_callbacks_reports[0]["trained_on_digest"] != hvd_callbacks_reports[0]["weights_digest"]


# ---------------------------------------------------------------------------------------------------------------- #
# Each patch is needed: the same script with that patch reversed fails with the error its header names.

# 0011 and 0012 change lines that 0007 added (and 0006 needs 0007 reversed first): they are reversed with it, last first.
LATER_KERAS_PATCHES = ["0012-keras3-backward-passes-per-step.patch", "0011-keras3-partial-distributed.patch"]

WITHOUT = {
    # patch reversed (with any later patch of the same package that needs it) -> (command, expected error)
    "keras/0001-mwms-first-batch-build.patch": (
        "keras", ["0001-mwms-first-batch-build.patch"], lambda work: mwms(work, f"{work}/mwms-without"),
        "Attempt to convert a value (PerReplica"),
    "keras/0002-mwms-scalar-reduce.patch": (
        "keras", ["0002-mwms-scalar-reduce.patch"], lambda work: mwms(work, f"{work}/mwms-without"),
        "Invalid reduction dimension 0 for input with 0 dimensions"),
    "horovod/0006-keras3-variables.patch": (
        "horovod", [*LATER_KERAS_PATCHES, "0007-keras3-distributed-optimizer.patch", "0006-keras3-variables.patch"],
        hvd_loop,
        "'Variable' object has no attribute 'ref'"),
    "horovod/0007-keras3-distributed-optimizer.patch": (
        "horovod", [*LATER_KERAS_PATCHES, "0007-keras3-distributed-optimizer.patch"],
        lambda work: hvd_fit(work, f"{work}/hvd-fit-without"),
        "'Variable' object has no attribute 'ref'"),
    "horovod/0008-keras3-lr-callbacks-load-model.patch": (
        "horovod", ["0008-keras3-lr-callbacks-load-model.patch"],
        lambda work: hvd_callbacks(work, f"{work}/hvd-callbacks-without"),
        "'SGD' object has no attribute 'lr'"),
}


@pytest.mark.patch_reversal
@pytest.mark.parametrize("patch", list(WITHOUT))
def test_the_script_fails_without_the_patch(host, image_layer, work, patch):
    package, reversed_patches, command, error = WITHOUT[patch]
    listed = CONFIG.keras_patches if package == "keras" else CONFIG.horovod_patches
    assert all(name in listed for name in reversed_patches), f"{patch} is no longer listed: drop its test"
    patch_dir = KERAS_PATCHES if package == "keras" else HOROVOD_PATCHES
    host.check_output(f"mkdir -p {work}/mwms-without {work}/hvd-fit-without {work}/hvd-callbacks-without")
    assert_fails_without(host, f"{work}/without-{patch.replace('/', '-')}", package, patch_dir, reversed_patches,
                         f"cd {work} && {command(work)}", error)


def assert_fails_without(host, overlay, package, patch_dir, reversed_patches, command, error):
    """Runs `command` with a copy of the installed `package` (symbolic links, in directory `overlay`) first on
    PYTHONPATH, `reversed_patches` (of `patch_dir`) reversed in it; it must fail with `error` in its output."""
    host.check_output(f"mkdir -p {overlay} && cp -rs {PURELIB}/{package} {overlay}/")
    for name in reversed_patches:
        put(host, (patch_dir / name).read_text(), f"{overlay}/{name}")
        host.check_output(f"python -c {shlex.quote(REVERSE)} {overlay}/{name} {overlay}")
    result = host.run(f"export PYTHONPATH={overlay}${{PYTHONPATH:+:$PYTHONPATH}}; {command}")
    output = result.stdout + result.stderr
    assert result.rc != 0, output[-3000:]
    assert error in output, output[-3000:]


@pytest.fixture(scope="module")
def mwms_loop_reports(host, work):
    return run_ranks(host, f"python {script('train/launch_local_mwms.py')} -n 2 --timeout 180 "
                           f"python {work}/keras3_mwms_custom_loop.py --epochs 3", 2)


def test_mwms_custom_loop_learns_and_the_workers_agree(image_layer, mwms_loop_reports):
    """examples/keras3_mwms_custom_loop.py: strategy.run of a GradientTape step, Keras 3 optimizer, 2 workers."""
    assert [report["size"] for report in mwms_loop_reports] == [2, 2]
    assert_learned_with_equal_weights(mwms_loop_reports)
    assert mwms_loop_reports[0]["losses"] == mwms_loop_reports[1]["losses"]


def test_the_image_ships_the_examples(host, image_layer):
    """Every file of examples/ is in the image at /opt/tfhpc/examples, as committed."""
    for path in sorted(p for p in (REPO_ROOT / "examples").rglob("*") if p.is_file()):
        inside = f"/opt/tfhpc/examples/{path.relative_to(REPO_ROOT / 'examples')}"
        assert host.file(inside).content_string == path.read_text(), inside


# ---------------------------------------------------------------------------------------------------------------- #
# tf.keras as Keras 3 (TF_USE_LEGACY_KERAS=0, as TensorFlow >= 2.16 has it by default): the same user scripts with
# `from tensorflow import keras` instead of `import keras`, Horovod's DistributedOptimizer, warm-up, schedule and
# broadcast callbacks and hvd.load_model, and MultiWorkerMirroredStrategy fit with its chief checkpoint.

TF_KERAS3 = {"hvd": "keras3_hvd_keras_callbacks.py", "mwms": "keras3_mwms_fit.py"}
# The 2-rank runs of those scripts through tf.keras are the full tier's: with TF_USE_LEGACY_KERAS=0, tf.keras hands
# out Keras 3's own objects (test_tf_keras_is_keras_3_itself), so they run the code of the `import keras` runs above.
SAME_OBJECTS = pytest.mark.full("tf.keras's objects are keras's (test_tf_keras_is_keras_3_itself); the same scripts "
                                "with `import keras`: test_horovod_learning_rate_warmup_and_schedule_callbacks, "
                                "test_mwms_fit_learns_and_the_workers_agree")
# Runs in the container with TF_USE_LEGACY_KERAS=0: which of the objects the scripts take from tf.keras are Keras 3's
# own, and the class Horovod's DistributedOptimizer makes of a tf.keras optimizer (one process, hvd.init of size 1).
TF_KERAS_OBJECTS = """
import json
import keras
import tensorflow as tf
import horovod.tensorflow.keras as hvd
hvd.init()
names = ["Model", "Sequential", "layers.Dense", "optimizers.SGD", "optimizers.schedules.ExponentialDecay",
         "callbacks.ModelCheckpoint", "callbacks.BackupAndRestore", "callbacks.TensorBoard", "models.load_model"]
def get(root, name):
    for part in name.split("."):
        root = getattr(root, part)
    return root
optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01))
print(json.dumps({"same": {name: get(tf.keras, name) is get(keras, name) for name in names},
                  "versions": [tf.keras.__version__, keras.__version__],
                  "distributed": [isinstance(optimizer, keras.optimizers.Optimizer),
                                  type(optimizer).__mro__[1].__module__]}))
"""


def test_tf_keras_is_keras_3_itself(host, image_layer):
    found = json.loads(host.check_output(f"TF_USE_LEGACY_KERAS=0 python -c {shlex.quote(TF_KERAS_OBJECTS)}")
                       .splitlines()[-1])
    assert all(found["same"].values()), found["same"]
    assert found["versions"][0] == found["versions"][1] and found["versions"][0].startswith("3."), found["versions"]
    assert found["distributed"] == [True, "keras.src.optimizers.sgd"], found["distributed"]


@pytest.fixture(scope="module")
def tf_keras3_reports(host, work):
    for name in TF_KERAS3.values():
        text = (USER_SCRIPTS / name).read_text()
        assert text.count("\nimport keras\n") == 1, name
        put(host, text.replace("\nimport keras\n", "\nfrom tensorflow import keras\n"), f"{work}/tf_{name}")
    host.check_output(f"mkdir -p {work}/tf-keras3-hvd {work}/tf-keras3-mwms")
    hvd = run_ranks(host, f"TF_USE_LEGACY_KERAS=0 horovodrun -np 2 python {work}/tf_{TF_KERAS3['hvd']} "
                          f"{work}/tf-keras3-hvd", 2)
    mwms = run_ranks(host, f"TF_USE_LEGACY_KERAS=0 python {script('train/launch_local_mwms.py')} -n 2 --timeout 180 "
                           f"-- python {work}/tf_{TF_KERAS3['mwms']} {work}/tf-keras3-mwms", 2)
    return hvd, mwms


@SAME_OBJECTS
def test_tf_keras_as_keras3_with_horovod_optimizer_callbacks_and_load_model(image_layer, tf_keras3_reports):
    hvd, _ = tf_keras3_reports
    for report in hvd:
        assert report["learning_rates"] == pytest.approx([0.03, 0.04, 0.04, 0.004], rel=1e-6)
        assert (report["loaded_optimizer"], report["loaded_distributed"]) == ("keras.src.optimizers.sgd.SGD", True)
        assert report["loaded_iterations"] == 120 and report["loaded_equal"] is True
    assert_learned_with_equal_weights(hvd)
    assert hvd[0]["trained_on_digest"] == hvd[1]["trained_on_digest"] != hvd[0]["weights_digest"]


@SAME_OBJECTS
def test_tf_keras_as_keras3_with_mwms_fit(image_layer, tf_keras3_reports):
    _, mwms = tf_keras3_reports
    assert [(r["workers"], r["keras"].split(".")[0]) for r in mwms] == [(2, "3"), (2, "3")]  # tf.keras.__version__
    assert_learned_with_equal_weights(mwms)
    assert mwms[0]["reloaded_digest"] == mwms[0]["weights_digest"] and mwms[0]["reloaded_optimizer"] == "SGD"
