"""The leaf image's creation time comes from the source (SOURCE_DATE_EPOCH, else the time of the last commit that
changed what the images are built from, else a fixed date), never from the clock: a warm rebuild of the same tree,
or after a commit that touched only docs or tests, gives the same image id and the SIF is kept."""
import datetime
import subprocess

import pytest

from tfhpc import common
from tfhpc.common import FALLBACK_SOURCE_EPOCH, UserError, source_date


def test_source_date_epoch_wins():
    assert source_date({"SOURCE_DATE_EPOCH": "1700000000"}) == "2023-11-14T22:13:20+00:00"


def test_last_image_source_commit_without_source_date_epoch():
    log = subprocess.run(["git", "-C", str(common.REPO_ROOT), "log", "-1", "--format=%H %cI", "HEAD", "--",
                          *common.IMAGE_SOURCES], capture_output=True, text=True, check=True)
    commit, committed = log.stdout.split()
    created = source_date({})
    assert created == source_date({}), "two calls must agree (no clock)"
    assert datetime.datetime.fromisoformat(created) == datetime.datetime.fromisoformat(committed)
    assert common.git_revision() == commit[:12]


def test_a_commit_outside_the_image_sources_changes_no_label(tmp_path, monkeypatch):
    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True).stdout
    git("init", "-q")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "train.py").write_text("print(1)\n")
    environ = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@t"}
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z")
    git("add", "-A")
    git("commit", "-q", "-m", "image source")
    image_commit = git("rev-parse", "HEAD").strip()
    (tmp_path / "README.md").write_text("docs\n")
    monkeypatch.setenv("GIT_COMMITTER_DATE", "2026-02-01T00:00:00Z")
    git("add", "-A")
    git("commit", "-q", "-m", "docs only")
    monkeypatch.setattr(common, "REPO_ROOT", tmp_path)
    assert common.git_revision() == image_commit[:12]
    assert source_date({}) == "2026-01-01T00:00:00+00:00"


def test_fixed_fallback_outside_a_git_checkout(monkeypatch, tmp_path):
    monkeypatch.setattr(common, "REPO_ROOT", tmp_path)  # no .git: git log prints nothing
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert source_date({}) == "1970-01-01T00:00:00+00:00"
    assert FALLBACK_SOURCE_EPOCH == 0


def test_bad_source_date_epoch_is_one_line():
    with pytest.raises(UserError, match="SOURCE_DATE_EPOCH=yesterday"):
        source_date({"SOURCE_DATE_EPOCH": "yesterday"})
