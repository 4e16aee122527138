"""The MPI's allreduce algorithms in the SIF: which one the image's defaults should pick."""
from __future__ import annotations

import statistics

from ...common import log
from ...manifest import Config
from ..context import MB, RANKS, AppContainer, Context
from ..stats import Figure, busbw, human_bytes, one_per_rank, parse_results, ratios, unmeasured


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
COLL_ALGORITHMS["abi"] = COLL_ALGORITHMS["mpich"]   # MPI=abi: the image's default library is PyPI's MPICH 5
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
