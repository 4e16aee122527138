"""Checks of the mpi layer, run on mpi and every image built on it."""
import re

import pytest

from conftest import run_ranks
from support.stack import CONFIG, MANIFEST
from tfhpc.manifest import upstream_version

EXPECTED_MPI_VERSION = upstream_version(CONFIG.os["mpi"][CONFIG.mpi]["package_version"])
VERSION = re.compile(r"(\d+\.\d+\.\d+)")


def test_mpirun_reports_the_pinned_mpi(host, image_layer):
    out = host.check_output("mpirun --version")
    if CONFIG.mpi == "openmpi":
        assert "Open MPI" in out
    else:
        assert "HYDRA" in out
    assert EXPECTED_MPI_VERSION in VERSION.findall(out), out


def test_mpi4py_uses_the_same_mpi_library(host, image_layer):
    library = host.check_output("python -c 'from mpi4py import MPI; print(MPI.Get_library_version())'")
    assert ("Open MPI" if CONFIG.mpi == "openmpi" else "MPICH") in library
    assert VERSION.search(library).group(1) == EXPECTED_MPI_VERSION, library
    linked = host.check_output("ldd $(python -c 'import mpi4py.MPI as m; print(m.__file__)') | grep -E 'libmpi'")
    assert "libmpi.so.40" in linked if CONFIG.mpi == "openmpi" else "libmpi.so.12 => " in linked, linked
    assert CONFIG.versions["mpi4py"] == host.check_output("python -c 'import mpi4py; print(mpi4py.__version__)'")


@pytest.mark.skipif(CONFIG.mpi != "mpich", reason="the MPICH images only: libmpi.so.12 is the MPICH ABI's name")
def test_mpich_users_load_the_mpi_by_the_abi_name_libmpi_so_12(host, image_layer):
    """mpi4py and Horovod name their MPI libmpi.so.12, the MPICH ABI Compatibility Initiative's name, a link to Debian's
    libmpich.so.12: the name a site's MPI hook binds a host library over or puts first on LD_LIBRARY_PATH
    (containers/mpi/Dockerfile). Nothing in /opt/venv loads libmpich.so.12, not even through another library."""
    link = host.check_output("find /usr/lib -maxdepth 2 -name libmpi.so.12 -printf '%h %l\\n'").splitlines()
    assert link == ["/usr/lib/x86_64-linux-gnu libmpich.so.12"], link
    # Candidates: every shared object that mentions an MPI library (patchelf may leave the old name's bytes behind).
    candidates = host.check_output("grep -rlaE --include='*.so*' 'libmpi(ch)?\\.so\\.12' /opt/venv").split()
    modules = [path for path in candidates if "/mpi4py/MPI." in path or "/horovod/tensorflow/mpi_lib" in path]
    assert any("/mpi4py/MPI." in path for path in modules), candidates
    if image_layer in MANIFEST.layers.descendants("horovod"):
        assert any("/horovod/tensorflow/mpi_lib" in path for path in modules), candidates
    for path in candidates:
        linked = host.check_output(f"ldd {path}")
        assert "libmpich.so.12" not in linked, f"{path} still loads libmpich.so.12:\n{linked}"
        if path in modules:
            assert re.search(r"libmpi\.so\.12 => (/usr)?/lib/x86_64-linux-gnu/libmpi\.so\.12 ", linked), linked


def test_two_rank_mpi4py_allreduce(host, image_layer):
    # Buffers from the standard library's array module: the mpi layer has no numpy.
    program = ("from mpi4py import MPI; import array, json; c = MPI.COMM_WORLD; "
               "v = array.array('d', [i * (c.rank + 1) for i in range(1000)]); s = array.array('d', [0.0] * 1000); "
               "c.Allreduce(v, s, op=MPI.SUM); "
               "print('RESULT ' + json.dumps({'rank': c.rank, 'size': c.size, 'sum': sum(s), 'last': s[-1]}))")
    reports = run_ranks(host, f'mpirun -np 2 python -c "{program}"')
    for report in reports:  # ranks contribute i*1 and i*2
        assert report["size"] == 2
        assert report["sum"] == sum(range(1000)) * 3
        assert report["last"] == 999 * 3


def test_the_benchmarks_forced_allreduce_algorithms_exist(host, image_layer):
    """`make bench` forces each allreduce algorithm by name (tfhpc/bench/sections/coll.py COLL_ALGORITHMS): every
    name must be one the image's MPI lists, or the run aborts at MPI_Init (MPICH) or measures the default under a
    wrong label."""
    from tfhpc.bench.sections.coll import COLL_ALGORITHMS
    forced = [name for name in COLL_ALGORITHMS[CONFIG.mpi] if name != "default"]
    if CONFIG.mpi == "openmpi":
        listed = host.check_output("ompi_info --param coll tuned --level 9")
        valid = re.search(r'coll_tuned_allreduce_algorithm".*?Valid values: ([^\n]*)', listed, re.S).group(1)
        # Open MPI 4.1 lists '0:"ignore", 1:"basic_linear", ...', Open MPI 5 '0|ignore, 1|basic_linear, ...'
        numbered = dict(re.findall(r'(\d+)(?::"|\|)(\w+)', valid))
        for name, env in COLL_ALGORITHMS["openmpi"].items():
            if name != "default":
                assert numbered[env["OMPI_MCA_coll_tuned_allreduce_algorithm"]] == name
    else:
        listed = host.check_output("mpivars")
        line = next(l for l in listed.splitlines() if "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=" in l)
        # "...auto - Internal ...nb - Force nonblocking algorithmsmp - Force smp algorithm...": mpivars runs the
        # choices together, so each name follows "algorithm", ")" or a blank
        assert forced
        for name in forced:
            assert re.search(rf"(?:algorithm|[\s)]){name}\s+- Force", line), (name, line)
