"""make bench: run every section side by side and write build/bench/results.json, results.md and PNG plots.

This is the harness: it waits for an idle machine (idle.py), runs the sections (sections/, one module each) on one
app container and one context (context.py), marks what a failed section did not measure, judges the goals (goals.py)
and writes the results (report.py).

The machine is shared and noisy, so absolute times drift: every comparison is a ratio of two runs taken back to back
in the same round (container then host, Horovod then mpi4py, ...), repeated, and reported as the median of the
per-round ratios with their spread. A figure that cannot be measured is kept with the reason.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import docker.errors

from ..common import UserError, log
from ..dockerhost import client
from ..manifest import Config
from . import hostvenv, idle
from .context import BENCH_DIR, TUNED_HOROVOD, AppContainer, Context, Plan, now
from .goals import GOALS
from .report import write_outputs
from .sections.allreduce import allreduce_figure_ids, bench_allreduce
from .sections.coll import bench_coll, coll_figure_ids
from .sections.footprint import bench_footprint, footprint_ids
from .sections.hostmpi import bench_host_mpi, host_mpi_figure_ids
from .sections.phases import bench_horovod_phases, phase_figure_ids
from .sections.startup import bench_startup, startup_figure_ids
from .sections.training import TRAIN_IDS, bench_training
from .stats import unmeasured


def failure_summary(text: str, limit: int = 300) -> str:
    """The first line of an error (which command failed) and its last line that says something: not a rule of '='
    or '-' such as the one MPICH's launcher closes its BAD TERMINATION banner with."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip().strip("=-")]
    if not lines:
        return ""
    summary = lines[0] if len(lines) == 1 else f"{lines[0][:limit // 2]} ... {lines[-1]}"
    return summary[:limit]


def _attempt(ctx: Context, ids: list[tuple[str, str, str, str]], work) -> None:
    """Run `work()`; if it fails, every figure it should have produced is reported not measured, with the error."""
    try:
        work()
    except Exception as error:  # noqa: BLE001 -- one failed section must not lose the others' figures
        reason = f"{type(error).__name__}: {failure_summary(str(error))}"
        log(f"bench: {type(error).__name__}: {str(error).strip()}")  # whole, for the log; the figures get the summary
        for id, section, label, unit in ids:
            if id not in ctx.figures:
                ctx.add(unmeasured(id, section, label, unit, reason))


def expected_ids(plan: Plan, config: Config) -> list[tuple[str, str, str, str]]:
    """Every figure a run of `plan` reports, measured or not."""
    return [*allreduce_figure_ids(plan), *phase_figure_ids(), *coll_figure_ids(config), *host_mpi_figure_ids(config),
            *TRAIN_IDS,
            *startup_figure_ids(plan),
            *footprint_ids(config)]


def run_bench(config: Config, quick: bool, build_host_venv: bool | None = None, insist: bool = False,
              max_wait: float = 600, startup_processes: int = 8) -> Path:
    started_at, started = now(), time.monotonic()
    plan = Plan.make(quick, startup_processes)
    # The quick run (inside `make test`) writes beside the full run's results, never over them.
    out_dir = BENCH_DIR / "quick" if quick else BENCH_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    work = out_dir / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    work.chmod(0o777)  # the image's user (uid 1000) writes here
    ctx = Context(config, plan, work)
    try:
        client().images.get(ctx.app_image)
    except docker.errors.ImageNotFound:
        raise UserError(f"{ctx.app_image} is not built: run `make image` first") from None
    ngc_image = os.environ.get("NGC_IMAGE")
    if ngc_image:
        try:
            client().images.get(ngc_image)
        except docker.errors.ImageNotFound:
            raise UserError(f"NGC_IMAGE={ngc_image} is not in the local docker: `docker pull {ngc_image}` first, "
                            "or unset NGC_IMAGE to compare with the published figure") from None
    if build_host_venv if build_host_venv is not None else not quick:
        try:
            hostvenv.build(config, log)
        except UserError as error:
            log(f"bench: no host venv: {error}")
    idle_check = idle.wait_until_idle(max_wait, insist, quick, log)
    ctx.note_environment("start")
    app = AppContainer(ctx.app_image, work)
    try:
        sections = [("allreduce", bench_allreduce, allreduce_figure_ids(plan)),
                    ("Horovod phases", bench_horovod_phases, phase_figure_ids()),
                    ("allreduce algorithms", bench_coll, coll_figure_ids(config)),
                    ("host MPI", bench_host_mpi, host_mpi_figure_ids(config)),
                    ("training", bench_training, TRAIN_IDS),
                    ("start-up", bench_startup, startup_figure_ids(plan)),
                    ("footprint and build", bench_footprint, footprint_ids(config))]
        for name, section, ids in sections:
            section_started = time.monotonic()
            _attempt(ctx, ids, lambda: section(ctx, app))
            ctx.raw.setdefault("section_seconds", {})[name] = round(time.monotonic() - section_started, 1)
            ctx.note_environment(f"after {name}")
    finally:
        app.remove()
        ctx.close()
    missing = [id for id, *_ in expected_ids(plan, config) if id not in ctx.figures]
    if missing:
        raise RuntimeError(f"figures neither measured nor marked: {missing}")  # a bug in this module
    results = {
        "schema": 1, "quick": quick, "config": config.tag, "app_image": ctx.app_image,
        "app_image_id": client().images.get(ctx.app_image).id, "started": started_at, "finished": now(),
        "duration_seconds": round(time.monotonic() - started, 1), "cpus": os.cpu_count(),
        "plan": {k: v for k, v in plan.__dict__.items()}, "tuned_horovod": TUNED_HOROVOD,
        "idle_check": idle_check, "environment": ctx.environment,
        "figures": [figure.to_json() for figure in ctx.figures.values()],
        "goals": [goal.judge(ctx.figures.get(goal.figure), missing=f"this run does not measure {goal.figure} "
                             f"(start-up at {', '.join(map(str, plan.startup_counts))} processes at once)")
                  for goal in GOALS],
        "raw": ctx.raw,
    }
    return write_outputs(results, out_dir)
