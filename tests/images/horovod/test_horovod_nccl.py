"""The GPU flavour's Horovod (issue 6): built with NCCL next to MPI and Gloo, linked to the NCCL wheel TensorFlow loads,
every shared library resolvable without a driver except libcuda (which --nv or the NVIDIA runtime injects)."""
import pytest

from support.stack import CONFIG

pytestmark = pytest.mark.skipif(CONFIG.flavor != "gpu", reason="GPU flavour only (run with FLAVOR=gpu)")

SITE = f"/opt/venv/lib/python{CONFIG.os['python']}/site-packages"


def test_check_build_shows_nccl_mpi_and_gloo(host, image_layer):
    out = host.check_output("horovodrun --check-build 2>/dev/null")
    for line in ("[X] NCCL", "[X] MPI", "[X] Gloo", "[X] TensorFlow"):
        assert line in out, out
    assert host.check_output("python -c 'import horovod.tensorflow as h; print(h.nccl_built())' 2>/dev/null") != "0"


def test_horovod_links_the_nccl_tensorflow_loads(host, image_layer):
    library = host.check_output(f"ls {SITE}/horovod/tensorflow/mpi_lib*.so")
    ldd = host.check_output(f"ldd {library}")
    nccl = [line.split("=>")[1].split("(")[0].strip() for line in ldd.splitlines() if "libnccl.so.2 =>" in line]
    assert len(nccl) == 1, ldd
    assert host.check_output(f"realpath {nccl[0]}") == f"{SITE}/nvidia/nccl/lib/libnccl.so.2", ldd


def test_every_library_resolves_but_libcuda(host, image_layer):
    # TensorFlow's and Horovod's shared objects, and the CUDA wheels': every dependency found, libcuda excepted.
    out = host.check_output(
        f"for f in $(find {SITE}/tensorflow {SITE}/horovod {SITE}/nvidia -name '*.so*' -type f); do "
        "ldd $f 2>/dev/null | grep 'not found' | sed \"s|^|$f: |\"; done; echo checked")
    missing = [line for line in out.splitlines() if "not found" in line and "libcuda.so" not in line]
    assert out.endswith("checked") and missing == [], "\n".join(missing)
