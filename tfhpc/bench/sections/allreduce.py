"""Allreduce bus bandwidth: mpi4py and Horovod (MPI, Gloo, tuned, glibc malloc) in the container and the SIF
against one core's memcpy, over the plan's sizes, round after round; latency at the smallest size; 16 fused tensors."""
from __future__ import annotations

import shlex
import statistics

from ...common import log
from ..context import TUNED_HOROVOD, AppContainer, Context, Plan
from ..stats import Figure, busbw, human_bytes, one_per_rank, parse_results, ratios

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
