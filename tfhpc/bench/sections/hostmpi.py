"""Host MPI (bind model): mpi4py's allreduce on a host MPI against the image's own, in the MPICH image (PyPI's MPICH,
MPICH ABI) and, where the stack has one, in the standard-ABI image (MPI=abi: PyPI's MPICH and Intel MPI, Open MPI 6)."""
from __future__ import annotations

import os
import statistics

import docker.errors

from ... import sitempi
from ...common import log
from ...dockerhost import client
from ...manifest import Config, Manifest
from ..context import MB, PROBES, RANKS, AppContainer, Context, decode
from ..stats import Figure, busbw, human_bytes, one_per_rank, parse_results, ratios

HOST_MPI_SIZE = 64 * MB
# The image MPIs this section runs and, for each, the host MPIs (versions.toml [site_mpi]) it measures against the
# image's own; each host MPI is started by its own launcher, which finds its libraries as a site's module lets it
# (LD_LIBRARY_PATH=<prefix>/lib), with what it needs here (Intel MPI's wheel has no libfabric: shared memory; PMIx 7
# warns on every rank that its compression plugins are missing).
HOST_MPIS = {"mpich": ("mpich",), "abi": ("mpich", "impi-rt", "openmpi6")}
LAUNCHERS = {"mpich": ("bin/mpiexec -n {ranks}", {}),
             "impi-rt": ("bin/mpiexec -n {ranks}", {"I_MPI_FABRICS": "shm"}),
             "openmpi6": ("bin/prterun -n {ranks}", {"PMIX_MCA_pcompress_base_silence_warning": "1"})}
NAMES = {"mpich": "MPICH", "impi-rt": "Intel MPI", "openmpi6": "Open MPI 6"}


def image_mpis(config: Config) -> list[str]:
    """The image MPIs of HOST_MPIS that this stack and flavour build."""
    return [mpi for mpi in HOST_MPIS if mpi in config.site_test_mpis]


def _prefix(image_mpi: str) -> str:
    """Figure ids: the MPICH image's keep their names (hostmpi.<run>.<size>); the ABI image's are hostmpi.abi.*."""
    return "hostmpi" if image_mpi == "mpich" else f"hostmpi.{image_mpi}"


def _image_figure_ids(image_mpi: str) -> list[tuple[str, str, str, str]]:
    size, prefix = human_bytes(HOST_MPI_SIZE), _prefix(image_mpi)
    image_name = {"mpich": "the MPICH image's MPICH", "abi": "the ABI image's MPICH (libmpi_abi)"}[image_mpi]
    ids = [(f"{prefix}.image.{HOST_MPI_SIZE}", "hostmpi", f"mpi4py busbw, {image_name}, {size}", "GB/s")]
    for host in HOST_MPIS[image_mpi]:
        # The MPICH image's host figures keep their ids of before the ABI image (hostmpi.host.*, hostmpi.ratio.*).
        run = "host" if image_mpi == "mpich" else host
        ids += [(f"{prefix}.{run}.{HOST_MPI_SIZE}", "hostmpi",
                 f"mpi4py busbw, {image_mpi} image on host {NAMES[host]} (TFHPC_HOST_MPI), {size}", "GB/s"),
                (f"{prefix}.ratio{'' if image_mpi == 'mpich' else '.' + host}.{HOST_MPI_SIZE}", "hostmpi",
                 f"{image_mpi} image: host {NAMES[host]} / image MPI busbw, {size}", "ratio")]
    return ids


def host_mpi_figure_ids(config: Config) -> list[tuple[str, str, str, str]]:
    return [figure for image_mpi in image_mpis(config) for figure in _image_figure_ids(image_mpi)]


def bench_host_mpi(ctx: Context, app: AppContainer) -> None:
    for image_mpi in image_mpis(ctx.config):
        _bench_image(ctx, image_mpi)


def _bench_image(ctx: Context, image_mpi: str) -> None:
    """Every run in one container of the image (Docker's default seccomp for all), round after round; every run
    through the image's entrypoint, which puts the host MPI first and decides MPICH's single copy for Docker."""
    manifest = Manifest()
    config = manifest.config(ctx.config.stack, ctx.config.flavor, image_mpi)
    image = config.image(config.layers.leaf)
    try:
        client().images.get(image)
    except docker.errors.ImageNotFound:
        raise RuntimeError(f"{image} is not built: run `make site-images`") from None
    prefixes = {host: sitempi.in_containers(sitempi.install_host(manifest, host, config))
                for host in HOST_MPIS[image_mpi]}
    container = client().containers.run(
        image, ["sleep", "infinity"], entrypoint=[], detach=True,
        name=f"tfhpc-bench-hostmpi-{image_mpi}-{os.getpid()}",
        volumes={str(PROBES): {"bind": "/bench", "mode": "ro"},
                 str(sitempi.SITE_MPI_DIR): {"bind": sitempi.MOUNT, "mode": "ro"}})
    probe = (f"tfhpc-entrypoint python3 /bench/allreduce.py --impl mpi4py --sizes {HOST_MPI_SIZE} "
             f"--reps {ctx.plan.reps} --block-seconds {ctx.plan.block_seconds}")
    runs = {"image": (f"mpiexec -n {RANKS} {probe}", {})}
    for host, prefix in prefixes.items():
        launcher, environment = LAUNCHERS[host]
        runs[host] = (f"{prefix}/{launcher.format(ranks=RANKS)} {probe}",
                      {"TFHPC_HOST_MPI": prefix, "LD_LIBRARY_PATH": f"{prefix}/lib", **environment})
    samples: dict[str, list[float]] = {name: [] for name in runs}
    per_round: dict[str, list[float]] = {name: [] for name in runs}
    try:
        for round_ in range(ctx.plan.allreduce_rounds):
            for name, (command, env) in runs.items():
                log(f"bench: host MPI, {image_mpi} image, round {round_ + 1}/{ctx.plan.allreduce_rounds}: {name}")
                code, output = container.exec_run(["bash", "-c", command], environment=env, demux=True)
                text = decode(output)
                if code != 0:
                    raise RuntimeError(f"`{command}` exited {code}: {text[-1500:]}")
                report = one_per_rank(parse_results(text), 1)[0]
                ctx.raw.setdefault("host_mpi", []).append({"image_mpi": image_mpi, "round": round_, "run": name,
                                                           **report})
                seconds = report["seconds_per_op"][str(HOST_MPI_SIZE)]
                values = [busbw(HOST_MPI_SIZE, s, report["ranks"]) / 1e9 for s in seconds]
                samples[name].extend(values)
                per_round[name].append(statistics.median(values))
    finally:
        container.remove(force=True)
    hosts = ", ".join(f"{NAMES[h]} {sitempi.version(manifest, h)}" for h in prefixes)
    note = f"host {hosts}; image {image}; {RANKS} ranks, one container"
    ids = iter(_image_figure_ids(image_mpi))
    figure_id, _, label, unit = next(ids)
    ctx.add(Figure(figure_id, "hostmpi", label, unit, samples=samples["image"], note=note))
    for host in prefixes:
        (host_id, _, host_label, unit), (ratio_id, _, ratio_label, _) = next(ids), next(ids)
        ctx.add(Figure(host_id, "hostmpi", host_label, unit, samples=samples[host], note=note))
        ctx.add(Figure(ratio_id, "hostmpi", ratio_label, "ratio", samples=ratios(per_round[host], per_round["image"]),
                       note="median of per-round ratios"))
