"""Training throughput: Horovod and MWMS in the container against the host venv, 1 and 2 workers, pinned, over
Gloo and with glibc malloc; the container / host ratios and the 2-worker efficiencies."""
from __future__ import annotations

import os

from ...common import REPO_ROOT, log
from .. import hostvenv
from ..context import AppContainer, Context, host_mpirun
from ..stats import Figure, efficiency, one_per_rank, parse_results, ratios, unmeasured

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
    # The Keras of tf.keras: the entrypoints train with Keras 3 by default; tf_keras (--keras 2) side by side.
    ("train.container.hvd2_tfkeras", "train", "container, Horovod, 2 workers, tf_keras: images/s (total)", "img/s"),
    ("train.container.mwms2_tfkeras", "train", "container, MWMS, 2 workers, tf_keras: images/s (total)", "img/s"),
    ("train.ratio.keras3_tfkeras.hvd2", "train", "Keras 3 / tf_keras images/s, Horovod, 2 workers", "ratio"),
    ("train.ratio.keras3_tfkeras.mwms2", "train", "Keras 3 / tf_keras images/s, MWMS, 2 workers", "ratio"),
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
        "container.hvd2_tfkeras": lambda: app.run(f"mpirun -np 2 tfhpc-benchmark-hvd {args} --keras 2"),
        "container.mwms2_tfkeras": lambda: app.run(f"tfhpc-launch-local-mwms -n 2 -- tfhpc-benchmark-mwms {args} "
                                                   "--keras 2"),
        "container.hvd2_glibc": lambda: app.run(f"mpirun -np 2 tfhpc-benchmark-hvd {args}", env={"LD_PRELOAD": ""}),
        "container.hvd1_pinned": lambda: app.run(f"{pinned} -np 1 tfhpc-benchmark-hvd {args}", env=PINNED_ENV),
        "container.hvd2_pinned": lambda: app.run(f"{pinned} -np 2 tfhpc-benchmark-hvd {args}", env=PINNED_ENV),
    }
    workers_of = {name: 1 if "hvd1" in name else 2 for name in runs}
    totals: dict[str, list[float]] = {name: [] for name in runs}
    iteration_totals: dict[str, list[float]] = {name: [] for name in runs}
    failed: dict[str, str] = {} if venv_ready else {"host.hvd1": host_reason, "host.hvd2": host_reason}
    if not ctx.config.keras_patches:  # the stacks with Keras 3 patch it; without Keras 3 both runs would be Keras 2
        failed.update(dict.fromkeys(("container.hvd2_tfkeras", "container.mwms2_tfkeras"),
                                    f"stack {ctx.config.stack} has no Keras 3 to compare tf_keras with"))
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
    for mode in ("hvd2", "mwms2"):
        a, b = f"container.{mode}", f"container.{mode}_tfkeras"
        add(f"train.ratio.keras3_tfkeras.{mode}", [a, b], lambda a=a, b=b: ratios(totals[a], totals[b]), per_round)
    add("train.ratio.tcmalloc_glibc.hvd2", ["container.hvd2", "container.hvd2_glibc"],
        lambda: ratios(totals["container.hvd2"], totals["container.hvd2_glibc"]), per_round)
    add("train.efficiency.container.hvd_pinned", ["container.hvd2_pinned", "container.hvd1_pinned"],
        lambda: [efficiency(x2, x1, 2) for x2, x1 in zip(totals["container.hvd2_pinned"],
                                                          totals["container.hvd1_pinned"])],
        "median of per-round efficiencies (X1 and X2 run back to back)")
    add("train.efficiency.container.hvd_gloo", ["container.hvd2_gloo", "container.hvd1"],
        lambda: [efficiency(x2, x1, 2) for x2, x1 in zip(totals["container.hvd2_gloo"], totals["container.hvd1"])],
        "median of per-round efficiencies (X1 and X2 run back to back)")
