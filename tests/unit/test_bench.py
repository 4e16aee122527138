"""The benchmark's arithmetic and parsing (tfhpc/bench/stats.py, the harness's and sections' pure parts,
report.py): no docker."""
import json
import math
import shlex
import shutil
import subprocess
import sys

import pytest

from tfhpc import REPO_ROOT
from tfhpc.bench import context, goals, run, stats
from tfhpc.bench.sections import footprint, startup
from tfhpc.bench.report import markdown, write_outputs

MB = 1 << 20


def test_busbw_is_nccl_tests_definition():
    # nccl-tests: algbw = S / t, busbw = algbw * 2 (N - 1) / N
    assert stats.busbw(64 * MB, 0.1, 2) == pytest.approx(64 * MB / 0.1)  # N = 2: factor 1
    assert stats.busbw(1000, 1.0, 4) == pytest.approx(1500.0)  # factor 2 * 3 / 4
    assert stats.busbw(1000, 1.0, 1) == 0.0  # one rank moves nothing
    with pytest.raises(ValueError):
        stats.busbw(1000, 0.0, 2)


def test_efficiency():
    assert stats.efficiency(180.0, 100.0, 2) == pytest.approx(0.9)
    assert stats.efficiency(200.0, 100.0, 2) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        stats.efficiency(1.0, 0.0, 2)


def test_quantile_matches_numpys_linear_interpolation():
    values = [7.0, 1.0, 3.0, 5.0]
    assert stats.quantile(values, 0.0) == 1.0 and stats.quantile(values, 1.0) == 7.0
    assert stats.quantile(values, 0.5) == pytest.approx(4.0)
    assert stats.quantile(values, 0.25) == pytest.approx(2.5)
    assert stats.quantile([2.0], 0.75) == 2.0


def test_summary_median_and_spread():
    s = stats.summary([4.0, 1.0, 2.0, 3.0, 100.0])
    assert s["median"] == 3.0 and s["min"] == 1.0 and s["max"] == 100.0 and s["n"] == 5
    assert s["q1"] == 2.0 and s["q3"] == 4.0
    assert s["rel_spread"] == pytest.approx((100.0 - 1.0) / 2 / 3.0)
    with pytest.raises(ValueError):
        stats.summary([])
    with pytest.raises(ValueError):
        stats.summary([1.0, math.nan])


def test_side_by_side_ratios_pair_samples():
    assert stats.ratios([2.0, 3.0], [1.0, 2.0]) == [2.0, 1.5]
    with pytest.raises(ValueError):
        stats.ratios([1.0], [1.0, 2.0])


def test_parse_results_ignores_launcher_prefixes():
    output = "\n".join([
        "[1,0]<stdout>:RESULT {\"rank\": 0, \"x\": 1}",
        "noise RESULT without json",
        "[worker 1] RESULT {\"rank\": 1, \"x\": 2}",
        "Img/sec per worker: 12",
    ])
    reports = stats.parse_results(output)
    assert [r["x"] for r in reports] == [1, 2]
    assert [r["rank"] for r in stats.one_per_rank(reports, 2)] == [0, 1]
    with pytest.raises(ValueError):
        stats.one_per_rank(reports, 3)
    with pytest.raises(ValueError):
        stats.one_per_rank(reports + [{"rank": 1}], 2)
    with pytest.raises(ValueError):
        stats.parse_results("RESULT {\"rank\": 0,")


STRACE = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 30.00    0.003000           1      2500       900 newfstatat
 20.00    0.002000           1      1800       600 openat
 10.00    0.001000           1      1200           read
  5.00    0.000500           1       300           fstat
  1.00    0.000100           1        40        40 readlink
  0.50    0.000050           1        10           mmap
------ ----------- ----------- --------- --------- ----------------
100.00    0.010000           1      5850      1540 total
"""


def test_parse_strace_summary_and_file_calls():
    counts = stats.parse_strace_summary(STRACE)
    assert counts["newfstatat"] == {"calls": 2500, "errors": 900}
    assert counts["read"] == {"calls": 1200, "errors": 0}
    assert "total" not in counts
    calls = stats.file_calls(counts)
    assert calls == {"open": 1800, "stat": 2500 + 300 + 40, "failed": 900 + 600 + 40, "all": 5850}
    with pytest.raises(ValueError):
        stats.parse_strace_summary("strace: exec: No such file or directory")


def test_figures_keep_the_reason_when_not_measured():
    figure = stats.unmeasured("x", "s", "label", "s", "the SIF is missing")
    data = figure.to_json()
    assert data["status"] == "not measured" and data["value"] is None and data["reason"] == "the SIF is missing"
    with pytest.raises(ValueError):
        stats.unmeasured("x", "s", "label", "s", "")
    measured = stats.Figure("y", "s", "label", "s", samples=[3.0, 1.0, 2.0]).to_json()
    assert measured["status"] == "measured" and measured["value"]["median"] == 2.0


def test_goals_say_by_how_much_they_are_missed():
    at_least = stats.Goal("g", "f", 0.9, "ratio >= 0.9")
    missed = at_least.judge(stats.Figure("f", "s", "l", "ratio", samples=[0.6, 0.7, 0.8]))
    assert missed["met"] is False and missed["gap"] == pytest.approx(-0.2) and "missed by 0.2" in missed["verdict"]
    assert at_least.judge(stats.Figure("f", "s", "l", "ratio", samples=[0.95]))["met"] is True
    at_most = stats.Goal("r", "f", 30.0, "<= 30 s", at_most=True)
    assert at_most.judge(stats.Figure("f", "s", "l", "s", samples=[12.0]))["met"] is True
    assert at_most.judge(stats.Figure("f", "s", "l", "s", samples=[45.0]))["met"] is False
    unjudged = at_least.judge(stats.unmeasured("f", "s", "l", "ratio", "no host venv"))
    assert unjudged["met"] is None and "no host venv" in unjudged["verdict"]


def test_recorded_builds_cold_and_warm(tmp_path):
    path = tmp_path / "build-times.jsonl"
    entries = [{"when": "t1", "config": "latest-cpu-openmpi", "seconds": {"base": 60, "total": 900.0}},
               {"when": "t2", "config": "latest-cpu-openmpi", "seconds": {"base": 1, "total": 12.0}},
               {"when": "t3", "config": "latest-cpu-mpich", "seconds": {"total": 5.0}}]
    path.write_text("\n".join(json.dumps(e) for e in entries) + "\nnot json\n")
    found = footprint.recorded_builds(path, "latest-cpu-openmpi")
    assert [e["when"] for e in found] == ["t1", "t2"]
    cold, warm = footprint.cold_and_warm(found)
    assert cold["when"] == "t1" and warm["when"] == "t2"
    assert footprint.cold_and_warm(found[:1]) == (found[0], None)
    assert footprint.recorded_builds(tmp_path / "missing.jsonl", "x") == []


def test_parallel_start_script_reports_every_process():
    # A stand-in for python: prints the IMPORT line the real import code prints, ignoring "-c CODE".
    script = startup._parallel_script(3, "sh -c 'echo IMPORT 0.25' sh")
    output = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60).stdout
    reports = stats.one_per_rank(stats.parse_results(output), 3)
    assert all(r["import_s"] == 0.25 and r["end"] >= r["start"] > 0 for r in reports)
    failing = subprocess.run(["bash", "-c", startup._parallel_script(1, "false")], capture_output=True, text=True,
                             timeout=60).stdout
    assert stats.parse_results(failing)[0]["import_s"] is None  # a failed import is seen, not timed


def test_allreduce_probe_memcpy_mode():
    probe = REPO_ROOT / "tfhpc" / "bench" / "probes" / "allreduce.py"
    out = subprocess.run([sys.executable, str(probe), "--impl", "memcpy", "--sizes", "1024,1048576", "--reps", "3",
                          "--block-seconds", "0.01"], capture_output=True, text=True, timeout=120, check=True).stdout
    report = stats.one_per_rank(stats.parse_results(out), 1)[0]
    assert set(report["seconds_per_op"]) == {"1024", "1048576"}
    assert all(len(times) == 3 and all(t > 0 for t in times) for times in report["seconds_per_op"].values())


def test_every_goal_names_a_figure_the_plan_produces(manifest, config):
    for quick in (True, False):
        plan = context.Plan.make(quick)
        ids = {id for id, *_ in run.expected_ids(plan, config)}
        assert {goal.figure for goal in goals.GOALS} <= ids, quick
        assert 64 * MB in plan.sizes and 8 in plan.startup_counts


def test_report_tables_and_plots(tmp_path):
    figures = [stats.Figure(f"allreduce.mpi4py.{1024}", "allreduce", "mpi4py: busbw, 1 KB", "GB/s",
                            samples=[0.1, 0.2, 0.3]),
               stats.unmeasured("startup.venv.8", "startup", "venv: import, 8 at once", "s", "no host venv")]
    results = {"quick": True, "finished": "now", "app_image": "img", "cpus": 2, "duration_seconds": 1.0,
               "environment": [{"moment": "start", "loadavg": [1.0, 1.0, 1.0], "other_containers": ["c (i)"]}],
               "goals": [stats.Goal("g", "startup.venv.8", 1.0, "goal text").judge(figures[1])],
               "figures": [f.to_json() for f in figures],
               "raw": {"allreduce_sweep": {"mpi4py": {"1024": 0.2, "1048576": 2.0}}}}
    text = markdown(results)
    assert "| mpi4py: busbw, 1 KB | 0.2 | 0.1–0.3 (n=3) | GB/s |" in text
    assert "| venv: import, 8 at once | not measured | | s | no host venv |" in text
    assert "not judged: no host venv" in text and "c (i)" in text
    path = write_outputs(results, tmp_path)
    assert json.loads(path.read_text())["plots"] == ["allreduce.png"]
    assert (tmp_path / "allreduce.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _FakeContext:
    def __init__(self, config):
        self.config = config


def _ngc(config, app_bytes=5_000_000_000):
    seen = {}
    footprint.ngc_ratio(_FakeContext(config), app_bytes,
                  lambda value, note, source: seen.update(value=value, note=note, source=source),
                  lambda reason: seen.update(reason=reason))
    return seen


def test_ngc_ratio_uses_the_published_reference_for_the_gpu_flavour(manifest, monkeypatch):
    monkeypatch.delenv("NGC_IMAGE", raising=False)
    reference = manifest.data["bench"]["ngc_reference"]
    seen = _ngc(manifest.config(flavor="gpu"))
    assert seen["value"] == pytest.approx(5_000_000_000 / reference["bytes"])
    assert reference["image"] in seen["note"] and seen["source"] == reference["source"]
    run_goal = next(goal for goal in goals.GOALS if goal.figure == "size.ratio.ngc")
    assert run_goal.at_most and run_goal.target == 0.5


def test_ngc_ratio_is_not_a_goal_of_the_cpu_flavour(manifest, monkeypatch):
    monkeypatch.delenv("NGC_IMAGE", raising=False)
    seen = _ngc(manifest.config(flavor="cpu"))
    assert "value" not in seen and "replaces no NGC image" in seen["reason"]


def test_the_rebuild_copies_what_dockerignore_lets_into_the_context(tmp_path):
    from tfhpc import REPO_ROOT
    from tfhpc.bench.sections.footprint import context_paths
    assert set(context_paths(REPO_ROOT / ".dockerignore")) == {"containers", "examples", "locks", "scripts",
                                                               "tests/cluster/nodes"}
    ignore = tmp_path / ".dockerignore"
    ignore.write_text("*\n!a/\n!b/c/\n**/__pycache__\n!file.txt\n")
    assert context_paths(ignore) == ["a", "b/c"]


def _machine(load, containers=()):
    return {"loadavg": [load, load, load], "other_containers": list(containers), "busiest_processes": []}


def test_busy_reasons_name_the_load_and_the_containers():
    from tfhpc.bench import idle
    assert idle.busy_reasons(_machine(0.3), cpus=2) == []
    assert idle.busy_reasons(_machine(1.8), cpus=2) == ["load 1.80 > 0.50"]
    assert idle.busy_reasons(_machine(0.1, ["tfhpc-node1 (img)"]), cpus=2) == ["containers running: tfhpc-node1 (img)"]


class _Clock:
    def __init__(self):
        self.now = 0.0

    def sleep(self, seconds):
        self.now += seconds


def test_bench_waits_for_the_load_to_fall_then_measures():
    from tfhpc.bench import idle
    clock, loads = _Clock(), iter([1.9, 1.2, 0.4])
    record = idle.wait_until_idle(600, insist=False, quick=False, log=lambda m: None,
                                  state=lambda: _machine(next(loads)), sleep=clock.sleep, clock=lambda: clock.now,
                                  cpus=2)
    assert record["idle"] and record["waited_seconds"] == 2 * idle.POLL_SECONDS and not record["insisted"]


def test_busy_machine_is_refused_in_one_line_unless_insisted_or_quick():
    from tfhpc.bench import idle
    from tfhpc.common import UserError
    busy = dict(log=lambda m: None, state=lambda: _machine(1.9, ["x (y)"]), cpus=2)
    clock = _Clock()
    with pytest.raises(UserError) as error:
        idle.wait_until_idle(60, insist=False, quick=False, sleep=clock.sleep, clock=lambda: clock.now, **busy)
    assert "\n" not in str(error.value) and "INSIST=1" in str(error.value) and "load 1.90" in str(error.value)
    assert clock.now >= 60
    for flags in ({"insist": True, "quick": False}, {"insist": False, "quick": True}):
        clock = _Clock()
        record = idle.wait_until_idle(60, sleep=clock.sleep, clock=lambda: clock.now, **flags, **busy)
        assert not record["idle"] and record["insisted"] and record["reasons"]
    assert clock.now == 0, "the quick run inside make test does not wait"


def test_report_says_when_the_machine_was_busy():
    results = {"quick": False, "finished": "now", "app_image": "img", "cpus": 2, "duration_seconds": 1.0,
               "environment": [{"moment": "start", "loadavg": [1.9, 1.0, 1.0], "other_containers": []}],
               "idle_check": {"idle": False, "reasons": ["load 1.90 > 0.50"], "waited_seconds": 600,
                              "insisted": True},
               "goals": [], "figures": [], "raw": {}}
    assert "**Taken on a busy machine** (load 1.90 > 0.50, INSIST=1)" in markdown(results)
    results["idle_check"] = {"idle": True, "reasons": [], "waited_seconds": 30.0, "insisted": False}
    assert "Idle at the start (30 s of waiting)." in markdown(results)


def _allreduce_events(ts, elements, negotiate=10, mpi=50, copies=5):
    """One operation as Horovod's timeline writes it (pid 1), starting at ts (microseconds)."""
    start = ts + negotiate + 2
    return [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": ts, "pid": 1},
            {"ph": "X", "name": "0", "ts": ts + 1, "pid": 1, "dur": 0},
            {"ph": "E", "ts": ts + negotiate, "pid": 1},
            {"ph": "B", "name": "ALLREDUCE", "ts": start, "pid": 1},
            {"ph": "B", "name": "MPI_ALLREDUCE", "ts": start + copies, "pid": 1},
            {"ph": "E", "ts": start + copies + mpi, "pid": 1},
            {"ph": "E", "ts": start + copies + mpi, "pid": 1,
             "args": {"dtype": "float32", "shape": f"[{elements}]"}}]


def test_horovod_timeline_phases_per_size():
    events = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "HorovodAllreduce"}}]
    for ts in (0, 1000, 2000):  # three 1 KB operations, 1000 us apart
        events += _allreduce_events(ts, 256)
    events += _allreduce_events(3000, 1)  # the probe's barrier: another size
    events += _allreduce_events(4000, 16, negotiate=20, mpi=400)
    phases = stats.horovod_phases(events)
    assert phases[1024] == {"negotiate": 0.010, "queue": 0.002, "mpi": 0.050, "copies": 0.005,
                            "outside": pytest.approx(1.0 - 0.067), "ops": 3}
    assert phases[64]["mpi"] == 0.4 and phases[64]["outside"] is None, "no second 64-byte operation follows"
    # the timeline as a killed job leaves it: an open array, cut inside the last event
    text = json.dumps(events)[:-1] + ',\n{"ph": "B", "name": "NEGO'
    assert stats.load_trace(text) == events


@pytest.mark.parametrize("mpi", sorted(context.RANK_OUTPUT))
def test_rank_outputs_reads_every_rank_in_order(tmp_path, mpi):
    layout = context.RANK_OUTPUT[mpi][1]
    for rank, stream, text in ((1, "stdout", 'RESULT {"rank": 1}\n'), (0, "stdout", 'RESULT {"rank": 0}\n'),
                               (1, "stderr", "a warning\n")):
        path = tmp_path / layout.format(rank=rank, stream=stream)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    output = context.rank_outputs(tmp_path, 2, mpi)
    assert [r["rank"] for r in stats.one_per_rank(stats.parse_results(output), 2)] == [0, 1]
    assert output.index('"rank": 0') < output.index('"rank": 1') < output.index("a warning")
    with pytest.raises(RuntimeError, match="rank.2"):
        context.rank_outputs(tmp_path, 3, mpi)
    assert "a warning" in context.rank_outputs(tmp_path, 3, mpi, partial=True)


HOST_OPEN_MPI = bool(shutil.which("mpirun")) and "Open MPI" in subprocess.run(
    ["mpirun", "--version"], capture_output=True, text=True).stdout
ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@pytest.mark.skipif(not HOST_OPEN_MPI, reason="no host Open MPI mpirun")
def test_host_mpirun_returns_each_ranks_lines_whole():
    code = "import os, json; print('RESULT ' + json.dumps({'rank': int(os.environ['OMPI_COMM_WORLD_RANK']), 'x': 'y' * 5000}))"
    output = context.host_mpirun("openmpi", 2, f"{sys.executable} -c {shlex.quote(code)}", ROOT_OK)
    assert [r["rank"] for r in stats.one_per_rank(stats.parse_results(output), 2)] == [0, 1]


@pytest.mark.skipif(not HOST_OPEN_MPI, reason="no host Open MPI mpirun")
def test_host_mpirun_failure_carries_the_ranks_output():
    code = "import sys; print('rank says why', file=sys.stderr); sys.exit(3)"
    with pytest.raises(RuntimeError, match="rank says why"):
        context.host_mpirun("openmpi", 2, f"{sys.executable} -c {shlex.quote(code)}", ROOT_OK)


def test_a_failed_sections_reason_keeps_the_command_and_the_last_line_that_says_something():
    banner = ("`mpiexec -n 2 probe` exited 9: \n" + "=" * 80 + "\n=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n"
              "=   RANK 1 PID 77 RUNNING AT vm\n=   KILLED BY SIGNAL: 9 (Killed)\n" + "=" * 80 + "\n")
    assert run.failure_summary(banner) == "`mpiexec -n 2 probe` exited 9: ... =   KILLED BY SIGNAL: 9 (Killed)"
    assert run.failure_summary("one line only") == "one line only"
    assert run.failure_summary("=" * 80) == "" and len(run.failure_summary("x" * 1000)) == 300
