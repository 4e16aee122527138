"""`make bench QUICK=1` as `make test` runs it: the short benchmark runs on the built images and SIF, and its
results file holds every figure the plan names, each either measured with sane values or marked not measured with
the reason. Speed goals are reported by the benchmark and never asserted here (the machine is shared).

The start-up section runs at 1 and 2 processes at once instead of the goals' 8 (`--startup-processes 2`): the same
code, a quarter of the time (each process imports TensorFlow on the machine's 2 cores; 8 at once took about 80 of the
run's 230 s). The 8-process goals are then "not judged" with that reason, which the goal check below accepts;
`make bench` judges them."""
import json
import math
import os
import subprocess
import sys

import pytest

from tfhpc import REPO_ROOT
from tfhpc.bench import context, goals, idle, run

# The full tier: the bench's own code is tested in tests/unit/test_bench.py, and every run it times is a run that a
# test of the test tier makes and checks (allreduce: tests/images/horovod; training: tests/images/app; start-up:
# tests/sif and tests/runtimes; host MPIs: tests/sites); what this adds is the figures, and figures are not checks.
pytestmark = pytest.mark.full("the bench's code: tests/unit/test_bench.py; its runs: the image, SIF and site tests")

RESULTS = context.BENCH_DIR / "quick" / "results.json"
STARTUP_PROCESSES = 2
# Plausible ranges per unit: a value outside is a broken measurement (a unit slip, a zero time), not a slow machine.
# "ms" starts at 0: a Horovod phase can last less than its timeline's resolution of 1 us.
SANE = {"GB/s": (1e-7, 1000.0), "ratio": (1e-6, 1000.0), "img/s": (1.0, 1e6), "s": (0.0, 3600.0),
        "calls": (1.0, 1e8), "MB": (0.001, 1e6), "inodes": (1.0, 1e8), "ms": (0.0, 1e5)}
# Figures the quick run must measure wherever `make test` runs (images, SIFs and the MPICH stack are built by then):
# the container side of every section. The host venv's figures are not among them: a fresh CI machine has no host
# venv (the full bench builds it), and they are then "not measured" with that reason.
MUST_MEASURE = ("allreduce.", "hostmpi.", "train.container.", "train.efficiency.container.", "train.ratio.hvd_mwms",
                "startup.sif.", "size.", "inodes.image", "build.rebuild_one_script", "build.app_warm")
HOST_VENV_FIGURES = ("size.host_venv", "inodes.host_venv")
# Measured in the GPU flavour only (it is the image NGC's replaces); must be measured there ("size." above).
GPU_ONLY_FIGURES = ("size.ratio.ngc",)
# Keras 3 against tf_keras: only where the stack has Keras 3 (the conservative stack's TensorFlow 2.15 has Keras 2).
KERAS3_FIGURES = ("train.container.hvd2_tfkeras", "train.container.mwms2_tfkeras")


@pytest.fixture(scope="module")
def results():
    started = os.times().elapsed
    done = subprocess.run([sys.executable, "-m", "tfhpc", "bench", "--quick", "--startup-processes",
                           str(STARTUP_PROCESSES)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"make bench QUICK=1 failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    data = json.loads(RESULTS.read_text())
    assert data["quick"] is True and data["finished"] >= data["started"]
    assert data["plan"]["startup_counts"] == [1, STARTUP_PROCESSES]
    assert data["duration_seconds"] <= os.times().elapsed - started + 1
    return data


def test_every_planned_figure_is_reported_once(results, config):
    plan = context.Plan.make(quick=True, startup_processes=STARTUP_PROCESSES)
    expected = [id for id, *_ in run.expected_ids(plan, config)]
    reported = [f["id"] for f in results["figures"]]
    assert sorted(reported) == sorted(expected)


def test_figures_are_measured_with_sane_values_or_say_why_not(results, config):
    exempt = (HOST_VENV_FIGURES + (GPU_ONLY_FIGURES if config.flavor != "gpu" else ())
              + (KERAS3_FIGURES if not config.keras_patches else ()))
    for figure in results["figures"]:
        if figure["status"] == "not measured":
            assert figure["value"] is None and figure["samples"] == [], figure["id"]
            assert len(figure["reason"]) > 10, f"{figure['id']}: not measured without a reason"
            if figure["id"] not in exempt:
                assert not figure["id"].startswith(MUST_MEASURE), f"{figure['id']}: {figure['reason']}"
            continue
        assert figure["status"] == "measured" and not figure["reason"], figure["id"]
        low, high = SANE[figure["unit"]]
        value = figure["value"]
        assert all(math.isfinite(v) and low <= v <= high for v in figure["samples"]), (figure["id"], value)
        assert value["min"] <= value["median"] <= value["max"] and value["n"] == len(figure["samples"])


def test_ratios_agree_with_the_figures_they_come_from(results):
    figures = {f["id"]: f for f in results["figures"]}
    size = str(64 << 20)
    ratio = figures[f"allreduce.ratio.horovod_mpi.{size}"]["value"]["median"]
    direct = figures[f"allreduce.horovod_mpi.{size}"]["value"]["median"] / figures[f"allreduce.mpi4py.{size}"][
        "value"]["median"]
    assert 0.25 < ratio / direct < 4  # per-round ratios vs pooled medians: close, not equal (rounds differ)
    efficiency = figures["train.efficiency.container.hvd"]["value"]["median"]
    pooled = figures["train.container.hvd2"]["value"]["median"] / (2 * figures["train.container.hvd1"]["value"]["median"])
    assert 0.25 < efficiency / pooled < 4


def test_every_goal_is_judged_or_says_why_not(results):
    assert {g["id"] for g in results["goals"]} == {g.id for g in goals.GOALS}
    for goal in results["goals"]:
        if goal["met"] is None:
            assert goal["verdict"].startswith("not judged: ") and len(goal["verdict"]) > 20, goal
        else:
            assert goal["verdict"] == "met" if goal["met"] else goal["verdict"].startswith("missed by "), goal
            assert (goal["value"] <= goal["target"]) == goal["met"] if goal["at_most"] else \
                (goal["value"] >= goal["target"]) == goal["met"]


def test_markdown_and_plots_are_written(results):
    text = (RESULTS.parent / "results.md").read_text()
    for figure in results["figures"]:
        assert figure["label"] in text
    assert results["plots"], results.get("plots_error")
    for name in results["plots"]:
        assert (RESULTS.parent / name).read_bytes()[:4] == b"\x89PNG"


def test_what_else_was_running_is_recorded(results):
    assert len(results["environment"]) >= 2
    assert all(len(e["loadavg"]) == 3 and isinstance(e["other_containers"], list) for e in results["environment"])
    check = results["idle_check"]  # QUICK=1 never waits; it records whether the machine was idle and why not
    assert check["waited_seconds"] < idle.POLL_SECONDS and check["idle"] == (not check["reasons"])
    assert check["insisted"] == (not check["idle"])
