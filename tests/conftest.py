"""Fixtures every test directory shares. The configuration `make test` selected (STACK/FLAVOR/MPI) lives once, in
support/stack.py, as constants (skip marks and parametrisations need it at import time); `manifest` and `config` only
hand those same objects to the tests that take them as arguments. The docker client is one per session, for every
directory whose tests talk to the engine (images, publish, runtimes).

`make test` runs two pytest workers (pytest-xdist, `--dist loadgroup`): much of the suite waits rather than computes
(container and Slurm start-up, a requeued job's credential expiry, a lost node's cooldown), and the other worker's
tests fill those waits (docs/testing.md#two-workers). A work unit runs on one worker, whole: a module, or a directory
whose fixtures are shared between its modules (package or session scope). The longest units start first."""
import json
import os
import shutil
from pathlib import Path

import pytest

from support import oversubscription
from support.stack import CONFIG, MANIFEST, REPO_ROOT
from support.tiers import TIER, check_tier, deselected_reason, patches_proven, record_proven_patches

# Directories whose fixtures outlive a module: each is one work unit.
WHOLE_DIRECTORIES = ("tests/arm64", "tests/bench", "tests/publish", "tests/runtimes", "tests/sif", "tests/sites")
# The longest work units, longest first (build/test-durations.json of a full run; docs/measurements.md, "Where the
# test time goes"): with two workers, starting them first keeps one long unit from running alone at the end.
LONGEST_FIRST = ("tests/images/app/test_training.py", "tests/cluster/test_slurm.py", "tests/cluster/test_elastic.py",
                 "tests/images/mpi/test_mpi4py_suite.py", "tests/sites", "tests/bench", "tests/sif",
                 "tests/images/app/test_keras3.py", "tests/runtimes", "tests/images/app/test_doctor.py",
                 "tests/publish", "tests/cluster/test_multinode.py", "tests/images/app/test_keras3_horovod_api.py",
                 "tests/images/horovod/test_horovod.py")

# What a whole `make test` writes at its peak besides what is already built (the runtimes' image copies, the SIF
# tests' sandboxes, the cluster's node images, the registry's blobs): 10 GB measured, and a margin
# (docs/testing.md#disk).
MIN_FREE_GB = 15

# Open MPI's ranks that apptainer, ch-run and the host MPIs start from pytest's own environment yield when they wait,
# as the containers' do (support/oversubscription.py); a value set before `make test` is kept.
for _name, _value in oversubscription.ENVIRONMENT.items():
    os.environ.setdefault(_name, _value)


@pytest.fixture(scope="session")
def manifest():
    return MANIFEST


@pytest.fixture(scope="session")
def config():
    return CONFIG


@pytest.fixture(scope="session")
def docker_client():
    # Imported here: the docker SDK is needed only by the tests that use the engine, not to collect or run tests/unit.
    from tfhpc.dockerhost import client
    return client()


def work_unit(nodeid: str) -> str:
    """The module of a test, or its directory when that is one of WHOLE_DIRECTORIES."""
    path = nodeid.split("::")[0]
    return next((directory for directory in WHOLE_DIRECTORIES if path.startswith(directory + "/")), path)


def pytest_configure(config):
    try:
        check_tier()
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The tier's tests only (support/tiers.py: the others are reported as deselected). Each test's work unit as its
    xdist group, before xdist's own hook reads the groups into the test ids; in an xdist worker (whose collection
    order the scheduler keeps: --no-loadscope-reorder), the units in LONGEST_FIRST order (a stable sort: the order
    within a unit stays). A run in one process keeps the collection's order."""
    proven = patches_proven()
    deselected = [item for item in items if deselected_reason(item, TIER, proven)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not deselected_reason(item, TIER, proven)]
    for item in items:
        item.add_marker(pytest.mark.xdist_group(work_unit(item.nodeid)))
    if hasattr(config, "workerinput"):
        rank = {unit: index for index, unit in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(work_unit(item.nodeid), len(rank)))


def cpu_times() -> tuple[int, int] | None:
    """The machine's busy and total CPU time so far, in clock ticks (/proc/stat), or None where there is none."""
    try:
        fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return None
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def pytest_sessionstart(session):
    """Before any test (in the one process that starts the workers): the CPU times the summary compares with, and
    enough free disk where the image tests write (build/ and the docker data root), else one line naming the fix; a
    full disk half-way fails unrelated tests with ENOSPC an hour later. Runs of tests/unit and tests/network alone
    need no disk (nor docker)."""
    config = session.config
    config._tfhpc_cpu_times = cpu_times()
    imageless = [REPO_ROOT / "tests" / "unit", REPO_ROOT / "tests" / "network"]
    selected = [Path(config.invocation_params.dir, arg.split("::")[0]).resolve() for arg in config.args]
    if hasattr(config, "workerinput") or all(any(path.is_relative_to(d) for d in imageless) for path in selected):
        return
    from tfhpc import UserError
    from tfhpc.dockerhost import client
    try:
        places = {REPO_ROOT / "build": "build/", Path(client().info()["DockerRootDir"]): "the docker data root"}
    except UserError as error:
        raise pytest.UsageError(str(error)) from None
    for path, what in places.items():
        while not path.exists():
            path = path.parent
        free = shutil.disk_usage(path).free / 2**30
        if free < MIN_FREE_GB:
            raise pytest.UsageError(f"{free:.1f} GB free for {what} ({path}), the image tests need {MIN_FREE_GB} "
                                    "GB: run `make clean` (or `docker builder prune`) first")


def pytest_sessionfinish(session, exitstatus):
    """A full-tier run in which every test passed, patch reversals among them, and no reversal was left out (by -k, a
    path, or a -m other than `patch_reversal`): the configuration's patch set is proven, and `make test` leaves its
    reversal tests to the full tier."""
    config = session.config
    if hasattr(config, "workerinput") or TIER != "full" or exitstatus != 0:
        return
    if config.option.keyword or config.option.markexpr not in ("", "patch_reversal") or \
            config.args not in ([], ["tests"]):
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    passed = reporter.stats.get("passed", []) if reporter else []
    if any("patch_reversal" in report.keywords for report in passed):
        record_proven_patches()


def pytest_terminal_summary(terminalreporter):
    """After pytest's own --durations list: the time spent in each test directory (setup, call and teardown of its
    tests, so a module fixture's start-up counts where it is used), the table docs/measurements.md records; every test's
    times also go to build/test-durations.json (test id -> seconds of setup, call, teardown and the setup's start
    time), to find where a directory's time goes; last, how busy the machine's cores were over the run."""
    totals, counts, durations = {}, {}, {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) not in ("setup", "call", "teardown"):
                continue
            parts = Path(report.fspath).parts
            directory = "/".join(parts[:2]) if len(parts) > 2 else parts[0]
            totals[directory] = totals.get(directory, 0.0) + report.duration
            times = durations.setdefault(report.nodeid.split("@tests/")[0], {})  # without xdist's "@<group>"
            times[report.when] = round(report.duration, 2)
            if report.when == "setup":
                times["start"] = round(report.start, 1)  # epoch seconds: to line a test up with the machine's load
            if report.when == "call":
                counts[directory] = counts.get(directory, 0) + 1
    if not totals:
        return
    terminalreporter.write_sep("=", "time per test directory")
    for directory, seconds in sorted(totals.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {counts.get(directory, 0):4d} tests  {directory}")
    terminalreporter.write_line(f"{sum(totals.values()):8.1f} s  {sum(counts.values()):4d} tests  in all (the tests' "
                                "own times: with workers, more than the wall time)")
    started = getattr(terminalreporter.config, "_tfhpc_cpu_times", None)
    if started:
        busy, total = (now - then for now, then in zip(cpu_times(), started))
        terminalreporter.write_line(f"the machine's {os.cpu_count()} cores were {100 * busy / total:.0f}% busy during "
                                    "the run (/proc/stat; the idle rest is what more overlap of the tests could use)")
    output = Path(terminalreporter.config.rootpath) / "build" / "test-durations.json"
    output.parent.mkdir(exist_ok=True)
    output.write_text(json.dumps(durations, indent=0, sort_keys=True) + "\n")
