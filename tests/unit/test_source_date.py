"""The leaf image's creation time comes from the source (SOURCE_DATE_EPOCH, else HEAD's commit time, else a fixed
date), never from the clock: a warm rebuild of the same tree then gives the same image id and the SIF is kept."""
import datetime
import subprocess

import pytest

from tfhpc import common
from tfhpc.common import FALLBACK_SOURCE_EPOCH, UserError, source_date


def test_source_date_epoch_wins():
    assert source_date({"SOURCE_DATE_EPOCH": "1700000000"}) == "2023-11-14T22:13:20+00:00"


def test_head_commit_time_without_source_date_epoch():
    committed = subprocess.run(["git", "-C", str(common.REPO_ROOT), "log", "-1", "--format=%cI", "HEAD"],
                               capture_output=True, text=True, check=True).stdout.strip()
    created = source_date({})
    assert created == source_date({}), "two calls must agree (no clock)"
    assert datetime.datetime.fromisoformat(created) == datetime.datetime.fromisoformat(committed)


def test_fixed_fallback_outside_a_git_checkout(monkeypatch, tmp_path):
    monkeypatch.setattr(common, "REPO_ROOT", tmp_path)  # no .git: git log prints nothing
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert source_date({}) == "1970-01-01T00:00:00+00:00"
    assert FALLBACK_SOURCE_EPOCH == 0


def test_bad_source_date_epoch_is_one_line():
    with pytest.raises(UserError, match="SOURCE_DATE_EPOCH=yesterday"):
        source_date({"SOURCE_DATE_EPOCH": "yesterday"})
