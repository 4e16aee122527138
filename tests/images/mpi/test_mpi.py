"""Checks of the mpi layer, run on mpi and every image built on it."""
import re

from conftest import run_ranks
from support.stack import CONFIG
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
    assert ("libmpi.so.40" if CONFIG.mpi == "openmpi" else "libmpich.so.12") in linked
    assert CONFIG.versions["mpi4py"] == host.check_output("python -c 'import mpi4py; print(mpi4py.__version__)'")


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
        numbered = dict(re.findall(r'(\d+):"(\w+)"', valid))
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
