"""Weights compared inside a container (numpy there, not on the host): how far two runs' weights are apart, and the
check that 2 ranks train like 1 rank with twice the batch."""
import shlex

import pytest

EQUIVALENCE_TOLERANCE = 1e-4  # float32 rounding of 20 SGD steps stays far below; a missed average is far above


def max_difference(host, first, second):
    """Largest absolute difference between two weight .npz files (compared inside the container, with numpy)."""
    code = ("import numpy as np, sys; a, b = np.load(sys.argv[1]), np.load(sys.argv[2]); "
            "assert a.files == b.files, (a.files, b.files); "
            "print(max(float(np.abs(a[k] - b[k]).max()) for k in a.files))")
    return float(host.check_output(f"python -c {shlex.quote(code)} {first} {second}"))


def check_two_like_one(host, name, two_reports, one_reports, two_weights, one_weights):
    """2 ranks x 16 and 1 rank x 32 (the same global batch and samples per step): weights equal to
    EQUIVALENCE_TOLERANCE after training moved them by far more, and the same losses."""
    assert two_reports[0]["global_batch"] == one_reports[0]["global_batch"] == 32
    difference = max_difference(host, one_weights, two_weights)
    print(f"{name}: 2x16 vs 1x32: max |dw| = {difference:.3g}, weights moved {one_reports[0]['max_weight_change']:.3g}")
    assert difference <= EQUIVALENCE_TOLERANCE, difference
    assert one_reports[0]["max_weight_change"] > 100 * EQUIVALENCE_TOLERANCE, "training must have moved the weights"
    assert two_reports[0]["losses"] == pytest.approx(one_reports[0]["losses"], rel=1e-4)
