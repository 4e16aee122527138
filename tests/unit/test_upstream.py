"""`make upstream-tests` (tfhpc/upstream.py) without containers: the junit counts per rank, the report's failed
tests and not-applicable ones, the Keras 3 run's patch to the suites (applied like `patch -p1`, every hunk commented),
the deselection of tests about Keras 2 only, and the one-line errors for a HOROVOD_SRC that cannot serve the suites
and a stack without Keras 3."""
import re
import subprocess

import pytest

from tfhpc.common import UserError
from tfhpc.manifest import Manifest
from tfhpc.upstream import (NOT_APPLICABLE, TEST_PATCHES, RankResult, apply_patch, deselected, keras_tree,
                             parse_junit, render, suite_tree, upstream_tests)

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
    assert "| Keras 3 | 1 | 3 | 1 | 2 | 0 |" in page and "| Keras 2 | 0 | 4 | 0 | 2 | 0 |" in page
    assert page.count("`t::a`") == 1 and "Failed with Keras 2" not in page


def test_report_counts_the_not_applicable_tests_apart_with_their_reason():
    result = RankResult(98, 0, 59, not_applicable=len(NOT_APPLICABLE["3"]))
    page = render(HOROVOD, {"3": {0: result, 1: result}}, {"3": 200.4})
    assert f"| Keras 3 | 0 | 98 | 0 | 59 | {len(NOT_APPLICABLE['3'])} |" in page
    assert "Time (both suites, all ranks): Keras 3 200 s" in page
    for node, why in NOT_APPLICABLE["3"].items():
        assert f"- `{node}`: {why}" in page
    assert "tests/upstream/keras3-tests.patch" in page


def test_every_hunk_of_the_keras3_patch_says_why():
    hunks = re.split(r"^@@.*$", TEST_PATCHES["3"].read_text(), flags=re.M)[1:]
    assert hunks
    for hunk in hunks:
        assert "+" in hunk and "# tfhpc (Keras 3): " in hunk, hunk[:300]


SUITE = """class T:
    def test_a(self):
        opt = Adam(lr=0.1)
        check(opt)

    def test_b(self):
        opt = Adam(lr=0.1)
        check(opt)
"""
PATCH = """Why: the header text before the first file is not applied.

--- a/test/parallel/test_x.py
+++ b/test/parallel/test_x.py
@@ -6,3 +6,4 @@ class T:
     def test_b(self):
-        opt = Adam(lr=0.1)
+        # tfhpc (Keras 3): learning_rate
+        opt = Adam(learning_rate=0.1)
         check(opt)
"""


def suite_with(tmp_path, text):
    (tmp_path / "test" / "parallel").mkdir(parents=True)
    (tmp_path / "test" / "parallel" / "test_x.py").write_text(text)
    return tmp_path / "test" / "parallel" / "test_x.py"


def test_a_hunk_applies_at_its_line_where_its_text_repeats(tmp_path):
    suite = suite_with(tmp_path, SUITE)
    (tmp_path / "p.patch").write_text(PATCH)
    apply_patch(tmp_path / "p.patch", tmp_path)
    assert suite.read_text() == SUITE.replace("""    def test_b(self):
        opt = Adam(lr=0.1)""", """    def test_b(self):
        # tfhpc (Keras 3): learning_rate
        opt = Adam(learning_rate=0.1)""")


def test_a_hunk_that_is_not_at_its_line_nor_once_elsewhere_is_refused(tmp_path):
    suite_with(tmp_path, SUITE.replace("    def test_b(self):\n", "    def test_c(self):\n"))
    (tmp_path / "p.patch").write_text(PATCH)
    with pytest.raises(UserError, match="p.patch does not apply to test/parallel/test_x.py: the hunk at line 6"):
        apply_patch(tmp_path / "p.patch", tmp_path)


def test_only_the_keras3_run_gets_a_patched_copy_of_the_suites(tmp_path):
    suite_with(tmp_path / "src", "x = 1\n")
    assert keras_tree(tmp_path / "src" / "test", "2", tmp_path) == tmp_path / "src" / "test"


def test_a_not_applicable_test_missing_from_the_suites_is_refused(tmp_path):
    (tmp_path / "parallel").mkdir()
    for suite in {node.split("::")[0] for node in NOT_APPLICABLE["3"]}:
        (tmp_path / "parallel" / suite).write_text("def test_other(self):\n    pass\n")
    with pytest.raises(UserError, match="is not in Horovod's suites: update NOT_APPLICABLE"):
        deselected(tmp_path, "3")
    assert deselected(tmp_path, "2") == {}


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
