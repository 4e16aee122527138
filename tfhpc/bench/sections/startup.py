"""Start-up: the wall time of importing TensorFlow and Horovod from the SIF (as a file, an instance, a sandbox, other
compressions), Docker and the host venv, many processes at once, and the file system calls of one import."""
from __future__ import annotations

import shlex
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from ...common import log
from ...manifest import Manifest
from ...sif import squashfs_compression
from .. import hostvenv
from ..context import STARTUP_MODES, AppContainer, Context, Plan, host_run
from ..stats import Figure, file_calls, one_per_rank, parse_results, parse_strace_summary, ratios, unmeasured

IMPORT_CODE = ("import time, json; t = time.perf_counter(); import tensorflow, horovod.tensorflow; "
               "print('IMPORT ' + json.dumps(time.perf_counter() - t))")
# strace is not in the images or the apptainer helper: the host's strace and its libraries, started through the
# host's dynamic loader with --library-path, run in any of them without changing what the traced program loads.
STRACE_LIBS = ("libunwind-ptrace.so.0", "libunwind-x86_64.so.8", "libunwind.so.8", "liblzma.so.5", "libc.so.6")
# The SIF's squashfs compression against start-up: the sandbox packed again with `apptainer build --mksquashfs-args`
# in each compressor but make sif's own (versions.toml [sif] squashfs_compression), which is the "sif" mode.
SIF_COMPRESSIONS = {"sif_gzip": "-comp gzip", "sif_lz4": "-comp lz4", "sif_zstd": "-comp zstd"}


def startup_figure_ids(plan: Plan) -> list[tuple[str, str, str, str]]:
    ids = []
    for mode, label in STARTUP_MODES.items():
        for count in plan.startup_counts:
            ids.append((f"startup.{mode}.{count}", "startup",
                        f"{label}: import wall time per process, {count} at once", "s"))
        ids.append((f"startup.{mode}.open_calls", "startup", f"{label}: open calls of one import (python only)",
                    "calls"))
        ids.append((f"startup.{mode}.stat_calls", "startup", f"{label}: stat-family calls of one import (python "
                    "only)", "calls"))
        ids.append((f"startup.{mode}.all_calls_tree", "startup", f"{label}: all system calls of the whole command "
                    "(runtime included)", "calls"))
    for mode in ("sif", *SIF_COMPRESSIONS):
        ids.append((f"startup.{mode}.size", "startup", f"{STARTUP_MODES[mode]}: file size", "MB"))
    for count in plan.startup_counts:
        ids.append((f"startup.ratio.venv_sif.{count}", "startup",
                    f"venv / SIF import wall time, {count} at once (> 1: SIF faster)", "ratio"))
        ids.append((f"startup.ratio.sif_docker.{count}", "startup",
                    f"SIF / Docker import wall time, {count} at once (< 1: SIF faster)", "ratio"))
        ids.append((f"startup.ratio.sif_instance_docker.{count}", "startup",
                    f"SIF instance / Docker import wall time, {count} at once (< 1: SIF faster)", "ratio"))
    return ids


def _strace_bundle(out: Path) -> Path:
    """Copy the host's strace, its libraries and dynamic loader into build/bench/strace (see STRACE_LIBS)."""
    strace = shutil.which("strace")
    if not strace:
        raise RuntimeError("strace is not installed on the host (apt-get install strace)")
    bundle = out / "strace"
    (bundle / "lib").mkdir(parents=True, exist_ok=True)
    shutil.copy(strace, bundle / "strace")
    for name in STRACE_LIBS:
        shutil.copy(Path("/lib/x86_64-linux-gnu") / name, bundle / "lib" / name)
    shutil.copy("/lib64/ld-linux-x86-64.so.2", bundle / "ld.so")
    # The image's LD_PRELOAD (its tcmalloc: docs/training.md, memory allocator) is for the traced program: strace,
    # the host's build, would load the image's allocator against the host's libc (GLIBC_2.38 not found on a Debian 12
    # host with a Debian 13 image); strace -E hands it to the traced program alone.
    (bundle / "run").write_text('#!/bin/sh\nd=$(dirname "$0")\npreload=${LD_PRELOAD:+-E LD_PRELOAD=$LD_PRELOAD}\n'
                                'exec env -u LD_PRELOAD "$d/ld.so" --library-path "$d/lib" "$d/strace" $preload "$@"\n')
    for path in bundle.rglob("*"):
        path.chmod(0o755)
    return bundle


def _parallel_script(count: int, command: str) -> str:
    """bash: start `count` copies of COMMAND -c IMPORT_CODE at once; one RESULT line each (wall and import time)."""
    code = shlex.quote(IMPORT_CODE)
    return (f"for i in $(seq 0 {count - 1}); do ( s=$EPOCHREALTIME; out=$({command} -c {code} 2>/dev/null); "
            f"e=$EPOCHREALTIME; imp=$(printf '%s\\n' \"$out\" | sed -n 's/^IMPORT //p'); "
            f"echo \"RESULT {{\\\"rank\\\": $i, \\\"start\\\": $s, \\\"end\\\": $e, \\\"import_s\\\": ${{imp:-null}}}}\" ) & "
            f"done; wait")


@dataclass(frozen=True)
class Starter:
    """How one start-up mode runs: `run(shell command)` where it lives, the python command, and how to strace python
    alone (`python_in`) and the whole command (`tree`: the strace wrapper, None when nothing starts before python)."""

    run: object
    command: str
    python_in: str
    tree: str | None = None


def _startup_runs(ctx: Context, starters: dict[str, Starter], results: dict, reasons: dict) -> None:
    """Warm every mode up once; then, per round and count, run the modes one after the other (side by side); then
    strace one import of each. A mode that fails is dropped with its reason; the others go on."""
    code = shlex.quote(IMPORT_CODE)
    live = dict(starters)

    def guarded(mode, work):
        try:
            work()
        except Exception as error:  # noqa: BLE001
            reasons[mode] = f"{type(error).__name__}: {str(error).strip()[-300:]}"
            live.pop(mode, None)
            results.pop(mode, None)

    for mode, starter in list(live.items()):
        results[mode] = {"walls": {}}
        guarded(mode, lambda: starter.run(f"{starter.command} -c {code} > /dev/null"))  # warm the page cache
    for round_ in range(ctx.plan.startup_rounds):
        for count in ctx.plan.startup_counts:
            for mode, starter in list(live.items()):
                def once(mode=mode, starter=starter):
                    log(f"bench: start-up round {round_ + 1}/{ctx.plan.startup_rounds}: {mode} x{count}")
                    reports = one_per_rank(parse_results(starter.run(_parallel_script(count, starter.command))),
                                           count)
                    missing = [r["rank"] for r in reports if r["import_s"] is None]
                    if missing:
                        raise RuntimeError(f"{mode}: processes {missing} did not finish the import")
                    results[mode]["walls"].setdefault(count, []).append([r["end"] - r["start"] for r in reports])
                    ctx.raw.setdefault("startup", []).append({"mode": mode, "round": round_, "count": count,
                                                              "processes": reports})
                guarded(mode, once)
    for mode, starter in list(live.items()):
        def trace(mode=mode, starter=starter):
            python = file_calls(parse_strace_summary(starter.run(f"{starter.python_in} -c {code} 2>&1 >/dev/null")))
            tree = python if starter.tree is None else file_calls(parse_strace_summary(starter.run(
                f"{starter.tree} -f -c -o /dev/stderr {starter.command} -c {code} 2>&1 >/dev/null")))
            results[mode].update(python=python, tree=tree)
        guarded(mode, trace)


def bench_startup(ctx: Context, app: AppContainer) -> None:
    plan, out = ctx.plan, ctx.out
    bundle = _strace_bundle(out)
    results: dict[str, dict] = {}
    reasons = {mode: "QUICK=1 measures the SIF (also as an instance), Docker and the venv only (the goals); "
                     "`make bench` measures every mode" for mode in STARTUP_MODES if mode not in plan.startup_modes}
    sizes: dict[str, float] = {}
    starters: dict[str, Starter] = {}
    # The Docker container: the bench output directory is /out there, so strace is /out/strace/run.
    starters["docker"] = Starter(app.run, "python3", "/out/strace/run -f -c -o /dev/stderr python3")
    if hostvenv.ready(ctx.config):
        python = hostvenv.HOST_VENV / "bin" / "python"
        starters["venv"] = Starter(lambda c: host_run(c), str(python), f"{bundle / 'run'} -f -c -o /dev/stderr {python}")
    else:
        reasons.setdefault("venv", "the host venv build/bench/host-venv is not built (a full `make bench` builds "
                                   "it once)")
    # python alone: strace bound into the container and run there; the whole command: strace outside.
    inside = "-B /out/strace:/opt/strace"

    def apptainer_starter(image: str) -> Starter:
        return Starter(ctx.in_sif_helper, f"apptainer exec {image} python3",
                       f"apptainer exec {inside} {image} /opt/strace/run -f -c -o /dev/stderr python3",
                       "/out/strace/run")
    try:
        in_sif = ctx.sif()
    except RuntimeError as error:
        in_sif = None
        for mode in ("sif", "sif_instance", "sandbox", *SIF_COMPRESSIONS):
            reasons.setdefault(mode, str(error))
    if in_sif and {"sif", "sandbox", *SIF_COMPRESSIONS} & set(plan.startup_modes):
        starters["sif"] = apptainer_starter(in_sif)
        if "sif_instance" in plan.startup_modes:
            try:  # `apptainer instance start` once; every process then joins its namespaces and its one mount
                ctx.in_sif_helper(f"apptainer instance start {inside} {in_sif} tfhpc-bench > /tmp/instance.log 2>&1")
                instance = "instance://tfhpc-bench"
                starters["sif_instance"] = Starter(ctx.in_sif_helper, f"apptainer exec {instance} python3",
                                                   f"apptainer exec {instance} /opt/strace/run -f -c -o /dev/stderr "
                                                   "python3", "/out/strace/run")
            except Exception as error:  # noqa: BLE001
                reasons["sif_instance"] = f"apptainer instance start failed: {str(error).strip()[-300:]}"
        sizes["sif"] = float(ctx.in_sif_helper(f"stat -c %s {in_sif}").split()[-1]) / 1e6
        if {"sandbox", *SIF_COMPRESSIONS} & set(plan.startup_modes):
            try:
                started = time.monotonic()
                ctx.in_sif_helper(f"apptainer build --sandbox /tmp/sandbox {in_sif} > /tmp/sandbox.log 2>&1")
                ctx.raw["sandbox_unpack_seconds"] = round(time.monotonic() - started, 1)
                starters["sandbox"] = apptainer_starter("/tmp/sandbox")
            except Exception as error:  # noqa: BLE001
                for mode in ("sandbox", *SIF_COMPRESSIONS):
                    reasons[mode] = f"unpacking the SIF failed: {str(error).strip()[-300:]}"
        own = squashfs_compression(Manifest())
        for mode, args in SIF_COMPRESSIONS.items():
            if args == f"-comp {own}":
                reasons[mode] = f"make sif's own compression ({own}): the SIF figures"
                continue
            if mode not in plan.startup_modes or "sandbox" not in starters:
                continue
            try:
                started = time.monotonic()
                ctx.in_sif_helper(f"apptainer build --mksquashfs-args {shlex.quote(args)} /tmp/{mode}.sif "
                                  f"/tmp/sandbox > /tmp/{mode}.log 2>&1")
                ctx.raw.setdefault("sif_pack_seconds", {})[mode] = round(time.monotonic() - started, 1)
                sizes[mode] = float(ctx.in_sif_helper(f"stat -c %s /tmp/{mode}.sif").split()[-1]) / 1e6
                starters[mode] = apptainer_starter(f"/tmp/{mode}.sif")
            except Exception as error:  # noqa: BLE001
                reasons[mode] = f"packing the sandbox with {args} failed: {str(error).strip()[-300:]}"
    _startup_runs(ctx, {m: s for m, s in starters.items() if m in plan.startup_modes}, results, reasons)

    ids = {id: (label, unit) for id, _s, label, unit in startup_figure_ids(plan)}
    for mode in STARTUP_MODES:
        if mode not in results:
            for id in ids:
                if id.startswith(f"startup.{mode}.") and not id.endswith(".size"):  # sizes: below
                    ctx.add(unmeasured(id, "startup", *ids[id], reasons.get(mode, "not run")))
            continue
        data = results[mode]
        for count in plan.startup_counts:
            id = f"startup.{mode}.{count}"
            ctx.add(Figure(id, "startup", *ids[id], samples=[w for round_ in data["walls"][count] for w in round_],
                           note="samples: every process of every round (process start to exit, warm page cache)"))
        for kind, key in (("open_calls", "open"), ("stat_calls", "stat")):
            id = f"startup.{mode}.{kind}"
            ctx.add(Figure(id, "startup", *ids[id], samples=[data["python"][key]],
                           note=f"strace -f -c of python alone; {data['python']['failed']} of the open/stat calls "
                                "failed (paths searched)"))
        id = f"startup.{mode}.all_calls_tree"
        ctx.add(Figure(id, "startup", *ids[id], samples=[data["tree"]["all"]],
                       note=f"strace -f -c of the whole command: open {data['tree']['open']}, stat-family "
                            f"{data['tree']['stat']}"))
    for mode in ("sif", *SIF_COMPRESSIONS):
        id = f"startup.{mode}.size"
        if mode in sizes:
            pack = ctx.raw.get("sif_pack_seconds", {}).get(mode)
            ctx.add(Figure(id, "startup", *ids[id], samples=[sizes[mode]],
                           note=f"packed from the sandbox in {pack} s" if pack else "make sif's SIF"))
        else:
            ctx.add(unmeasured(id, "startup", *ids[id], reasons.get(mode, "not run")))
    for count in plan.startup_counts:
        for id, a, b in ((f"startup.ratio.venv_sif.{count}", "venv", "sif"),
                         (f"startup.ratio.sif_docker.{count}", "sif", "docker"),
                         (f"startup.ratio.sif_instance_docker.{count}", "sif_instance", "docker")):
            if a in results and b in results:
                first = [statistics.median(r) for r in results[a]["walls"][count]]
                second = [statistics.median(r) for r in results[b]["walls"][count]]
                ctx.add(Figure(id, "startup", *ids[id], samples=ratios(first, second),
                               note=f"per round: median process wall time, {a} / {b}"))
            else:
                ctx.add(unmeasured(id, "startup", *ids[id], reasons.get(a) or reasons.get(b, "not run")))
