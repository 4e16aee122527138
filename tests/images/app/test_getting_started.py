"""docs/getting-started.md's section 2, "Train on 2 ranks", run as the page writes it: each `docker run` command of the
page (tests/support/getting_started.py takes them from the page) runs once, through the image's entrypoint as a user
types it, and its output is checked against what the page shows and tells the reader to look at.

- `docker run --rm IMAGE`: exit status 0, and the listing names the commands the page runs next;
- `horovodrun -np 2 tfhpc-train-hvd-fit --epochs 3`: every line of the page's example output (`...` any text, `S/S`
  the steps per epoch) in the output, each rank's in the page's order (in the configuration the page shows: another
  one's launcher tags lines otherwise); then what the page says to look at: `"size": 2` on both ranks,
  `"failures": []`, losses that fall, `max_weight_difference_across_ranks` 0.0, the stack's default Keras;
- `launch-local-mwms -n 2 tfhpc-train-mwms-fit --epochs 3` and the Keras 3 example under `horovodrun -np 2`: exit
  status 0, both ranks report a world of 2, the loss falls, the weights agree.

The page names the default configuration's image; another configuration runs the same commands with its own app image
(and its own default Keras). Each command runs once, for all its checks. The page's other commands need a build, a
registry or a Slurm cluster: the tests that run them are named in tests/support/getting_started.py, and
tests/unit/test_getting_started_commands.py checks that the two lists together are exactly the page's commands."""
import json
import subprocess

import pytest

from support.getting_started import PAGE_IMAGE, RUN_IN_THE_APP_IMAGE_TEST, argv, example_output, pattern
from support.results import results
from support.stack import CONFIG, DEFAULT_KERAS

LISTING, HVD_FIT, MWMS_FIT, EXAMPLE = RUN_IN_THE_APP_IMAGE_TEST
TIMEOUT = 900


@pytest.fixture(scope="module")
def ran(image):
    """command of the page -> (exit status, stdout, stderr), each command run once, when first needed."""
    done = {}

    def get(command):
        if command not in done:
            finished = subprocess.run(argv(command, image), capture_output=True, text=True, timeout=TIMEOUT)
            done[command] = finished.returncode, finished.stdout, finished.stderr
        return done[command]

    return get


def succeeded(ran, command):
    status, out, err = ran(command)
    assert status == 0, f"{command} exited {status}:\n{out[-3000:]}\n{err[-3000:]}"
    return out


def test_the_listing_names_the_commands_the_page_runs(ran, image_layer):
    out = succeeded(ran, LISTING)
    for name in ("train-hvd-fit", "launch-local-mwms", "train-mwms-fit"):
        assert f"  {name} " in out, out


def in_order(patterns, lines):
    """The patterns that no line matches, each looked for after the line the one before it matched."""
    missing, start = [], 0
    for expected in patterns:
        found = next((index for index in range(start, len(lines)) if expected.match(lines[index])), None)
        if found is None:
            missing.append(expected.pattern)
        else:
            start = found + 1
    return missing


@pytest.mark.skipif(CONFIG.image("app") != PAGE_IMAGE,
                    reason=f"the page shows what {PAGE_IMAGE} prints (Open MPI 5's output tags, Keras 3's progress "
                           f"line); {CONFIG.image('app')} is checked for what the page says to look at")
def test_the_two_rank_training_prints_the_pages_example(ran, image_layer):
    out = succeeded(ran, HVD_FIT)
    lines = out.splitlines()
    # The RESULT lines as the script prints them (json.dumps with sorted keys) after their rank's tag: mpirun may split
    # a long line of one rank, so they are compared as the parser joined them.
    tags = {report["rank"]: next(line.partition("RESULT ")[0] for line in lines
                                 if line.startswith(f"[1,{report['rank']}]") and "RESULT {" in line)
            for report in results(out, 2)}
    printed = [f"{tags[report['rank']]}RESULT {json.dumps(report, sort_keys=True)}" for report in results(out, 2)]
    example = [line for line in example_output() if line != "..."]
    for tag in ("[1,0]", "[1,1]"):
        expected = [pattern(line) for line in example if line.startswith(tag)]
        mine = [line for line in lines if line.startswith(tag) and "RESULT {" not in line]
        mine += [line for line in printed if line.startswith(tag)]
        missing = in_order(expected, mine)
        assert not missing, f"rank {tag}'s output lacks the page's lines {missing}:\n{out[-3000:]}"


def test_the_two_rank_training_shows_what_the_page_says_to_look_at(ran, image_layer):
    for report in results(succeeded(ran, HVD_FIT), 2):
        assert report["size"] == 2 and report["failures"] == [], report
        assert len(report["losses"]) == 3 and report["losses"][-1] < report["losses"][0], report["losses"]
        assert report["max_weight_difference_across_ranks"] == 0.0, report
        assert report["keras"].split(".")[0] == DEFAULT_KERAS, report["keras"]


def test_multiworkermirroredstrategy_trains_on_two_workers_as_the_page_runs_it(ran, image_layer):
    reports = results(succeeded(ran, MWMS_FIT), 2)
    assert [(report["size"], report["replicas_in_sync"]) for report in reports] == [(2, 2), (2, 2)], reports
    for report in reports:
        assert report["failures"] == [] and report["losses"][-1] < report["losses"][0], report
    assert reports[0]["weights_sum"] == reports[1]["weights_sum"]


@pytest.mark.full("the same script under the same launcher: tests/images/app/test_keras3.py's "
                  "test_horovod_gradient_tape_learns_and_the_ranks_agree; `docker run` through the entrypoint: the "
                  "page's other commands here")
@pytest.mark.skipif(not CONFIG.keras_patches, reason="the stack has no Keras 3 (TensorFlow < 2.16): the page's example "
                                                  "is a Keras 3 script")
def test_the_keras_3_example_trains_on_two_ranks_as_the_page_runs_it(ran, image_layer):
    reports = results(succeeded(ran, EXAMPLE), 2)
    assert [report["size"] for report in reports] == [2, 2], reports
    for report in reports:
        assert report["losses"][-1] < report["losses"][0], report["losses"]
    assert reports[0]["weights_digest"] == reports[1]["weights_digest"]
