"""What every test directory shares: the checkout, the manifest, the configuration `make test` selected (STACK, FLAVOR,
MPI, ARCH from the environment) and the values the collectives smoke test must report. This is the suite's one
configuration: module-level constants, since skip marks and parametrisations need them at import time (the root
conftest's `manifest` and `config` fixtures only hand these out). tests/ is on sys.path (pytest puts the root
conftest's directory there), so any test module or conftest can `from support.stack import CONFIG`."""
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tfhpc.manifest import Manifest  # noqa: E402

MANIFEST = Manifest()
CONFIG = MANIFEST.config(os.environ.get("STACK") or None, os.environ.get("FLAVOR") or None,
                         os.environ.get("MPI") or None, os.environ.get("ARCH") or None)
LEAF = MANIFEST.layers.leaf
# The Keras the training entrypoints run with by default (docs/keras.md): Keras 3 where TensorFlow has it.
DEFAULT_KERAS = "3" if "tf_keras" in CONFIG.versions else "2"


def expected_collectives(size, sizes, dtypes):
    """The allreduce values scripts/smoke/hvd_collectives.py must report on `size` ranks, derived here independently
    of the script: rank r sends 2 * (r + 1) * (i % 7) at index i, summed or averaged over the ranks."""
    expected = {}
    for n in sizes:
        pattern_sum = float(sum(i % 7 for i in range(n)))
        for dtype in dtypes:
            expected[f"sum/{dtype}/{n}"] = pattern_sum * size * (size + 1)
            expected[f"average/{dtype}/{n}"] = pattern_sum * (size + 1)
    return expected


# An mpi4py program whose RESULT line says which single-copy path its rank took (tfhpc_runtime/singlecopy.py) and
# whether a 16 MB float32 allreduce, far above the size from which Open MPI's vader and MPICH copy with CMA, was exact.
SINGLE_COPY_ALLREDUCE = """
import json, os
import numpy as np
from mpi4py import MPI
world = MPI.COMM_WORLD
data = np.full(4 * 1024 * 1024, world.rank + 1, dtype=np.float32)
total = np.empty_like(data)
world.Allreduce(data, total)
names = ("TFHPC_SINGLE_COPY", "OMPI_MCA_btl_vader_single_copy_mechanism", "MPIR_CVAR_CH4_CMA_ENABLE", "OMPI_MCA_smsc")
print("RESULT " + json.dumps({"rank": world.rank, "size": world.size,
                              "exact": bool((total == world.size * (world.size + 1) / 2).all()),
                              "environment": {name: os.environ.get(name) for name in names}}), flush=True)
"""
