"""The arm64 stack under emulation: the images are aarch64, TensorFlow computes, MPI reduces across 2 ranks, and, where
the horovod layer is built, Horovod's build, its 2-rank collectives and a 2-rank training (values checked)."""
import json
import platform
import shlex

import pytest

from support.collectives import check_collective_reports
from support.results import results
from support.stack import CONFIG

# A small matrix product with a known result: TensorFlow's CPU kernels for aarch64 run (through qemu here).
TENSORFLOW_PROGRAM = """
import json, platform
import tensorflow as tf
x = tf.constant([[1.0, 2.0], [3.0, 4.0]])
print("RESULT " + json.dumps({"rank": 0, "machine": platform.machine(), "version": tf.__version__,
                              "product": tf.linalg.matmul(x, x).numpy().tolist(),
                              "sum": float(tf.reduce_sum(tf.range(1000, dtype=tf.float64)).numpy())}))
"""

# Each rank contributes rank + 1 (a scalar and a vector of doubles): the sums on 2 ranks are 3. Buffers from the
# standard library's array: the mpi layer has no numpy (TensorFlow's layer brings it).
MPI4PY_PROGRAM = """
import array, json, platform
from mpi4py import MPI
world = MPI.COMM_WORLD
vector = array.array("d", [world.rank + 1.0] * 1000)
total = array.array("d", [0.0] * 1000)
world.Allreduce([vector, MPI.DOUBLE], [total, MPI.DOUBLE])
print("RESULT " + json.dumps({"rank": world.rank, "size": world.size, "machine": platform.machine(),
                              "scalar": world.allreduce(world.rank + 1),
                              "vector": sorted(set(total)),
                              "library": MPI.Get_library_version().splitlines()[0]}), flush=True)
"""


def run(host, command):
    result = host.run(command)
    assert result.rc == 0, f"{command} exited {result.rc}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def python(program):
    return f"python -c {shlex.quote(program)}"


def test_the_image_is_aarch64(host, top_layer, docker_client):
    assert run(host, "uname -m").strip() == CONFIG.machine
    assert docker_client.images.get(CONFIG.image(top_layer)).attrs["Architecture"] == CONFIG.arch
    assert docker_client.images.get(CONFIG.image(top_layer)).labels["io.tfhpc.platform"] == CONFIG.platform


def test_the_doctors_architecture_check_names_the_emulation(host, needs, scripts):
    # tfhpc_runtime.cpuarch from the scripts the container has (the doctor itself needs the app layer): on an x86 host
    # qemu-user passes the host's /proc/cpuinfo through, so aarch64 programs see an x86 processor.
    needs("mpi")
    program = "import json; from tfhpc_runtime import cpuarch; print(json.dumps(cpuarch.describe()))"
    described = json.loads(run(host, f"env PYTHONPATH={scripts}/runtime python3 -c {shlex.quote(program)}"))
    assert described["machine"] == CONFIG.machine
    assert described["emulated"] is (platform.machine() != CONFIG.machine), (platform.machine(), described)


def test_tensorflow_computes(host, needs):
    needs("tensorflow")
    (report,) = results(run(host, python(TENSORFLOW_PROGRAM)), 1)
    assert report["machine"] == CONFIG.machine
    assert report["version"] == CONFIG.versions["tensorflow"]
    assert report["product"] == [[7.0, 10.0], [15.0, 22.0]]
    assert report["sum"] == 499500.0


def test_mpi4py_two_rank_allreduce(host, needs):
    needs("mpi")
    reports = results(run(host, f"mpirun -np 2 {python(MPI4PY_PROGRAM)}"), 2)
    for report in reports:
        assert report["size"] == 2 and report["machine"] == CONFIG.machine
        assert report["scalar"] == 3 and report["vector"] == [3.0], report
    assert ("Open MPI" if CONFIG.mpi == "openmpi" else "MPICH") in reports[0]["library"]


def test_horovod_check_build(host, needs):
    needs("horovod")
    out = run(host, "horovodrun --check-build")
    assert f"Horovod v{CONFIG.versions['horovod']}" in out
    for line in ("[X] TensorFlow", "[X] MPI", "[X] Gloo"):
        assert line in out, out


@pytest.mark.parametrize("launcher, controller", [("horovodrun -np 2 --mpi", "mpi"),
                                                  ("horovodrun -np 2 --gloo", "gloo")])
def test_horovod_two_rank_collectives_exact(host, needs, scripts, launcher, controller):
    needs("horovod")
    out = run(host, f"{launcher} python {scripts}/smoke/hvd_collectives.py --sizes 1,4096 --dtypes float32,int32")
    check_collective_reports(results(out, 2), 2, (1, 4096), ("float32", "int32"), controller)


def test_horovod_two_rank_training_converges_with_equal_weights(host, needs, scripts):
    needs("horovod")
    reports = results(run(host, f"horovodrun -np 2 python {scripts}/smoke/hvd_keras_train.py --epochs 4"), 2)
    for report in reports:
        assert report["size"] == 2
        assert report["losses"][-1] < 0.5 * report["losses"][0], report["losses"]
        assert report["max_weight_difference_across_ranks"] == 0.0
    assert reports[0]["weights_sum"] == reports[1]["weights_sum"], json.dumps(reports)[-2000:]
