"""`horovodrun` (its MPI path, not Gloo) in the MPICH app image: it asks `mpirun --version` which MPI it launches, and
Debian's MPICH answers with "HYDRA build details" only; Horovod patch 0013 (containers/horovod/patches) makes that
MPICH. Checked: both ranks report Horovod's MPI controller and exact collectives; with the patch reversed (a copy of
the installed package as symbolic links, first on PYTHONPATH), horovodrun stops with "Unknown MPI implementation"."""
import shlex
import subprocess

import pytest

from site_helpers import MPICH_CONFIG
from support.collectives import check_collectives, smoke_arguments
from support.patches import HOROVOD_PATCHES, PURELIB, REVERSE

PATCH = "0013-mpich-hydra-detection.patch"
HOROVODRUN = f"horovodrun -np 2 -H localhost:2 tfhpc-smoke-collectives {smoke_arguments()}"


def run(image, script, timeout=300):
    argv = ["docker", "run", "--rm", "--label", "io.tfhpc.test-runtime=sites", "-v", f"{HOROVOD_PATCHES}:/patches:ro",
            "--entrypoint", "sh", image, "-c", script]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return result.returncode, result.stdout + result.stderr


def test_horovodrun_starts_mpich_ranks_with_exact_collectives(mpich_image):
    rc, out = run(mpich_image, HOROVODRUN)
    assert rc == 0, out[-3000:]
    check_collectives(out, controller="mpi")


@pytest.mark.patch_reversal
def test_horovodrun_fails_on_mpich_without_the_patch(mpich_image):
    assert PATCH in MPICH_CONFIG.horovod_patches, f"{PATCH} is no longer listed: drop this test"
    rc, out = run(mpich_image, f"mkdir -p /tmp/without && cp -rs {PURELIB}/horovod /tmp/without/ && "
                               f"python -c {shlex.quote(REVERSE)} /patches/{PATCH} /tmp/without && "
                               f"PYTHONPATH=/tmp/without {HOROVODRUN}")
    assert rc != 0, out[-3000:]
    assert "Unknown MPI implementation given in output of mpirun --version" in out, out[-3000:]
