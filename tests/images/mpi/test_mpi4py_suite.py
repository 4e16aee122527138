"""mpi4py's own test suite (test/ of the locked mpi4py sdist, tests/support/mpi4py_suite.py) on 1 and 2 ranks in the
app image of each MPI that `make test` builds: this configuration's, and the MPICH and standard-ABI ones the site
tests use (`make site-images`). 0 failures and 0 errors on every rank.

The suite proves what no other test here does: MPI from Python beyond the collectives and point-to-point calls of
the smoke tests (MPI-IO, one-sided communication, dynamic processes, sessions, datatypes, mpi4py.util's pools and
mpi4py.futures). The app image holds the mpi layer as it was built (test_mpi.py checks the library on every layer),
so the suite runs on the app image only: one container per MPI, both rank counts in it.

A known defect of an MPI release (mpi4py_suite.KNOWN_DEFECTS, docs/known-issues.md) leaves its tests out of the
suite's run on that release only, decided by the version mpi4py reports in the image; test_known_defects_tests runs
exactly those tests: strict xfail on that release (it fails once the release is fixed, so that the entry and the
exclusion go), a plain test on every other."""
import pytest

from support import containers, mpi4py_suite
from support.mpi4py_suite import KNOWN_DEFECTS
from support.stack import CONFIG, LEAF, MANIFEST

# The MPIs whose app images `make test` builds: this configuration's and the site tests' (MPICH, standard ABI).
MPIS = list(dict.fromkeys([CONFIG.mpi, *CONFIG.site_test_mpis]))
REPORTS = "/tmp/mpi4py-suite-reports"


# The test tier's runs: 2 ranks on each image; on the standard-ABI image 1 rank where the MPICH image is tested too,
# whose library the ABI image links (the mpi Dockerfile refuses two different MPICH wheels): the 2-rank runs prove
# that MPICH library, the ABI image's 1-rank run its own mpi4py build (every module of the suite on its bindings).
# Every test of a 1-rank run also runs in the 2-rank run of the same image (mpi4py's tests take any world size).
SAME_LIBRARY = "abi" if "mpich" in MPIS else None
FULL_RUNS = {(mpi, 1): pytest.mark.full(f"every test of the suite on 2 ranks of the {mpi} image")
             for mpi in MPIS if mpi != SAME_LIBRARY}
if SAME_LIBRARY:
    FULL_RUNS[SAME_LIBRARY, 2] = pytest.mark.full("MPICH's library on 2 ranks: the MPICH image's run; the standard-ABI "
                                                  "image's mpi4py build: its 1-rank run")
SUITE_RUNS = [pytest.param(mpi, ranks, id=f"{mpi}-{ranks}", marks=[FULL_RUNS[mpi, ranks]] if (mpi, ranks) in FULL_RUNS
                           else []) for mpi in MPIS for ranks in (1, 2)]
# The vendor's name in mpi4py's MPI.get_vendor() of each image's MPI: with the version versions.toml gives, the key of
# KNOWN_DEFECTS known before any image starts.
VENDORS = {"openmpi": "Open MPI", "mpich": "MPICH", "abi": "MPICH"}


def known_defect(mpi):
    """The KNOWN_DEFECTS entry of the release this configuration builds the `mpi` image with, or None."""
    version = MANIFEST.config(CONFIG.stack, CONFIG.flavor, mpi, CONFIG.arch).mpi_version
    return KNOWN_DEFECTS.get((VENDORS[mpi], version))


# A known defect's tests run alone on every image; where the image's release has no known defect, the suite's own run
# on that image (test_mpi4py_suite_passes) leaves nothing out and has run them already.
DEFECT_RUNS = [pytest.param(mpi, id=mpi, marks=[] if known_defect(mpi) else [pytest.mark.full(
    f"{VENDORS[mpi]} {MANIFEST.config(CONFIG.stack, CONFIG.flavor, mpi, CONFIG.arch).mpi_version} has no known defect: "
    "the suite's run on its image runs these tests")]) for mpi in MPIS]


@pytest.fixture(scope="module")
def suite_host(request, docker_client):
    """A container of the app image of MPI `request.param` with the suite copied in: (testinfra host, the image's MPI
    as mpi4py's MPI.get_vendor() names it, e.g. ("Open MPI", "5.0.7"))."""
    import docker.errors
    name = MANIFEST.config(CONFIG.stack, CONFIG.flavor, request.param, CONFIG.arch).image(LEAF)
    try:
        docker_client.images.get(name)
    except docker.errors.ImageNotFound:
        pytest.fail(f"{name} is not built: run `{'make image' if request.param == CONFIG.mpi else 'make site-images'}`")
    archive = mpi4py_suite.suite_archive(mpi4py_suite.sdist(CONFIG.versions["mpi4py"], CONFIG.locks))
    container = containers.start_container(docker_client, name)
    try:
        host = containers.testinfra_host(container)
        host.check_output(f"mkdir -p {mpi4py_suite.IN_CONTAINER}")
        assert container.put_archive(mpi4py_suite.IN_CONTAINER, archive)
        vendor = host.check_output("python -c 'from mpi4py import MPI; n, v = MPI.get_vendor(); "
                                   "print(n, \".\".join(map(str, v)))'")
        yield host, mpi4py_suite.vendor(vendor)
    finally:
        container.remove(force=True)


def run_suite(host, ranks, arguments=()):
    """The suite on `ranks` ranks: (mpiexec's exit status, each rank's Counts or None where it printed no summary,
    what to show when a check fails)."""
    done = host.run(mpi4py_suite.command(ranks, REPORTS, arguments))
    reports = [host.run(f"cat {path}").stdout for path in mpi4py_suite.report_paths(REPORTS, ranks)]
    shown = "\n".join([f"mpiexec exited {done.rc}:", done.stdout[-2000:], done.stderr[-2000:],
                       *(f"--- rank {rank}:\n{report[-3000:]}" for rank, report in enumerate(reports))])
    return done.rc, [mpi4py_suite.parse(report) for report in reports], shown


@pytest.mark.parametrize("suite_host, ranks", SUITE_RUNS, indirect=["suite_host"])
def test_mpi4py_suite_passes(suite_host, ranks):
    host, mpi = suite_host
    defect = KNOWN_DEFECTS.get(mpi)
    rc, counts, shown = run_suite(host, ranks, mpi4py_suite.exclusions(defect.patterns) if defect else ())
    print(f"mpi4py's suite, {' '.join(mpi)}, ranks: {ranks}, left out: {defect.patterns if defect else ()}: {counts}")
    assert all(counts), f"a rank printed no unittest summary\n{shown}"
    for rank, rank_counts in enumerate(counts):
        assert rank_counts.run > 0 and rank_counts.ok, (rank, rank_counts, shown)
    assert rc == 0, shown


@pytest.mark.parametrize("suite_host", DEFECT_RUNS, indirect=True)
def test_known_defects_tests(request, suite_host):
    host, mpi = suite_host
    if mpi in KNOWN_DEFECTS:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"{KNOWN_DEFECTS[mpi].issue} (docs/known-issues.md)"))
    for defect in KNOWN_DEFECTS.values():
        rc, [counts], shown = run_suite(host, 1, defect.selection)
        assert counts is not None, f"the rank printed no unittest summary\n{shown}"
        assert counts.run > 0 and counts.ok and rc == 0, (counts, shown)
