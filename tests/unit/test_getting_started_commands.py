"""docs/getting-started.md's commands are the tests' (tests/support/getting_started.py): the app image test runs the
page's `docker run` commands as written, every other command names the test that runs the same step (or says why no
test can), and together they are exactly the page's commands, so a command changed on the page fails here until its
test follows. Also `make show`, the page's one command that needs neither a container nor a cluster."""
import re
import subprocess

import pytest

from support.getting_started import (ELSEWHERE, PAGE_IMAGE, RUN_IN_THE_APP_IMAGE_TEST, argv, commands,
                                     example_output, pattern)
from support.stack import CONFIG, MANIFEST, REPO_ROOT


def test_the_tests_commands_are_exactly_the_pages():
    page = commands()
    assert len(page) == len(set(page)), f"getting-started.md repeats a command: {page}"
    assert [command for command in page if command in RUN_IN_THE_APP_IMAGE_TEST] == RUN_IN_THE_APP_IMAGE_TEST, (
        f"the app image test's commands (tests/support/getting_started.py) are not the page's: {page}")
    unaccounted = [command for command in page if command not in RUN_IN_THE_APP_IMAGE_TEST and command not in ELSEWHERE]
    assert not unaccounted, (f"getting-started.md runs {unaccounted}: run it in "
                             "tests/images/app/test_getting_started.py, or name the test that runs the same in "
                             "tests/support/getting_started.py's ELSEWHERE")
    gone = sorted(set(ELSEWHERE) - set(page))
    assert not gone, f"tests/support/getting_started.py names commands that getting-started.md no longer has: {gone}"


def test_every_docker_command_of_the_page_is_run_by_the_app_image_test():
    """A `docker run` of the page needs nothing but the image: it cannot be left to another test."""
    assert not [command for command in ELSEWHERE if command.startswith("docker ")]
    for command in RUN_IN_THE_APP_IMAGE_TEST:  # run as written: only the label and the configuration's image added
        words = command.split()
        assert argv(command, "IMAGE") == [*words[:3], "--label", "io.tfhpc.test-runtime=getting-started", "IMAGE",
                                          *words[4:]]


@pytest.mark.parametrize("command", sorted(ELSEWHERE))
def test_the_test_named_for_a_command_exists_or_the_reason_says_none_can(command):
    test, reason = ELSEWHERE[command]
    assert reason.strip(), f"{command}: say why the app image test does not run it"
    if test is None:
        assert "no test" in reason, f"{command}: no test named, and the reason does not say that none can"
        return
    path, _, name = test.partition("::")
    assert (REPO_ROOT / path).is_file(), f"{command}: {path} does not exist"
    assert re.search(rf"^def {re.escape(name)}\(", (REPO_ROOT / path).read_text(), re.M), f"{command}: no {test}"


def test_the_page_names_the_default_configurations_image():
    assert MANIFEST.config().image("app") == PAGE_IMAGE


def test_the_example_output_has_both_ranks_result_lines_the_test_can_match():
    lines = example_output()
    results = [line for line in lines if "RESULT {" in line]
    assert [line[:5] for line in results] == ["[1,0]", "[1,1]"], results
    assert all('"size": 2' in line for line in results), results
    assert pattern('[1,0]<stdout>:{"keras": "3...."}').match('[1,0]<stdout>:{"keras": "3.15.1"}')
    assert pattern("[1,0]<stdout>:S/S - ...s").match("[1,0]<stdout>:93/93 - 4s")
    assert not pattern("[1,0]<stdout>:S/S - ...s").match("[1,0]<stdout>:92/93 - 4s")
    assert not pattern('[1,0]<stdout>:RESULT {"rank": 0, ...}').match('[1,1]<stdout>:RESULT {"rank": 0, "size": 2}')


def test_the_example_result_lines_show_the_scripts_keys_in_its_order():
    """The RESULT lines are json.dumps with sorted keys: keys the page shows side by side (no `...` between) must be
    neighbours in the script's report, and every key one it reports."""
    source = (REPO_ROOT / "scripts" / "train" / "hvd_keras_fit.py").read_text()
    call = source[source.rindex("    report({"):]
    reported = sorted(re.findall(r'"(\w+)":', call[:call.index("})")]))
    for line in [line for line in example_output() if "RESULT {" in line]:
        items = line.partition("RESULT {")[2].removesuffix("}").split(", ")
        for before, after in zip(items, items[1:]):
            if "..." not in (before, after):
                first, second = (item.partition('"')[2].partition('"')[0] for item in (before, after))
                assert reported.index(second) == reported.index(first) + 1, (
                    f"getting-started.md shows {first!r} next to {second!r}; the RESULT line has "
                    f"{reported[reported.index(first) + 1]!r} after {first!r}: put `...` between them")
        shown = [item.partition('"')[2].partition('"')[0] for item in items if item != "..."]
        assert shown == sorted(shown) and set(shown) <= set(reported), (shown, reported)


def test_make_show_names_the_image_the_page_runs():
    shown = subprocess.run(["make", "show"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    assert f'"app": "{CONFIG.image("app")}"' in shown, shown
