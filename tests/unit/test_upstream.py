"""`make upstream-tests` (tfhpc/upstream.py) without containers: the junit counts per rank, the report's failed
tests, and the one-line errors for a HOROVOD_SRC that cannot serve the suites and a stack without Keras 3."""
import subprocess

import pytest

from tfhpc.common import UserError
from tfhpc.manifest import Manifest
from tfhpc.upstream import RankResult, parse_junit, render, suite_tree, upstream_tests

HOROVOD = Manifest().config(None, None, None).versions["horovod"]

JUNIT = b"""<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="test_tensorflow.TensorFlowTests" name="test_allreduce"/>
<testcase classname="test_tensorflow.TensorFlowTests" name="test_gpu"><skipped message="no GPU"/></testcase>
<testcase classname="test_tensorflow2_keras.Tf2KerasTests" name="test_elastic_state"><failure message="x"/></testcase>
<testcase classname="test_tensorflow2_keras.Tf2KerasTests" name="test_load_model"><error message="y"/></testcase>
</testsuite></testsuites>"""


def test_junit_counts_a_rank_and_names_its_failures():
    result = parse_junit(JUNIT)
    assert (result.passed, result.failed, result.skipped) == (1, 2, 1)
    assert result.failures == ["test_tensorflow2_keras.Tf2KerasTests::test_elastic_state",
                               "test_tensorflow2_keras.Tf2KerasTests::test_load_model"]


def test_report_lists_each_rank_and_the_failed_tests_once():
    failing = RankResult(3, 1, 2, ["t::a"])
    page = render(HOROVOD, {"3": {0: failing, 1: failing}, "2": {0: RankResult(4, 0, 2), 1: RankResult(4, 0, 2)}})
    assert "| Keras 3 | 1 | 3 | 1 | 2 |" in page and "| Keras 2 | 0 | 4 | 0 | 2 |" in page
    assert page.count("`t::a`") == 1 and "Failed with Keras 2" not in page


def test_a_tree_with_the_suites_is_copied(tmp_path):
    (tmp_path / "src" / "test" / "parallel").mkdir(parents=True)
    (tmp_path / "src" / "test" / "parallel" / "test_tensorflow.py").write_text("x = 1\n")
    tests = suite_tree(HOROVOD, str(tmp_path / "src"), None, tmp_path / "out")
    assert (tests / "parallel" / "test_tensorflow.py").read_text() == "x = 1\n"


def test_a_git_checkout_without_the_tag_is_refused(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    with pytest.raises(UserError, match=r"no tag v.*: run `git -C .* fetch --tags`"):
        suite_tree(HOROVOD, str(tmp_path / "repo"), None, tmp_path / "out")


def test_a_directory_without_suites_is_refused(tmp_path):
    with pytest.raises(UserError, match="neither a Horovod git checkout nor a tree with test/parallel"):
        suite_tree(HOROVOD, str(tmp_path), None, tmp_path / "out")


def test_keras_3_on_a_stack_without_it_is_refused():
    config = Manifest().config("conservative", None, None)
    with pytest.raises(UserError, match="has no Keras 3 .* use --keras 2, or STACK=latest"):
        upstream_tests(config, None, None, ("3",))
