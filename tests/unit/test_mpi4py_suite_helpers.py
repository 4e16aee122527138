"""mpi4py's own suite as an image test (tests/support/mpi4py_suite.py, tests/images/mpi/test_mpi4py_suite.py) without
containers or the network: unittest's summaries read per rank, the lock's hashes that the downloaded sdist must match,
the test/ tree taken out of an sdist, the launch command, and each known defect documented where its test is named."""
import hashlib
import io
import re
import tarfile

import pytest

from support import mpi4py_suite
from support.mpi4py_suite import KNOWN_DEFECTS, Counts, parse
from support.stack import CONFIG, MANIFEST, REPO_ROOT
from tfhpc.manifest import upstream_version

PASSED = """[0@node] MPI 3.1 (Open MPI 5.0.7)
testRank (test_comm.TestCommSelf.testRank) ... ok
----------------------------------------------------------------------
Ran 2099 tests in 27.364s

OK (skipped=206)
"""
FAILED = """testA (test_x.T.testA) ... FAIL
======================================================================
FAIL: testA (test_x.T.testA)
----------------------------------------------------------------------
Traceback (most recent call last):
AssertionError: 1 != 2
======================================================================
ERROR: testB (test_y.U.testB) (sub=1)
----------------------------------------------------------------------
Ran 12 tests in 1.0s

FAILED (failures=1, errors=1, skipped=3, expected failures=2)
"""


def test_a_passing_rank_is_counted_with_its_skips():
    assert parse(PASSED) == Counts(run=2099, skipped=206)
    assert parse(PASSED).ok


def test_a_failing_rank_names_each_failure_and_error():
    counts = parse(FAILED)
    assert (counts.run, counts.failures, counts.errors, counts.skipped, counts.expected_failures) == (12, 1, 1, 3, 2)
    assert counts.failed == ["test_x.T.testA", "test_y.U.testB"] and not counts.ok


@pytest.mark.parametrize("report", ["", PASSED.split("Ran ")[0], "Segmentation fault\n"])
def test_a_rank_without_a_summary_is_none(report):
    assert parse(report) is None


def test_failed_without_a_count_is_an_error_not_a_pass():
    with pytest.raises(ValueError, match="counted no failure"):
        parse("Ran 3 tests in 1s\n\nFAILED\n")


def test_the_lock_holds_the_pinned_sdists_hash_among_the_wheels():
    hashes = mpi4py_suite.lock_hashes(CONFIG.locks)
    assert len(hashes) > 1 and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes)


def test_a_cached_sdist_of_the_locked_bytes_is_used_without_the_network(monkeypatch, tmp_path):
    data = b"an sdist"
    monkeypatch.setattr(mpi4py_suite, "CACHE", tmp_path)
    monkeypatch.setattr(mpi4py_suite, "lock_hashes", lambda _locks: {hashlib.sha256(data).hexdigest()})
    monkeypatch.setattr(mpi4py_suite, "index_files", lambda _name: pytest.fail("the index was asked"))
    (tmp_path / "mpi4py-9.9.tar.gz").write_bytes(data)
    assert mpi4py_suite.sdist("9.9", CONFIG.locks) == tmp_path / "mpi4py-9.9.tar.gz"


def test_other_cached_bytes_are_fetched_again_and_must_match(monkeypatch, tmp_path):
    monkeypatch.setattr(mpi4py_suite, "CACHE", tmp_path)
    monkeypatch.setattr(mpi4py_suite, "lock_hashes", lambda _locks: {"0" * 64})
    monkeypatch.setattr(mpi4py_suite, "index_files", lambda _name: ("page", [
        {"filename": "mpi4py-9.9.tar.gz", "hashes": {"sha256": "1" * 64}, "url": "https://example.invalid/x"}]))
    (tmp_path / "mpi4py-9.9.tar.gz").write_bytes(b"tampered")
    with pytest.raises(ValueError, match="not the one .*mpi.txt locks"):
        mpi4py_suite.sdist("9.9", CONFIG.locks)


def test_only_the_test_tree_of_the_sdist_is_copied(tmp_path):
    sdist = tmp_path / "mpi4py-9.9.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        for name, data in {"mpi4py-9.9/test/main.py": b"main", "mpi4py-9.9/test/test_x.py": b"x",
                           "mpi4py-9.9/src/mpi4py/__init__.py": b"src", "mpi4py-9.9/testing.txt": b"no"}.items():
            member = tarfile.TarInfo(name)
            member.size, member.mode = len(data), 0o600
            archive.addfile(member, io.BytesIO(data))
    with tarfile.open(fileobj=io.BytesIO(mpi4py_suite.suite_archive(sdist))) as copied:
        assert sorted(copied.getnames()) == ["test/main.py", "test/test_x.py"]
        assert all(member.mode & 0o444 == 0o444 for member in copied.getmembers())


def test_each_rank_reports_to_its_own_file_under_oversubscription():
    command = mpi4py_suite.command(2, "/tmp/r", mpi4py_suite.exclusions(["test_spawn.TestSpawnMultiple*"]))
    assert "mpiexec -n 2 sh -c " in command and "/tmp/r/rank-${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}.txt" in command
    assert "OMPI_MCA_rmaps_base_oversubscribe=true" in command
    assert "PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe" in command
    assert "-x '\"'\"'test_spawn.TestSpawnMultiple*'\"'\"'" in command


def pinned_releases():
    """(vendor, version) of every MPI release versions.toml pins, as mpi4py's MPI.get_vendor() names it."""
    vendors = {"openmpi": "Open MPI", "mpich": "MPICH", "abi": "MPICH"}
    return {(vendors[mpi], upstream_version(spec["package_version"]))
            for os_spec in MANIFEST.data["os"].values() for mpi, spec in os_spec.get("mpi", {}).items()}


def test_every_known_defect_of_a_pinned_release_is_documented_with_its_test():
    """docs/known-issues.md holds a defect while a stack pins its release, and not once none does (its tests still run
    on every image, test_known_defects_tests)."""
    text = (REPO_ROOT / "docs" / "known-issues.md").read_text()
    pinned = pinned_releases()
    assert {name for name, _ in pinned} == {"Open MPI", "MPICH"} and len(pinned) >= 4, pinned
    for (name, version), defect in KNOWN_DEFECTS.items():
        if (name, version) not in pinned:
            assert f"## {defect.issue}\n" not in text, f"no stack pins {name} {version}: remove '{defect.issue}'"
            continue
        assert f"## {defect.issue}\n" in text, defect.issue
        section = text.split(f"## {defect.issue}\n", 1)[1].split("\n## ", 1)[0]
        assert f"{name} {version}" in section and "test_mpi4py_suite.py" in section, section
