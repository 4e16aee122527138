"""Host MPI (bind model): the MPICH image's mpi4py on a host MPICH against the image's own MPICH."""
from __future__ import annotations

import os
import statistics

import docker.errors

from ... import sitempi
from ...common import log
from ...dockerhost import client
from ...manifest import Manifest
from ..context import MB, PROBES, RANKS, AppContainer, Context, decode
from ..stats import Figure, busbw, human_bytes, one_per_rank, parse_results, ratios

HOST_MPI = "mpich"   # versions.toml [site_mpi]: PyPI's MPICH 5, launched by its own hydra mpiexec
HOST_MPI_SIZE = 64 * MB


def host_mpi_figure_ids() -> list[tuple[str, str, str, str]]:
    size = human_bytes(HOST_MPI_SIZE)
    return [(f"hostmpi.image.{HOST_MPI_SIZE}", "hostmpi", f"mpi4py busbw, the MPICH image's MPICH, {size}", "GB/s"),
            (f"hostmpi.host.{HOST_MPI_SIZE}", "hostmpi", f"mpi4py busbw, host MPICH (TFHPC_HOST_MPI), {size}", "GB/s"),
            (f"hostmpi.ratio.{HOST_MPI_SIZE}", "hostmpi", f"host MPICH / image MPICH busbw, {size}", "ratio")]


def bench_host_mpi(ctx: Context, app: AppContainer) -> None:
    """Both runs in one container of the MPICH app image (Docker's default seccomp for both), round after round."""
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
                text = decode(output)
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
