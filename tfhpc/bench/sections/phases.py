"""Where Horovod's time goes: its timeline, per phase and message size, with the default and the tuned settings."""
from __future__ import annotations

from ...common import log
from ..context import MB, RANKS, TUNED_HOROVOD, AppContainer, Context
from ..stats import Figure, horovod_phases, human_bytes, load_trace, unmeasured

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
