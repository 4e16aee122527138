"""More of Horovod's TensorFlow and Keras API with Keras 3, on 2 ranks: the parts that Horovod's own suites
(`make upstream-tests`, docs/keras.md) found broken beyond test_keras3.py's optimizer, tape and callbacks, each with
the Horovod patch that fixes it and proof that the patch is needed. The user scripts are in keras3_scripts/:
- hvd.SyncBatchNormalization in a Keras 3 model (patch 0010; tf.keras is Keras 3 under TF_USE_LEGACY_KERAS=0, the
  layer's base): each rank's batch normalized with the statistics of both ranks' samples;
- hvd.PartialDistributedGradientTape and horovod.keras.PartialDistributedOptimizer with a Keras 3 local layer
  (patch 0011, `import keras` under the image's TF_USE_LEGACY_KERAS=1): the local layer's gradient is the rank's own
  / size, the others' the average of the ranks'; after 5 steps the shared layer is equal on the ranks, the local not;
- hvd.DistributedOptimizer(backward_passes_per_step=2) in a Keras 3 `fit` (patch 0012): the weights equal those of a
  loop without Horovod that applies the average of 2 batches of every rank every 2nd batch;
- hvd.elastic.KerasState around a Keras 3 model and Adam (patch 0009): sync() gives every rank rank 0's weights and
  optimizer variables, restore() brings back what sync() or commit() saved.
Without a patch (reversed in a symbolic-link copy of the installed package, first on PYTHONPATH, as in
test_keras3.py), the same script fails with the error its header names.
"""
import pytest

from conftest import CONFIG, run_ranks
from test_keras3 import HOROVOD_PATCHES, assert_fails_without, put
from tfhpc import REPO_ROOT

WORK = "/tmp/tfhpc-keras3-horovod-api"
USER_SCRIPTS = REPO_ROOT / "tests" / "images" / "app" / "keras3_scripts"

pytestmark = pytest.mark.skipif(not CONFIG.keras_patches, reason="the stack has no Keras 3 (TensorFlow < 2.16)")

RUNS = {
    # name -> (environment, script)
    "sync_batch_norm": ("TF_USE_LEGACY_KERAS=0", "hvd_sync_batch_norm.py"),
    "partial": ("", "hvd_partial_distributed.py"),
    "backward_passes": ("", "hvd_backward_passes.py"),
    "elastic_state": ("", "hvd_elastic_state.py"),
}


def command(work, name):
    environment, user_script = RUNS[name]
    return f"cd {work} && {environment} horovodrun -np 2 python {work}/{user_script}"


@pytest.fixture(scope="module")
def work(host):
    host.check_output(f"rm -rf {WORK} && mkdir -p {WORK}")
    for user_script in USER_SCRIPTS.glob("*.py"):
        put(host, user_script.read_text(), f"{WORK}/{user_script.name}")
    return WORK


@pytest.fixture(scope="module")
def reports(host, work):
    """reports(name): the RESULT lines of RUNS[name] on 2 ranks, run once for every test that asks."""
    done = {}

    def get(name):
        if name not in done:
            done[name] = run_ranks(host, command(work, name), 2)
        return done[name]
    return get


def test_sync_batch_norm_normalizes_with_the_statistics_of_every_rank(image_layer, reports):
    for report in reports("sync_batch_norm"):
        assert report["keras"].startswith("3.") and report["layer_class"].startswith("keras.src.")
        assert report["own_mean_gap"] > 0.1  # a rank's own statistics would be wrong
        assert report["moving_mean_gap"] < 1e-5 and report["moving_variance_gap"] < 1e-5
        assert report["output_gap"] < 1e-5


def test_partial_tape_and_optimizer_keep_the_local_layer_local(image_layer, reports):
    ranks = reports("partial")
    for report in ranks:
        assert report["keras"].startswith("3.")
        assert report["local_gradient_differs"]  # the ranks' own gradients differ from their average
        assert report["tape_gap"] < 1e-6 and report["optimizer_gap"] < 1e-6
        assert report["iterations"] == 5
    assert ranks[0]["shared_digest"] == ranks[1]["shared_digest"]
    assert ranks[0]["local_digest"] != ranks[1]["local_digest"]


def test_backward_passes_per_step_applies_the_average_of_every_second_batch(image_layer, reports):
    ranks = reports("backward_passes")
    for report in ranks:
        assert report["moved"] > 0.1
        assert report["reference_gap"] < 1e-5
        assert report["iterations"] == 8  # every batch counts, as with tf_keras
        assert report["counter"] == 0  # 8 batches: the last one allreduced and applied
    assert ranks[0]["weights_digest"] == ranks[1]["weights_digest"]


def test_elastic_state_syncs_and_restores_the_keras3_optimizer(image_layer, reports):
    ranks = reports("elastic_state")
    for report in ranks:
        assert report["optimizer_variables"] > 2  # iterations, learning rate and Adam's slots
        assert report["epoch"] == 10  # rank 0's
        assert report["changed"] > 0  # the steps after sync() and commit() moved the values
        assert report["restored_gap"] == 0.0 and report["committed_gap"] == 0.0
    assert ranks[0]["synced_digest"] == ranks[1]["synced_digest"]


WITHOUT = {
    # patch -> (patches reversed: the patch and every later one that needs it, run, expected error)
    "0010-keras3-sync-batch-norm.patch": (
        ["0010-keras3-sync-batch-norm.patch"], "sync_batch_norm",
        "Unrecognized keyword arguments passed to SyncBatchNormalization: {'fused': False}"),
    "0011-keras3-partial-distributed.patch": (
        ["0012-keras3-backward-passes-per-step.patch", "0011-keras3-partial-distributed.patch"], "partial",
        "All local layers must be of tf.keras.layers.Layer type."),
    "0012-keras3-backward-passes-per-step.patch": (
        ["0012-keras3-backward-passes-per-step.patch"], "backward_passes",
        "backward_passes_per_step > 1 is not supported with a Keras 3 optimizer"),
    "0009-keras3-elastic-state.patch": (
        ["0009-keras3-elastic-state.patch"], "elastic_state", "'list' object is not callable"),
}


@pytest.mark.patch_reversal
@pytest.mark.parametrize("patch", list(WITHOUT))
def test_the_script_fails_without_the_patch(host, image_layer, work, patch):
    reversed_patches, name, error = WITHOUT[patch]
    assert all(p in CONFIG.horovod_patches for p in reversed_patches), f"{patch} is no longer listed: drop its test"
    assert_fails_without(host, f"{work}/without-{patch}", "horovod", HOROVOD_PATCHES, reversed_patches,
                         command(work, name), error)
