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
  loads without Horovod as Keras' own SGD.
Without a patch (a copy of the installed package, as symbolic links, with that patch reversed, first on PYTHONPATH),
the same script fails with the error the patch's header names.

These tests live with the app layer, although the Keras patches are the tensorflow layer's: the scripts need
Horovod and the MWMS launcher, and a run on every image below would multiply the time for no new coverage.
"""
import shlex

import pytest

from conftest import CONFIG, run_ranks, script
from tfhpc import REPO_ROOT

WORK = "/tmp/tfhpc-keras3-tests"
USER_SCRIPTS = REPO_ROOT / "examples"  # shipped in the image at /opt/tfhpc/examples
KERAS_PATCHES = REPO_ROOT / "containers" / "tensorflow" / "patches" / "keras"
HOROVOD_PATCHES = REPO_ROOT / "containers" / "horovod" / "patches"
PURELIB = "$(python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')"

pytestmark = pytest.mark.skipif(not CONFIG.keras_patches, reason="the stack has no Keras 3 (TensorFlow < 2.16)")

# Reverses a unified diff under a directory of symbolic links to the installed package (cp -rs), in Python (the image
# has no `patch`): each hunk's new text must occur exactly once in its file and becomes the old text; a changed file
# replaces its link, the installed file stays as it is.
REVERSE = r"""
import os, re, sys
patch, root = open(sys.argv[1]).read(), sys.argv[2]
for section in re.split(r'^--- a/', patch, flags=re.M)[1:]:
    path = section.splitlines()[1][len('+++ b/'):]
    text = open(f'{root}/{path}').read()
    for hunk in re.split(r'^@@[^\n]*\n', section, flags=re.M)[1:]:
        lines = [line for line in hunk.splitlines(keepends=True) if line[:1] in (' ', '-', '+')]
        old = ''.join(line[1:] for line in lines if line[0] in ' -')
        new = ''.join(line[1:] for line in lines if line[0] in ' +')
        assert text.count(new) == 1, (path, new)
        text = text.replace(new, old)
    os.remove(f'{root}/{path}')
    open(f'{root}/{path}', 'w').write(text)
"""


def put(host, text, path):
    host.check_output(f"printf '%s' {shlex.quote(text)} > {path}")


@pytest.fixture(scope="module")
def work(host):
    host.check_output(f"rm -rf {WORK} && mkdir -p {WORK}/mwms {WORK}/hvd-fit")
    for user_script in USER_SCRIPTS.glob("keras3_*.py"):
        put(host, user_script.read_text(), f"{WORK}/{user_script.name}")
    return WORK


def mwms(work, out_dir):
    return (f"python {script('train/launch_local_mwms.py')} -n 2 --timeout 180 -- "
            f"python {work}/keras3_mwms_fit.py {out_dir}")


def hvd_loop(work):
    return f"horovodrun -np 2 python {work}/keras3_hvd_custom_loop.py"


def hvd_fit(work, out_dir):
    return f"horovodrun -np 2 python {work}/keras3_hvd_fit.py {out_dir}"


@pytest.fixture(scope="module")
def mwms_reports(host, work):
    return run_ranks(host, mwms(work, f"{work}/mwms"), 2)


@pytest.fixture(scope="module")
def loop_reports(host, work):
    return run_ranks(host, hvd_loop(work), 2)


@pytest.fixture(scope="module")
def fit_reports(host, work):
    return run_ranks(host, hvd_fit(work, f"{work}/hvd-fit"), 2)


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


# ---------------------------------------------------------------------------------------------------------------- #
# Each patch is needed: the same script with that patch reversed fails with the error its header names.

WITHOUT = {
    # patch reversed (with any later patch of the same package that needs it) -> (command, expected error)
    "keras/0001-mwms-first-batch-build.patch": (
        "keras", ["0001-mwms-first-batch-build.patch"], lambda work: mwms(work, f"{work}/mwms-without"),
        "Attempt to convert a value (PerReplica"),
    "keras/0002-mwms-scalar-reduce.patch": (
        "keras", ["0002-mwms-scalar-reduce.patch"], lambda work: mwms(work, f"{work}/mwms-without"),
        "Invalid reduction dimension 0 for input with 0 dimensions"),
    "horovod/0006-keras3-variables.patch": (
        "horovod", ["0007-keras3-distributed-optimizer.patch", "0006-keras3-variables.patch"], hvd_loop,
        "'Variable' object has no attribute 'ref'"),
    "horovod/0007-keras3-distributed-optimizer.patch": (
        "horovod", ["0007-keras3-distributed-optimizer.patch"], lambda work: hvd_fit(work, f"{work}/hvd-fit-without"),
        "'Variable' object has no attribute 'ref'"),
}


@pytest.mark.parametrize("patch", list(WITHOUT))
def test_the_script_fails_without_the_patch(host, image_layer, work, patch):
    package, reversed_patches, command, error = WITHOUT[patch]
    listed = CONFIG.keras_patches if package == "keras" else CONFIG.horovod_patches
    assert all(name in listed for name in reversed_patches), f"{patch} is no longer listed: drop its test"
    patch_dir = KERAS_PATCHES if package == "keras" else HOROVOD_PATCHES
    overlay = f"{work}/without-{patch.replace('/', '-')}"
    host.check_output(f"mkdir -p {overlay} {work}/mwms-without {work}/hvd-fit-without && "
                      f"cp -rs {PURELIB}/{package} {overlay}/")
    for name in reversed_patches:
        put(host, (patch_dir / name).read_text(), f"{overlay}/{name}")
        host.check_output(f"python -c {shlex.quote(REVERSE)} {overlay}/{name} {overlay}")
    result = host.run(f"cd {work} && PYTHONPATH={overlay}${{PYTHONPATH:+:$PYTHONPATH}} {command(work)}")
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
