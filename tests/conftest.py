"""Shared fixtures: the manifest and the stack configuration selected by STACK/FLAVOR/MPI (as `make test` exports)."""
import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from tfhpc.manifest import Manifest  # noqa: E402


@pytest.fixture(scope="session")
def manifest():
    return Manifest()


@pytest.fixture(scope="session")
def config(manifest):
    return manifest.config(os.environ.get("STACK") or None, os.environ.get("FLAVOR") or None,
                           os.environ.get("MPI") or None)


def pytest_terminal_summary(terminalreporter):
    """After pytest's own --durations list: the time spent in each test directory (setup, call and teardown of its
    tests, so a module fixture's start-up counts where it is used), the table docs/testing.md keeps."""
    totals, counts = {}, {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) not in ("setup", "call", "teardown"):
                continue
            parts = Path(report.fspath).parts
            directory = "/".join(parts[:2]) if len(parts) > 2 else parts[0]
            totals[directory] = totals.get(directory, 0.0) + report.duration
            if report.when == "call":
                counts[directory] = counts.get(directory, 0) + 1
    if not totals:
        return
    terminalreporter.write_sep("=", "time per test directory")
    for directory, seconds in sorted(totals.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {counts.get(directory, 0):4d} tests  {directory}")
    terminalreporter.write_line(f"{sum(totals.values()):8.1f} s  {sum(counts.values()):4d} tests  in all")
