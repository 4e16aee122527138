"""make bench: run every measurement side by side and write build/bench/results.json, results.md and PNG plots.

The machine is shared and noisy, so absolute times drift: every comparison is a ratio of two runs taken back to back
in the same round (container then host, Horovod then mpi4py, ...), repeated, and reported as the median of the
per-round ratios with their spread. A figure that cannot be measured is kept with the reason.
"""
from __future__ import annotations

import datetime
import json
import os
import shlex
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..common import REPO_ROOT, UserError, default_ca_bundle, log, resolve_ca_bundle
from ..manifest import Config, Manifest
from . import hostvenv, idle
from .stats import (Figure, Goal, busbw, efficiency, file_calls, horovod_phases, human_bytes, load_trace,
                    one_per_rank, parse_results, parse_strace_summary, ratios, unmeasured)

BENCH_DIR = REPO_ROOT / "build" / "bench"
PROBES = Path(__file__).resolve().parent / "probes"
BUILD_TIMES = BENCH_DIR / "build-times.jsonl"
MB = 1 << 20
RANKS = 2  # the sweep: 2 ranks (this machine has 2 cores)
# Horovod "tuned": the background thread wakes every HOROVOD_CYCLE_TIME ms to negotiate; a 2-rank shared-memory
# allreduce of a small tensor takes tens of microseconds, so a shorter cycle cuts latency. A fusion buffer of
# 128 MB lets the 16-tensor pattern of the sweep's largest sizes go in one fused operation.
TUNED_HOROVOD = {"HOROVOD_CYCLE_TIME": "0.1", "HOROVOD_FUSION_THRESHOLD": str(128 * MB)}
IMPORT_CODE = ("import time, json; t = time.perf_counter(); import tensorflow, horovod.tensorflow; "
               "print('IMPORT ' + json.dumps(time.perf_counter() - t))")
# strace is not in the images or the apptainer helper: the host's strace and its libraries, started through the
# host's dynamic loader with --library-path, run in any of them without changing what the traced program loads.
STRACE_LIBS = ("libunwind-ptrace.so.0", "libunwind-x86_64.so.8", "libunwind.so.8", "liblzma.so.5", "libc.so.6")


@dataclass(frozen=True)
class Plan:
    """How much to run: QUICK=1 (inside `make test`, ~3 min) or the full benchmark."""

    quick: bool
    sizes: tuple[int, ...]
    fused_sizes: tuple[int, ...]
    reps: int
    block_seconds: float
    allreduce_rounds: int
    train_rounds: int
    train_args: tuple[str, ...]
    startup_counts: tuple[int, ...]
    startup_rounds: int
    startup_modes: tuple[str, ...]
    coll_rounds: int  # rounds of the MPI allreduce algorithm sweep (0: not run)

    @classmethod
    def make(cls, quick: bool) -> "Plan":
        if quick:  # what the goals need, once (ratios n=1): the SIF and the venv at 1 and 8 processes, 64 MB
            return cls(True, (1 << 10, 64 * MB), (64 * MB,), 3, 0.03, 1, 1,
                       ("--iters", "3", "--batches-per-iter", "5", "--warmup-batches", "2"), (1, 8), 1,
                       ("sif", "sif_instance", "docker", "venv"), 0)
        return cls(False, tuple(1 << e for e in range(10, 29, 2)), (1 * MB, 16 * MB, 64 * MB, 256 * MB), 5, 0.1,
                   3, 3, ("--iters", "5", "--batches-per-iter", "10", "--warmup-batches", "3"), (1, 4, 8), 2,
                   tuple(STARTUP_MODES), 3)


class Context:
    """What every section needs: the configuration, figures collected so far, the running containers."""

    def __init__(self, config: Config, plan: Plan, out: Path):
        self.config, self.plan, self.out = config, plan, out
        self.figures: dict[str, Figure] = {}
        self.raw: dict = {}
        self.environment: list[dict] = []
        self.app_image = config.image(config.layers.leaf)
        self._helper = None

    def in_sif_helper(self, command: str) -> str:
        """Run a shell command as the unprivileged user in the apptainer helper container (started on first use,
        removed by close()): build/sif at /sif, the probes at /bench, the work directory at /out."""
        from ..apptainer import helper_image_name, start_helper
        from ..sif import SIF_DIR
        if self._helper is None:
            self._helper = start_helper(helper_image_name(Manifest(), self.config), ["sleep", "infinity"],
                                        {str(SIF_DIR): "/sif:ro", str(PROBES): "/bench:ro", str(self.out): "/out"})
            self._helper.exec_run(["chmod", "0666", "/dev/fuse"], user="root")  # as tests/sif/conftest.py does
        code, output = self._helper.exec_run(["bash", "-c", command], user="tfhpc", demux=True)
        text = _decode(output)
        if code != 0:
            raise RuntimeError(f"`{command[:200]}` in the apptainer helper exited {code}: {text[-1500:]}")
        return text

    def sif(self) -> str:
        """The app SIF's path in the helper; RuntimeError (the figures' reason) when it is not built."""
        from ..sif import sif_path
        sif = sif_path(self.config, self.config.layers.leaf)
        if not sif.is_file():
            raise RuntimeError(f"{sif.relative_to(REPO_ROOT)} is missing: run `make sif`")
        return f"/sif/{sif.name}"

    def close(self) -> None:
        if self._helper is not None:
            self._helper.remove(force=True)
            self._helper = None

    def add(self, figure: Figure) -> Figure:
        if figure.id in self.figures:
            raise ValueError(f"figure {figure.id} reported twice")
        self.figures[figure.id] = figure
        return figure

    def note_environment(self, moment: str) -> None:
        """Load average and the other containers running: what else competed for the 2 cores."""
        self.environment.append({"moment": moment, "time": _now(), **idle.machine_state()})


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _decode(output) -> str:
    if isinstance(output, tuple):  # exec_run(demux=True)
        return "".join((part or b"").decode(errors="replace") for part in output)
    return (output or b"").decode(errors="replace")


class AppContainer:
    """The app image, kept running (sleep) for the whole benchmark; commands run in it with `docker exec` as the
    image's user. The probes are mounted read-only at /bench, an output directory at /out."""

    def __init__(self, image: str, out: Path):
        from ..dockerhost import client
        self.out = out
        self.container = client().containers.run(
            image, ["sleep", "infinity"], entrypoint=[], detach=True, name=f"tfhpc-bench-app-{os.getpid()}",
            cap_add=["SYS_PTRACE"],  # strace in the container
            volumes={str(PROBES): {"bind": "/bench", "mode": "ro"}, str(out): {"bind": "/out", "mode": "rw"}})

    def run(self, command: str, env: dict | None = None, check: bool = True) -> str:
        code, output = self.container.exec_run(["bash", "-c", command], environment=env or {}, demux=True)
        text = _decode(output)
        if check and code != 0:
            raise RuntimeError(f"`{command}` in the container exited {code}: {text[-1500:]}")
        return text

    def remove(self) -> None:
        self.container.remove(force=True)


def host_run(command: list[str] | str, env: dict | None = None, timeout: float = 1800, check: bool = True) -> str:
    result = subprocess.run(command, shell=isinstance(command, str), capture_output=True, text=True,
                            env={**os.environ, **(env or {})}, timeout=timeout, executable="/bin/bash"
                            if isinstance(command, str) else None)
    text = result.stdout + result.stderr
    if check and result.returncode != 0:
        raise RuntimeError(f"`{command}` exited {result.returncode}: {text[-1500:]}")
    return text


# The host launcher's option that writes each rank's output to its own files, and where rank <n>'s stdout lands
# ("{stream}" is stdout or stderr): Open MPI's --output-filename, MPICH's hydra -outfile-pattern/-errfile-pattern.
RANK_OUTPUT = {
    "openmpi": ("--output-filename {dir}", "1/rank.{rank}/{stream}"),
    "mpich": ("-outfile-pattern {dir}/rank.%r.stdout -errfile-pattern {dir}/rank.%r.stderr", "rank.{rank}.{stream}"),
}


def host_mpirun(mpi: str, ranks: int, command: str, env: dict) -> str:
    """The host's mpirun with each rank's output in its own files, returned rank by rank: through mpirun's merged
    stdout two ranks' long RESULT lines arrived interleaved mid-line now and then. A failed run raises with the
    ranks' output (hydra writes it to the files only)."""
    option, _layout = RANK_OUTPUT[mpi]
    with tempfile.TemporaryDirectory(prefix="tfhpc-bench-ranks-") as directory:
        try:
            host_run(f"mpirun {option.format(dir=directory)} -np {ranks} {command}", env)
        except RuntimeError as error:
            output = rank_outputs(Path(directory), ranks, mpi, partial=True)
            raise RuntimeError(f"{error}\nthe ranks' output: {output[-1500:]}") from None
        return rank_outputs(Path(directory), ranks, mpi)


def rank_outputs(directory: Path, ranks: int, mpi: str, partial: bool = False) -> str:
    """Every rank's stdout then its stderr, in rank order, from the files RANK_OUTPUT[mpi] names under `directory`;
    a rank without its stdout file raises (unless `partial`: after a failed run)."""
    layout = RANK_OUTPUT[mpi][1]
    parts = []
    for rank in range(ranks):
        files = [directory / layout.format(rank=rank, stream=stream) for stream in ("stdout", "stderr")]
        if not files[0].is_file() and not partial:
            raise RuntimeError(f"mpirun left no {files[0]} (its per-rank output)")
        parts += [f.read_text(errors="replace") for f in files if f.is_file()]
    return "\n".join(parts)


def _attempt(ctx: Context, ids: list[tuple[str, str, str, str]], work) -> None:
    """Run `work()`; if it fails, every figure it should have produced is reported not measured, with the error."""
    try:
        work()
    except Exception as error:  # noqa: BLE001 -- one failed section must not lose the others' figures
        reason = f"{type(error).__name__}: {str(error).strip().splitlines()[-1][:300] if str(error).strip() else ''}"
        log(f"bench: {reason}")
        for id, section, label, unit in ids:
            if id not in ctx.figures:
                ctx.add(unmeasured(id, section, label, unit, reason))


# ---------------------------------------------------------------------------------------------------------------- #
# 1. Allreduce bus bandwidth

ALLREDUCE_RUNS = {  # name -> (label, launcher, implementation, extra environment, where: container | sif)
    "memcpy": ("single-core memcpy (the limit)", "", "memcpy", {}, "container"),
    "mpi4py": ("mpi4py Allreduce", "mpirun -np 2", "mpi4py", {}, "container"),
    "horovod_mpi": ("Horovod over MPI, defaults", "mpirun -np 2", "horovod", {}, "container"),
    "horovod_gloo": ("Horovod over Gloo, defaults", "horovodrun -np 2 --gloo", "horovod", {}, "container"),
    "horovod_mpi_tuned": ("Horovod over MPI, tuned", "mpirun -np 2", "horovod", TUNED_HOROVOD, "container"),
    "horovod_mpi_glibc": ("Horovod over MPI, glibc malloc", "mpirun -np 2", "horovod", {"LD_PRELOAD": ""},
                          "container"),
    "mpi4py_sif": ("mpi4py Allreduce in the SIF", "mpirun -np 2", "mpi4py", {}, "sif"),
    "horovod_mpi_sif": ("Horovod over MPI in the SIF, defaults", "mpirun -np 2", "horovod", {}, "sif"),
}
# Ratio figures: Horovod run -> the mpi4py run it is compared with (same place, same round)
HOROVOD_BASELINE = {"horovod_mpi": "mpi4py", "horovod_gloo": "mpi4py", "horovod_mpi_tuned": "mpi4py",
                    "horovod_mpi_sif": "mpi4py_sif"}
# Further ratios of two runs of the same round: id -> (run, baseline, label)
PAIR_RATIOS = {"tcmalloc_glibc": ("horovod_mpi", "horovod_mpi_glibc",
                                  "Horovod over MPI busbw, the image's tcmalloc / glibc malloc")}
MEMCPY_RATIOS = ("mpi4py", "mpi4py_sif", "horovod_mpi_sif")  # busbw / one core's memcpy bandwidth
LATENCY_RUNS = ("mpi4py", "horovod_mpi", "horovod_mpi_tuned", "mpi4py_sif", "horovod_mpi_sif")  # smallest size


def allreduce_figure_ids(plan: Plan) -> list[tuple[str, str, str, str]]:
    ids = []
    for size in plan.sizes:
        for name, (label, *_rest) in ALLREDUCE_RUNS.items():
            unit = "GB/s"
            what = "copy bandwidth" if name == "memcpy" else "busbw"
            ids.append((f"allreduce.{name}.{size}", "allreduce", f"{label}: {what}, {human_bytes(size)}", unit))
        for name, base in HOROVOD_BASELINE.items():
            ids.append((f"allreduce.ratio.{name}.{size}", "allreduce",
                        f"{ALLREDUCE_RUNS[name][0]} / {ALLREDUCE_RUNS[base][0]} busbw, {human_bytes(size)}", "ratio"))
        for id, (_run, _base, label) in PAIR_RATIOS.items():
            ids.append((f"allreduce.ratio.{id}.{size}", "allreduce", f"{label}, {human_bytes(size)}", "ratio"))
        for name in MEMCPY_RATIOS:
            ids.append((f"allreduce.ratio.{name}_memcpy.{size}", "allreduce",
                        f"{ALLREDUCE_RUNS[name][0]} busbw / memcpy bandwidth, {human_bytes(size)}", "ratio"))
    for name in LATENCY_RUNS:
        ids.append((f"allreduce.latency.{name}.{plan.sizes[0]}", "allreduce",
                    f"{ALLREDUCE_RUNS[name][0]}: time per operation, {human_bytes(plan.sizes[0])}", "ms"))
    for size in plan.fused_sizes:
        for name in ("horovod_mpi", "horovod_mpi_tuned"):
            ids.append((f"allreduce.fused16.{name}.{size}", "allreduce",
                        f"{ALLREDUCE_RUNS[name][0]}: busbw, 16 tensors of {human_bytes(size // 16)}", "GB/s"))
        ids.append((f"allreduce.ratio.fused16_tuned_default.{size}", "allreduce",
                    f"16 tensors of {human_bytes(size // 16)}: tuned / default Horovod busbw", "ratio"))
    return ids


def bench_allreduce(ctx: Context, app: AppContainer) -> None:
    plan = ctx.plan
    sizes = ",".join(map(str, plan.sizes))
    per_round: dict[str, list[dict]] = {name: [] for name in ALLREDUCE_RUNS}  # name -> per round {key: median s}
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in ALLREDUCE_RUNS}
    latency: dict[str, list[float]] = {name: [] for name in ALLREDUCE_RUNS}  # ms per operation, smallest size
    for round_ in range(plan.allreduce_rounds):
        for name, (label, launcher, impl, env, where) in ALLREDUCE_RUNS.items():
            fused = (f"--fused-sizes {','.join(map(str, plan.fused_sizes))}"
                     if "gloo" not in name and where == "container" else "")
            command = (f"{launcher} python3 /bench/allreduce.py --impl {impl} --sizes {sizes} {fused} "
                       f"--reps {plan.reps} --block-seconds {plan.block_seconds}").strip()
            log(f"bench: allreduce round {round_ + 1}/{plan.allreduce_rounds}: {name}")
            if where == "sif":  # the SIF's own mpirun (hybrid launch is tests/sites' subject), as a site user runs it
                output = ctx.in_sif_helper(" ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()),
                                                     f"apptainer exec -B /bench {ctx.sif()} {command}"]))
            else:
                output = app.run(command, env=env)
            report = one_per_rank(parse_results(output), 1)[0]  # rank 0: the slowest rank's times
            ranks = report["ranks"]
            ctx.raw.setdefault("allreduce", []).append({"round": round_, "run": name, **report})
            medians = {}
            for key, seconds in report["seconds_per_op"].items():
                size = int(key.rpartition(".")[2])
                # memcpy: bytes copied per second; the others: bus bandwidth
                values = [size / s if impl == "memcpy" else busbw(size, s, ranks) for s in seconds]
                samples[name].setdefault(key, []).extend(v / 1e9 for v in values)
                medians[key] = statistics.median(values) / 1e9
                if key == str(plan.sizes[0]):
                    latency[name].extend(s * 1e3 for s in seconds)
            per_round[name].append(medians)

    def add(id, label, unit, values, note=""):
        ctx.add(Figure(id, "allreduce", label, unit, samples=values, note=note))

    per_round_ratios = "median of per-round ratios"
    for size in plan.sizes:
        key = str(size)
        for name, (label, *_rest) in ALLREDUCE_RUNS.items():
            what = "copy bandwidth" if name == "memcpy" else "busbw"
            add(f"allreduce.{name}.{size}", f"{label}: {what}, {human_bytes(size)}", "GB/s", samples[name][key])
        for name, base in HOROVOD_BASELINE.items():
            add(f"allreduce.ratio.{name}.{size}",
                f"{ALLREDUCE_RUNS[name][0]} / {ALLREDUCE_RUNS[base][0]} busbw, {human_bytes(size)}", "ratio",
                ratios([r[key] for r in per_round[name]], [r[key] for r in per_round[base]]), per_round_ratios)
        for id, (run, base, label) in PAIR_RATIOS.items():
            add(f"allreduce.ratio.{id}.{size}", f"{label}, {human_bytes(size)}", "ratio",
                ratios([r[key] for r in per_round[run]], [r[key] for r in per_round[base]]), per_round_ratios)
        for name in MEMCPY_RATIOS:
            add(f"allreduce.ratio.{name}_memcpy.{size}",
                f"{ALLREDUCE_RUNS[name][0]} busbw / memcpy bandwidth, {human_bytes(size)}", "ratio",
                ratios([r[key] for r in per_round[name]], [r[key] for r in per_round["memcpy"]]), per_round_ratios)
    for name in LATENCY_RUNS:
        add(f"allreduce.latency.{name}.{plan.sizes[0]}",
            f"{ALLREDUCE_RUNS[name][0]}: time per operation, {human_bytes(plan.sizes[0])}", "ms", latency[name],
            "samples: every timed block's mean time per operation")
    for size in plan.fused_sizes:
        key = f"fused16.{size}"
        for name in ("horovod_mpi", "horovod_mpi_tuned"):
            add(f"allreduce.fused16.{name}.{size}",
                f"{ALLREDUCE_RUNS[name][0]}: busbw, 16 tensors of {human_bytes(size // 16)}", "GB/s", samples[name][key])
        add(f"allreduce.ratio.fused16_tuned_default.{size}",
            f"16 tensors of {human_bytes(size // 16)}: tuned / default Horovod busbw", "ratio",
            ratios([r[key] for r in per_round["horovod_mpi_tuned"]], [r[key] for r in per_round["horovod_mpi"]]),
            "median of per-round ratios")
    ctx.raw["allreduce_sweep"] = {name: {k: statistics.median(v) for k, v in by_size.items()}
                                  for name, by_size in samples.items()}


# ---------------------------------------------------------------------------------------------------------------- #
# 1b. Where Horovod's time goes: its timeline, per phase and message size

PHASE_SIZES = (1 << 10, 1 * MB, 64 * MB)
PHASES = {"negotiate": "negotiation (rank 0, first request to response)", "queue": "response to operation start",
          "mpi": "MPI_Allreduce", "copies": "fusion-buffer copies and scheduling",
          "outside": "between operations (TensorFlow op, output tensor, Python, the wait for the next cycle)"}
PHASE_VARIANTS = {"default": {}, "tuned": TUNED_HOROVOD}


def phase_figure_ids() -> list[tuple[str, str, str, str]]:
    return [(f"hvdphase.{variant}.{phase}.{size}", "hvdphase",
             f"Horovod {variant}, {human_bytes(size)}: {label}", "ms")
            for variant in PHASE_VARIANTS for size in PHASE_SIZES for phase, label in PHASES.items()]


def bench_horovod_phases(ctx: Context, app: AppContainer) -> None:
    """The allreduce probe under HOROVOD_TIMELINE (rank 0 writes it), blocks of ~0.5 s so that every size has
    operations back to back; each phase's median over the operations (stats.horovod_phases)."""
    ids = {id: (label, unit) for id, _s, label, unit in phase_figure_ids()}
    sizes = ",".join(map(str, PHASE_SIZES))
    for variant, env in PHASE_VARIANTS.items():
        timeline = ctx.out / f"timeline-{variant}.json"
        timeline.unlink(missing_ok=True)
        log(f"bench: Horovod timeline: {variant}")
        app.run(f"mpirun -np {RANKS} python3 /bench/allreduce.py --impl horovod --sizes {sizes} --reps 3 "
                f"--block-seconds 0.5", env={**env, "HOROVOD_TIMELINE": f"/out/{timeline.name}"})
        phases = horovod_phases(load_trace(timeline.read_text()))
        ctx.raw.setdefault("horovod_phases", {})[variant] = {str(k): v for k, v in phases.items()}
        for size in PHASE_SIZES:
            for phase in PHASES:
                id = f"hvdphase.{variant}.{phase}.{size}"
                value = phases.get(size, {}).get(phase)
                if value is None:
                    ctx.add(unmeasured(id, "hvdphase", *ids[id], "the timeline has no two operations of this "
                                                                   "size in a row"))
                else:
                    ctx.add(Figure(id, "hvdphase", *ids[id], samples=[value],
                                   note=f"median of {phases[size]['ops']} operations"))


# ---------------------------------------------------------------------------------------------------------------- #
# 1a. The MPI's allreduce algorithms in the SIF: which one the image's defaults should pick

# name -> environment that forces it; "default" is the MPI's own choice. Open MPI 4.1 coll_tuned's algorithm ids
# (ompi/mca/coll/tuned/coll_tuned_allreduce_decision.c); MPICH 4.0's MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM values
# (`mpivars`: auto, nb, smp, recursive_doubling, reduce_scatter_allgather; an unknown one aborts MPI_Init).
# tests/images/mpi/test_mpi.py checks both lists against the image's MPI.
COLL_ALGORITHMS = {
    "openmpi": {"default": {}, **{name: {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
                                         "OMPI_MCA_coll_tuned_allreduce_algorithm": str(number)}
                                  for number, name in enumerate(("basic_linear", "nonoverlapping",
                                                                 "recursive_doubling", "ring", "segmented_ring",
                                                                 "rabenseifner"), start=1)}},
    "mpich": {"default": {}, **{name: {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": name}
                                for name in ("recursive_doubling", "reduce_scatter_allgather", "nb")}},
}
COLL_SIZES = (1 << 10, 1 * MB, 64 * MB)


def coll_figure_ids(config: Config) -> list[tuple[str, str, str, str]]:
    ids = []
    for name in COLL_ALGORITHMS[config.mpi]:
        for size in COLL_SIZES:
            ids.append((f"coll.{name}.{size}", "coll", f"{config.mpi} allreduce {name}: busbw, {human_bytes(size)}",
                        "GB/s"))
            if name != "default":
                ids.append((f"coll.ratio.{name}.{size}", "coll",
                            f"{name} / default busbw, {human_bytes(size)}", "ratio"))
    return ids


def bench_coll(ctx: Context, app: AppContainer) -> None:
    """mpi4py allreduce in the SIF (single copy as a site user gets it) with each algorithm forced, round after
    round; every algorithm's busbw and its ratio to the MPI's own choice in the same round."""
    ids = {id: (label, unit) for id, _s, label, unit in coll_figure_ids(ctx.config)}
    if not ctx.plan.coll_rounds:
        for id in ids:
            ctx.add(unmeasured(id, "coll", *ids[id], "QUICK=1 skips the algorithm sweep; `make bench` runs it"))
        return
    algorithms = COLL_ALGORITHMS[ctx.config.mpi]
    sizes = ",".join(map(str, COLL_SIZES))
    busbws: dict[str, dict[int, list[float]]] = {name: {size: [] for size in COLL_SIZES} for name in algorithms}
    medians: dict[str, dict[int, list[float]]] = {name: {size: [] for size in COLL_SIZES} for name in algorithms}
    for round_ in range(ctx.plan.coll_rounds):
        for name, env in algorithms.items():
            log(f"bench: allreduce algorithms round {round_ + 1}/{ctx.plan.coll_rounds}: {name}")
            prefix = " ".join(f"{k}={v}" for k, v in env.items())
            report = one_per_rank(parse_results(ctx.in_sif_helper(
                f"{prefix} apptainer exec -B /bench {ctx.sif()} mpirun -np {RANKS} python3 /bench/allreduce.py "
                f"--impl mpi4py --sizes {sizes} --reps {ctx.plan.reps} --block-seconds {ctx.plan.block_seconds}")),
                1)[0]
            ctx.raw.setdefault("coll", []).append({"round": round_, "algorithm": name, **report})
            for size in COLL_SIZES:
                values = [busbw(size, s, report["ranks"]) / 1e9 for s in report["seconds_per_op"][str(size)]]
                busbws[name][size].extend(values)
                medians[name][size].append(statistics.median(values))
    for name in algorithms:
        for size in COLL_SIZES:
            ctx.add(Figure(f"coll.{name}.{size}", "coll", *ids[f"coll.{name}.{size}"], samples=busbws[name][size]))
            if name != "default":
                ctx.add(Figure(f"coll.ratio.{name}.{size}", "coll", *ids[f"coll.ratio.{name}.{size}"],
                               samples=ratios(medians[name][size], medians["default"][size]),
                               note="median of per-round ratios"))


# ---------------------------------------------------------------------------------------------------------------- #
# 1b. Host MPI (bind model): the MPICH image's mpi4py on a host MPICH against the image's own MPICH

HOST_MPI = "mpich"   # versions.toml [site_mpi]: PyPI's MPICH 5, launched by its own hydra mpiexec
HOST_MPI_SIZE = 64 * MB


def host_mpi_figure_ids() -> list[tuple[str, str, str, str]]:
    size = human_bytes(HOST_MPI_SIZE)
    return [(f"hostmpi.image.{HOST_MPI_SIZE}", "hostmpi", f"mpi4py busbw, the MPICH image's MPICH, {size}", "GB/s"),
            (f"hostmpi.host.{HOST_MPI_SIZE}", "hostmpi", f"mpi4py busbw, host MPICH (TFHPC_HOST_MPI), {size}", "GB/s"),
            (f"hostmpi.ratio.{HOST_MPI_SIZE}", "hostmpi", f"host MPICH / image MPICH busbw, {size}", "ratio")]


def bench_host_mpi(ctx: Context, app: AppContainer) -> None:
    """Both runs in one container of the MPICH app image (Docker's default seccomp for both), round after round."""
    from .. import sitempi
    from ..dockerhost import client
    import docker.errors
    manifest = Manifest()
    mpich = manifest.config(ctx.config.stack, ctx.config.flavor, "mpich")
    image = mpich.image(mpich.layers.leaf)
    try:
        client().images.get(image)
    except docker.errors.ImageNotFound:
        raise RuntimeError(f"{image} is not built: run `make site-images`") from None
    prefix = sitempi.in_containers(sitempi.install(manifest, HOST_MPI))
    container = client().containers.run(
        image, ["sleep", "infinity"], entrypoint=[], detach=True, name=f"tfhpc-bench-hostmpi-{os.getpid()}",
        volumes={str(PROBES): {"bind": "/bench", "mode": "ro"},
                 str(sitempi.SITE_MPI_DIR): {"bind": sitempi.MOUNT, "mode": "ro"}})
    probe = (f"python3 /bench/allreduce.py --impl mpi4py --sizes {HOST_MPI_SIZE} --reps {ctx.plan.reps} "
             f"--block-seconds {ctx.plan.block_seconds}")
    runs = {"image": (f"mpiexec -n {RANKS} {probe}", {}),
            "host": (f"{prefix}/bin/mpiexec -n {RANKS} tfhpc-entrypoint {probe}", {"TFHPC_HOST_MPI": prefix})}
    samples: dict[str, list[float]] = {name: [] for name in runs}
    per_round: dict[str, list[float]] = {name: [] for name in runs}
    try:
        for round_ in range(ctx.plan.allreduce_rounds):
            for name, (command, env) in runs.items():
                log(f"bench: host MPI round {round_ + 1}/{ctx.plan.allreduce_rounds}: {name}")
                code, output = container.exec_run(["bash", "-c", command], environment=env, demux=True)
                text = _decode(output)
                if code != 0:
                    raise RuntimeError(f"`{command}` exited {code}: {text[-1500:]}")
                report = one_per_rank(parse_results(text), 1)[0]
                ctx.raw.setdefault("host_mpi", []).append({"round": round_, "run": name, **report})
                seconds = report["seconds_per_op"][str(HOST_MPI_SIZE)]
                values = [busbw(HOST_MPI_SIZE, s, report["ranks"]) / 1e9 for s in seconds]
                samples[name].extend(values)
                per_round[name].append(statistics.median(values))
    finally:
        container.remove(force=True)
    (image_id, _, image_label, unit), (host_id, _, host_label, _), (ratio_id, _, ratio_label, _) = host_mpi_figure_ids()
    note = f"{HOST_MPI} {sitempi.version(manifest, HOST_MPI)} from PyPI; image {image}; {RANKS} ranks, one container"
    ctx.add(Figure(image_id, "hostmpi", image_label, unit, samples=samples["image"], note=note))
    ctx.add(Figure(host_id, "hostmpi", host_label, unit, samples=samples["host"], note=note))
    ctx.add(Figure(ratio_id, "hostmpi", ratio_label, "ratio", samples=ratios(per_round["host"], per_round["image"]),
                   note="median of per-round ratios"))


# ---------------------------------------------------------------------------------------------------------------- #
# 2. Training throughput

TRAIN_IDS = [
    ("train.container.hvd1", "train", "container, Horovod, 1 worker: images/s", "img/s"),
    ("train.container.hvd2", "train", "container, Horovod, 2 workers: images/s (total)", "img/s"),
    ("train.container.mwms2", "train", "container, MWMS, 2 workers: images/s (total)", "img/s"),
    ("train.host.hvd1", "train", "host venv, Horovod, 1 worker: images/s", "img/s"),
    ("train.host.hvd2", "train", "host venv, Horovod, 2 workers: images/s (total)", "img/s"),
    ("train.ratio.container_host.hvd1", "train", "container / host venv, Horovod, 1 worker", "ratio"),
    ("train.ratio.container_host.hvd2", "train", "container / host venv, Horovod, 2 workers", "ratio"),
    ("train.efficiency.container.hvd", "train", "2-worker efficiency X2 / 2X1, container, Horovod", "ratio"),
    ("train.efficiency.host.hvd", "train", "2-worker efficiency X2 / 2X1, host venv, Horovod", "ratio"),
    ("train.ratio.hvd_mwms", "train", "Horovod / MWMS images/s, 2 workers, container", "ratio"),
    # Horovod's other controller, side by side: how much of the 2-worker cost is MPI's (docs/benchmarks.md).
    ("train.container.hvd2_gloo", "train", "container, Horovod over Gloo, 2 workers: images/s (total)", "img/s"),
    ("train.efficiency.container.hvd_gloo", "train", "2-worker efficiency X2 / 2X1, container, Horovod over Gloo",
     "ratio"),
    # Weak scaling as it claims to be: every worker bound to its own core, one inter-op thread, so that the single
    # worker cannot borrow the idle second core for TensorFlow's inter-op pool, Horovod's thread or the input pipeline.
    ("train.container.hvd1_pinned", "train", "container, Horovod, 1 worker bound to 1 core: images/s", "img/s"),
    ("train.container.hvd2_pinned", "train", "container, Horovod, 2 workers bound to 1 core each: images/s (total)",
     "img/s"),
    ("train.efficiency.container.hvd_pinned", "train", "2-worker efficiency X2 / 2X1, each worker bound to one core",
     "ratio"),
    ("train.container.hvd2_glibc", "train", "container, Horovod, 2 workers, glibc malloc: images/s (total)", "img/s"),
    ("train.ratio.tcmalloc_glibc.hvd2", "train", "images/s with the image's tcmalloc / glibc malloc, 2 workers",
     "ratio"),
]
PINNED = "mpirun --bind-to core --map-by core --report-bindings"  # Open MPI; MPICH's hydra: -bind-to core
PINNED_ENV = {"TF_NUM_INTEROP_THREADS": "1"}  # read by TensorFlow's runtime at start (process_util.cc)


def bench_training(ctx: Context, app: AppContainer) -> None:
    plan = ctx.plan
    # One intra-op thread per worker in every run: 1 worker then has what each of 2 workers has (one of the 2
    # cores), so X2 / 2X1 measures what distribution costs, not the split of the cores.
    args = " ".join([*plan.train_args, "--intra-threads", "1"])
    venv_ready = hostvenv.ready(ctx.config)
    host_reason = "" if venv_ready else (
        "the host venv build/bench/host-venv is not exported (a full `make bench` exports the image's venv): "
        + ("; ".join(hostvenv.host_problems(ctx.config)) or "not built yet"))
    host_env = {"TF_USE_LEGACY_KERAS": ctx.config.build_args()["TF_USE_LEGACY_KERAS"], "TF_CPP_MIN_LOG_LEVEL": "1",
                "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "PATH": f"{hostvenv.HOST_VENV / 'bin'}:{os.environ.get('PATH', '')}",
                # the scripts' package, which the image's app layer installs (the venv is the horovod layer's)
                "PYTHONPATH": str(REPO_ROOT / "scripts" / "runtime")}
    script = REPO_ROOT / "scripts" / "train" / "synthetic_benchmark.py"
    pinned = PINNED if ctx.config.mpi == "openmpi" else "mpirun -bind-to core"
    runs = {
        "container.hvd1": lambda: app.run(f"mpirun -np 1 tfhpc-benchmark-hvd {args}"),
        "container.hvd2": lambda: app.run(f"mpirun -np 2 tfhpc-benchmark-hvd {args}"),
        "host.hvd1": lambda: host_mpirun(ctx.config.mpi, 1, f"python {script} --mode horovod {args}", host_env),
        "host.hvd2": lambda: host_mpirun(ctx.config.mpi, 2, f"python {script} --mode horovod {args}", host_env),
        "container.mwms2": lambda: app.run(f"tfhpc-launch-local-mwms -n 2 -- tfhpc-benchmark-mwms {args}"),
        "container.hvd2_gloo": lambda: app.run(f"horovodrun -np 2 --gloo tfhpc-benchmark-hvd {args}"),
        "container.hvd2_glibc": lambda: app.run(f"mpirun -np 2 tfhpc-benchmark-hvd {args}", env={"LD_PRELOAD": ""}),
        "container.hvd1_pinned": lambda: app.run(f"{pinned} -np 1 tfhpc-benchmark-hvd {args}", env=PINNED_ENV),
        "container.hvd2_pinned": lambda: app.run(f"{pinned} -np 2 tfhpc-benchmark-hvd {args}", env=PINNED_ENV),
    }
    workers_of = {name: 1 if "hvd1" in name else 2 for name in runs}
    totals: dict[str, list[float]] = {name: [] for name in runs}
    iteration_totals: dict[str, list[float]] = {name: [] for name in runs}
    failed: dict[str, str] = {} if venv_ready else {"host.hvd1": host_reason, "host.hvd2": host_reason}
    for round_ in range(plan.train_rounds):
        for name, run in runs.items():
            if name in failed:
                continue
            log(f"bench: training round {round_ + 1}/{plan.train_rounds}: {name}")
            try:
                report = one_per_rank(parse_results(run()), workers_of[name])[0]
                if report["failures"]:
                    raise RuntimeError(f"the benchmark reported failures {report['failures']}")
            except Exception as error:  # noqa: BLE001 -- the other runs' figures still count
                failed[name] = f"{name}: {type(error).__name__}: {str(error)[-300:]}"
                continue
            ctx.raw.setdefault("training", []).append({"round": round_, "run": name, **report})
            totals[name].append(report["images_per_second_total"]["mean"])
            iteration_totals[name].extend(map(float, [sum(col) for col in zip(*report["rates"])]))
    labels = {id: (label, unit) for id, _s, label, unit in TRAIN_IDS}

    def add(id, needs, samples, note):
        reasons = [failed[n] for n in needs if n in failed]
        if reasons:
            ctx.add(unmeasured(id, "train", *labels[id], "; ".join(dict.fromkeys(reasons))))
        else:
            ctx.add(Figure(id, "train", *labels[id], samples=samples(), note=note))

    for name in runs:
        add(f"train.{name}", [name], lambda name=name: iteration_totals[name],
            "samples: total images/s of each timed iteration, all rounds")
    per_round = "median of per-round ratios (the two runs back to back)"
    for workers in (1, 2):
        a, b = f"container.hvd{workers}", f"host.hvd{workers}"
        add(f"train.ratio.container_host.hvd{workers}", [a, b], lambda a=a, b=b: ratios(totals[a], totals[b]),
            per_round)
    for where in ("container", "host"):
        a, b = f"{where}.hvd2", f"{where}.hvd1"
        add(f"train.efficiency.{where}.hvd", [a, b],
            lambda a=a, b=b: [efficiency(x2, x1, 2) for x2, x1 in zip(totals[a], totals[b])],
            "median of per-round efficiencies (X1 and X2 run back to back)")
    add("train.ratio.hvd_mwms", ["container.hvd2", "container.mwms2"],
        lambda: ratios(totals["container.hvd2"], totals["container.mwms2"]), per_round)
    add("train.ratio.tcmalloc_glibc.hvd2", ["container.hvd2", "container.hvd2_glibc"],
        lambda: ratios(totals["container.hvd2"], totals["container.hvd2_glibc"]), per_round)
    add("train.efficiency.container.hvd_pinned", ["container.hvd2_pinned", "container.hvd1_pinned"],
        lambda: [efficiency(x2, x1, 2) for x2, x1 in zip(totals["container.hvd2_pinned"],
                                                          totals["container.hvd1_pinned"])],
        "median of per-round efficiencies (X1 and X2 run back to back)")
    add("train.efficiency.container.hvd_gloo", ["container.hvd2_gloo", "container.hvd1"],
        lambda: [efficiency(x2, x1, 2) for x2, x1 in zip(totals["container.hvd2_gloo"], totals["container.hvd1"])],
        "median of per-round efficiencies (X1 and X2 run back to back)")


# ---------------------------------------------------------------------------------------------------------------- #
# 3. Start-up

STARTUP_MODES = {  # name -> label
    "sif": "SIF (apptainer exec, squashfuse)",
    "sif_gzip": "the same files as a gzip SIF",
    "sif_lz4": "the same files as an lz4 SIF",
    "sif_zstd": "the same files as a zstd SIF",
    "sif_instance": "SIF, every process in one apptainer instance (one squashfuse mount)",
    "sandbox": "sandbox directory of the same SIF (apptainer exec)",
    "docker": "Docker container (overlayfs)",
    "venv": "host venv (plain python)",
}
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
    (bundle / "run").write_text('#!/bin/sh\nd=$(dirname "$0")\nexec "$d/ld.so" --library-path "$d/lib" '
                                '"$d/strace" "$@"\n')
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
        from ..sif import squashfs_compression
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


# ---------------------------------------------------------------------------------------------------------------- #
# 4. Footprint and build

def footprint_ids(config: Config) -> list[tuple[str, str, str, str]]:
    ids = [(f"size.{layer}", "footprint", f"image tfhpc-{layer} (with its parents)", "MB")
           for layer in config.layers.names]
    ids += [("size.sif", "footprint", "SIF file", "MB"), ("size.host_venv", "footprint", "host venv directory", "MB"),
            ("inodes.image", "footprint", "files and directories in the app image", "inodes"),
            ("size.ratio.ngc", "footprint", "app image / the NVIDIA NGC TensorFlow image it replaces", "ratio"),
            ("inodes.host_venv", "footprint", "files and directories in the host venv", "inodes"),
            ("inodes.sif", "footprint", "files the SIF puts on the shared file system", "inodes"),
            ("build.cold", "build", "cold build of the whole stack (recorded)", "s"),
            ("build.warm", "build", "warm build of the whole stack (recorded)", "s"),
            ("build.app_warm", "build", "app layer build, nothing changed (cache hit)", "s"),
            ("build.rebuild_one_script", "build", "app layer rebuild after touching one script", "s"),
            ("build.sif_conversion", "build", "SIF conversion (make sif, recorded)", "s")]
    return ids


def recorded_builds(path: Path, tag: str) -> list[dict]:
    """build-times.jsonl entries of one configuration whose every layer was built (a full `make image`)."""
    entries = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("config") == tag and "total" in entry.get("seconds", {}):
            entries.append(entry)
    return entries


def cold_and_warm(entries: list[dict]) -> tuple[dict | None, dict | None]:
    """The slowest recorded build is the coldest the cache has seen, the fastest the warmest; the two are told
    apart only when there are at least two records."""
    if len(entries) < 2:
        return (entries[0] if entries else None), None
    ordered = sorted(entries, key=lambda e: e["seconds"]["total"])
    return ordered[-1], ordered[0]


def context_paths(dockerignore: Path) -> list[str]:
    """The directories a .dockerignore that excludes everything ("*") lets back in with "!path/" lines."""
    return [line[1:].strip().rstrip("/") for line in dockerignore.read_text().splitlines()
            if line.startswith("!") and line.strip().endswith("/")]


def _time_app_build(ctx: Context, context_dir: Path, tag: str) -> float:
    """`docker build` of the leaf layer as `make image` runs it (same build arguments and secrets; see
    tfhpc/build.py's build_layer, which always builds from the repository itself), from `context_dir`."""
    from ..dockerhost import build_cli
    leaf = ctx.config.layers.leaf
    parent = ctx.config.image(ctx.config.layers.get(leaf).parent)
    args = ["--progress=plain", "--file", str(context_dir / "containers" / leaf / "Dockerfile"),
            "--build-arg", f"BASE_IMAGE={parent}", "--tag", tag]
    for key, value in ctx.config.build_args().items():
        args += ["--build-arg", f"{key}={value}"]
    bundle = resolve_ca_bundle(default_ca_bundle())
    if bundle:
        args += ["--secret", f"id=ca_bundle,src={bundle}"]
    logfile = ctx.out / "rebuild.log"
    started = time.monotonic()
    cli = build_cli()
    with logfile.open("a") as handle:
        status = subprocess.call([*cli.argv, *args, str(context_dir)], env={**os.environ, **cli.env}, stdout=handle,
                                 stderr=handle)
    seconds = time.monotonic() - started
    if status != 0:
        raise RuntimeError(f"app layer build failed (exit {status}, see {logfile})")
    return seconds


def ngc_ratio(ctx: Context, app_bytes: int, measured, not_measured) -> None:
    """The GPU flavour's size goal: its app image against NVIDIA's NGC TensorFlow image. NGC_IMAGE names a locally
    pulled NGC image to measure; otherwise the published figure in versions.toml's [bench.ngc_reference]."""
    from ..dockerhost import client
    if ctx.config.flavor != "gpu":
        not_measured(f"the {ctx.config.flavor} flavour replaces no NGC image (the goal is the GPU flavour's: "
                     "`make bench FLAVOR=gpu`)")
        return
    local = os.environ.get("NGC_IMAGE")
    if local:
        ngc_bytes = client().images.get(local).attrs["Size"]  # checked before the bench started
        source = f"docker image inspect {local} (measured here)"
    else:
        reference = Manifest().data.get("bench", {}).get("ngc_reference")
        if not reference:
            not_measured("no NGC_IMAGE pulled locally and no [bench.ngc_reference] in versions.toml")
            return
        local, ngc_bytes, source = reference["image"], reference["bytes"], reference["source"]
    measured(app_bytes / ngc_bytes, f"{app_bytes / 1e9:.2f} GB vs {local} {ngc_bytes / 1e9:.1f} GB", source)


def bench_footprint(ctx: Context, app: AppContainer) -> None:
    from ..dockerhost import client
    from ..provenance import IMAGES_JSON
    from ..sif import sif_path
    engine = client()
    ids = {id: (label, unit) for id, _s, label, unit in footprint_ids(ctx.config)}

    def add(id, value, note="", source=""):
        ctx.add(Figure(id, ctx_section(id), *ids[id], samples=[value], note=note, source=source))

    def ctx_section(id):
        return "build" if id.startswith("build.") else "footprint"

    parent_size = 0
    for layer in ctx.config.layers.names:
        size = engine.images.get(ctx.config.image(layer)).attrs["Size"]
        add(f"size.{layer}", size / 1e6, note=f"this layer adds {(size - parent_size) / 1e6:.0f} MB")
        parent_size = size
    sif = sif_path(ctx.config, ctx.config.layers.leaf)
    if sif.is_file():
        add("size.sif", sif.stat().st_size / 1e6, note="squashfs-compressed")
        add("inodes.sif", 1, note="one file: the image's inodes live inside it")
    else:
        for id in ("size.sif", "inodes.sif"):
            ctx.add(unmeasured(id, "footprint", *ids[id], f"{sif.relative_to(REPO_ROOT)} is missing: run `make sif`"))
    ngc_ratio(ctx, parent_size, lambda value, note, source: add("size.ratio.ngc", value, note, source),
              lambda reason: ctx.add(unmeasured("size.ratio.ngc", "footprint", *ids["size.ratio.ngc"], reason)))
    count = int(app.run("find / -xdev 2>/dev/null | wc -l", check=False).strip().splitlines()[-1])
    add("inodes.image", count, note="find / -xdev in the running app container")
    if hostvenv.ready(ctx.config):
        total = inodes = 0
        for path in hostvenv.HOST_VENV.rglob("*"):
            inodes += 1
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        add("size.host_venv", total / 1e6, note="sum of file sizes (TensorFlow not stripped, headers kept)")
        add("inodes.host_venv", inodes + 1)
    else:
        for id in ("size.host_venv", "inodes.host_venv"):
            ctx.add(unmeasured(id, "footprint", *ids[id], "the host venv is not built"))

    cold, warm = cold_and_warm(recorded_builds(BUILD_TIMES, ctx.config.tag))
    for id, entry in (("build.cold", cold), ("build.warm", warm)):
        if entry is None:
            ctx.add(unmeasured(id, "build", *ids[id], "build/bench/build-times.jsonl has "
                               + ("no record" if id == "build.cold" else "a single record")
                               + f" of {ctx.config.tag}: cold and warm cannot be told apart"))
        else:
            layers = ", ".join(f"{k} {v}" for k, v in entry["seconds"].items() if k != "total")
            add(id, entry["seconds"]["total"], note=f"per layer (s): {layers}",
                source=f"build/bench/build-times.jsonl, `make image` of {entry['when']}")
    try:
        record = json.loads(IMAGES_JSON.read_text())["images"][f"sif:{sif.name}"]
        add("build.sif_conversion", record["conversion_seconds"],
            source=f"build/images.json, make sif of image {record['image_id'][:19]}")
    except (FileNotFoundError, KeyError, ValueError) as error:
        ctx.add(unmeasured("build.sif_conversion", "build", *ids["build.sif_conversion"],
                           f"no SIF conversion recorded in build/images.json ({type(error).__name__})"))

    # The app layer, rebuilt from a copy of its build context (so that the working tree and the tagged images stay
    # as they are): first as it is (a warm build: every step cached), then after touching one script.
    tag = f"tfhpc-bench-rebuild:{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="tfhpc-bench-context-") as tmp:
        context_dir = Path(tmp)
        # What .dockerignore lets into the build context (its "!path/" lines).
        for part in context_paths(REPO_ROOT / ".dockerignore"):
            if (REPO_ROOT / part).is_dir():
                shutil.copytree(REPO_ROOT / part, context_dir / part, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(REPO_ROOT / ".dockerignore", context_dir / ".dockerignore")
        try:
            _time_app_build(ctx, context_dir, tag)  # fills the cache for this exact context
            add("build.app_warm", _time_app_build(ctx, context_dir, tag), note="second build of the same context")
            with (context_dir / "scripts" / "info.py").open("a") as handle:
                handle.write(f"# touched by make bench at {_now()}\n")
            add("build.rebuild_one_script", _time_app_build(ctx, context_dir, tag),
                note="scripts/info.py changed: COPY scripts/ and the layers after it rebuild")
        finally:
            try:
                engine.images.remove(tag)
            except Exception:  # noqa: BLE001 -- nothing to remove when the build failed
                pass


# ---------------------------------------------------------------------------------------------------------------- #

GOALS = [
    Goal("container_vs_host", "train.ratio.container_host.hvd2", 0.99, "container / host throughput >= 0.99"),
    Goal("horovod_vs_mpi4py_64MB", f"allreduce.ratio.horovod_mpi.{64 * MB}", 0.9,
         "Horovod-over-MPI busbw >= 0.9 x mpi4py at 64 MB"),
    Goal("host_mpich_vs_image_64MB", f"hostmpi.ratio.{HOST_MPI_SIZE}", 0.9,
         "host MPICH (bind model) busbw >= 0.9 x the image's MPICH at 64 MB"),
    Goal("two_worker_efficiency", "train.efficiency.container.hvd", 0.9, "2-worker efficiency >= 0.9"),
    Goal("two_worker_efficiency_pinned", "train.efficiency.container.hvd_pinned", 0.9,
         "2-worker efficiency, every worker bound to one core >= 0.9"),
    Goal("sif_import_faster_8", "startup.ratio.venv_sif.8", 1.0,
         "import from the SIF faster than from the venv at 8 processes (venv / SIF >= 1)"),
    Goal("sif_import_vs_docker_8", "startup.ratio.sif_docker.8", 1.2,
         "import from the SIF at 8 processes <= 1.2 x Docker's", at_most=True),
    Goal("sif_mpi4py_memcpy_64MB", f"allreduce.ratio.mpi4py_sif_memcpy.{64 * MB}", 0.25,
         "mpi4py busbw in the SIF >= 0.25 x one core's memcpy at 64 MB"),
    Goal("sif_horovod_memcpy_64MB", f"allreduce.ratio.horovod_mpi_sif_memcpy.{64 * MB}", 0.25,
         "Horovod-over-MPI busbw in the SIF >= 0.25 x one core's memcpy at 64 MB"),
    Goal("sif_horovod_vs_mpi4py_64MB", f"allreduce.ratio.horovod_mpi_sif.{64 * MB}", 0.9,
         "Horovod-over-MPI busbw >= 0.9 x mpi4py in the SIF at 64 MB"),
    Goal("horovod_latency_1KB", "allreduce.latency.horovod_mpi.1024", 0.2,
         "Horovod time per 1 KB allreduce <= 0.2 ms", at_most=True),
    Goal("rebuild_one_script", "build.rebuild_one_script", 30.0, "rebuild after one script <= 30 s", at_most=True),
    Goal("gpu_image_half_of_ngc", "size.ratio.ngc", 0.5, "GPU app image <= half of the NGC TensorFlow image",
         at_most=True),
]


def expected_ids(plan: Plan, config: Config) -> list[tuple[str, str, str, str]]:
    """Every figure a run of `plan` reports, measured or not."""
    return [*allreduce_figure_ids(plan), *phase_figure_ids(), *coll_figure_ids(config), *host_mpi_figure_ids(),
            *TRAIN_IDS,
            *startup_figure_ids(plan),
            *footprint_ids(config)]


def run_bench(config: Config, quick: bool, build_host_venv: bool | None = None, insist: bool = False,
              max_wait: float = 600) -> Path:
    from ..dockerhost import client
    from .report import write_outputs
    import docker.errors
    started_at, started = _now(), time.monotonic()
    plan = Plan.make(quick)
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
                    ("host MPI", bench_host_mpi, host_mpi_figure_ids()),
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
        "app_image_id": client().images.get(ctx.app_image).id, "started": started_at, "finished": _now(),
        "duration_seconds": round(time.monotonic() - started, 1), "cpus": os.cpu_count(),
        "plan": {k: v for k, v in plan.__dict__.items()}, "tuned_horovod": TUNED_HOROVOD,
        "idle_check": idle_check, "environment": ctx.environment,
        "figures": [figure.to_json() for figure in ctx.figures.values()],
        "goals": [goal.judge(ctx.figures.get(goal.figure)) for goal in GOALS],
        "raw": ctx.raw,
    }
    return write_outputs(results, out_dir)
