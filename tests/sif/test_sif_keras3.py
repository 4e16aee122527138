"""Keras 3 (`import keras`) from the SIF: the shipped examples (/opt/tfhpc/examples, as committed: test_keras3.py
checks the copies) run unchanged on 2 ranks with `apptainer exec` as an unprivileged user: Horovod's
DistributedOptimizer and callbacks under the SIF's mpirun, MultiWorkerMirroredStrategy fit through
tfhpc-launch-local-mwms. One run of each serves every assertion on it."""
import pytest

from support.results import results
from support.stack import CONFIG

# The examples' code is the image's, the same in Docker and in the SIF: tests/images/app/test_keras3.py runs them
# unchanged on 2 ranks in the test tier. What the SIF adds, apptainer starting the image's ranks under its mpirun and
# MWMS workers from the SIF, is the test tier's in tests/sif/test_sif.py (the user's scripts under the SIF's mpirun)
# and tests/cluster/test_slurm.py (MWMS from the SIF on 2 nodes: the Jean Zay job, the Keras files job's Keras 3
# column).
pytestmark = [pytest.mark.skipif(not CONFIG.keras_patches, reason="the stack has no Keras 3 (TensorFlow < 2.16)"),
              pytest.mark.full("the examples in Docker: tests/images/app/test_keras3.py; the SIF's 2-rank runs: "
                               "tests/sif/test_sif.py; MWMS from the SIF: tests/cluster/test_slurm.py")]

EXAMPLES = "/opt/tfhpc/examples"
WORK = "/tmp/keras3-sif"


def run_example(user_host, in_sif, launcher, example):
    """One shipped example on 2 ranks in the SIF, its output directory its own; the RESULT of each rank."""
    out_dir = f"{WORK}/{example}"
    user_host.check_output(f"rm -rf {out_dir} && mkdir -p {out_dir}")
    return results(user_host.check_output(f"apptainer exec {in_sif} {launcher} python {EXAMPLES}/{example}.py "
                                          f"{out_dir}"), 2)


@pytest.fixture(scope="module")
def hvd_fit(user_host, in_sif):
    return run_example(user_host, in_sif, "mpirun -np 2", "keras3_hvd_fit")


@pytest.fixture(scope="module")
def mwms_fit(user_host, in_sif):
    return run_example(user_host, in_sif, "tfhpc-launch-local-mwms -n 2 --timeout 180", "keras3_mwms_fit")


def test_horovod_keras3_fit_learns_with_equal_weights_on_both_ranks(hvd_fit):
    assert [r["size"] for r in hvd_fit] == [2, 2]
    for report in hvd_fit:
        assert report["losses"][-1] < 0.75 * report["losses"][0], report["losses"]
    assert hvd_fit[0]["weights_digest"] == hvd_fit[1]["weights_digest"]
    assert hvd_fit[0]["own_last_loss"] != hvd_fit[1]["own_last_loss"]  # each rank its own samples
    assert (hvd_fit[0]["reloaded_optimizer"], hvd_fit[0]["reloaded_equal"]) == ("keras.src.optimizers.sgd.SGD", True)


def test_mwms_keras3_fit_learns_with_equal_weights_on_both_workers(mwms_fit):
    assert [(r["workers"], r["keras"].split(".")[0]) for r in mwms_fit] == [(2, "3"), (2, "3")]
    for report in mwms_fit:
        assert report["losses"][-1] < 0.75 * report["losses"][0], report["losses"]
    assert mwms_fit[0]["weights_digest"] == mwms_fit[1]["weights_digest"]
    assert mwms_fit[0]["reloaded_digest"] == mwms_fit[0]["weights_digest"]
    assert mwms_fit[0]["evaluate"] == mwms_fit[1]["evaluate"] and mwms_fit[0]["evaluate"]["accuracy"] > 0.8
