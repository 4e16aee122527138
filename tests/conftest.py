"""Fixtures every test directory shares. The configuration `make test` selected (STACK/FLAVOR/MPI) lives once, in
support/stack.py, as constants (skip marks and parametrisations need it at import time); `manifest` and `config` only
hand those same objects to the tests that take them as arguments. The docker client is one per session, for every
directory whose tests talk to the engine (images, publish, runtimes)."""
import json
from pathlib import Path

import pytest

from support.stack import CONFIG, MANIFEST


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


def pytest_terminal_summary(terminalreporter):
    """After pytest's own --durations list: the time spent in each test directory (setup, call and teardown of its
    tests, so a module fixture's start-up counts where it is used), the table docs/testing.md keeps; every test's
    times also go to build/test-durations.json (test id -> seconds of setup, call, teardown), to find where a
    directory's time goes."""
    totals, counts, durations = {}, {}, {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) not in ("setup", "call", "teardown"):
                continue
            parts = Path(report.fspath).parts
            directory = "/".join(parts[:2]) if len(parts) > 2 else parts[0]
            totals[directory] = totals.get(directory, 0.0) + report.duration
            durations.setdefault(report.nodeid, {})[report.when] = round(report.duration, 2)
            if report.when == "call":
                counts[directory] = counts.get(directory, 0) + 1
    if not totals:
        return
    terminalreporter.write_sep("=", "time per test directory")
    for directory, seconds in sorted(totals.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {counts.get(directory, 0):4d} tests  {directory}")
    terminalreporter.write_line(f"{sum(totals.values()):8.1f} s  {sum(counts.values()):4d} tests  in all")
    output = Path(terminalreporter.config.rootpath) / "build" / "test-durations.json"
    output.parent.mkdir(exist_ok=True)
    output.write_text(json.dumps(durations, indent=0, sort_keys=True) + "\n")
