"""What every section of `make bench` shares: the plan (how much to run), the context a section reports into, the
app container it runs commands in, and the host's commands (a shell, the host's mpirun with each rank's output
apart)."""
from __future__ import annotations

import datetime
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..apptainer import helper_image_name, start_helper
from ..common import REPO_ROOT
from ..dockerhost import client
from ..manifest import Config, Manifest
from ..sif import SIF_DIR, sif_path
from . import idle
from .stats import Figure

BENCH_DIR = REPO_ROOT / "build" / "bench"
PROBES = Path(__file__).resolve().parent / "probes"
MB = 1 << 20
RANKS = 2  # the sweep: 2 ranks (this machine has 2 cores)
# Horovod "tuned": the background thread wakes every HOROVOD_CYCLE_TIME ms to negotiate; a 2-rank shared-memory
# allreduce of a small tensor takes tens of microseconds, so a shorter cycle cuts latency. A fusion buffer of
# 128 MB lets the 16-tensor pattern of the sweep's largest sizes go in one fused operation.
TUNED_HOROVOD = {"HOROVOD_CYCLE_TIME": "0.1", "HOROVOD_FUSION_THRESHOLD": str(128 * MB)}
# The start-up modes the startup section can measure; the full plan runs every one.
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
    def make(cls, quick: bool, startup_processes: int = 8) -> "Plan":
        """`startup_processes`: the start-up section's largest count (the goals' 8). The test of the bench machinery
        (tests/bench) passes 2: the same code at 2 processes at once takes a quarter of the time of 8 (each process
        imports TensorFlow on the 2 cores); the 8-process goals are then not judged, with that reason."""
        if quick:  # what the goals need, once (ratios n=1): the SIF and the venv at 1 and 8 processes, 64 MB
            return cls(True, (1 << 10, 64 * MB), (64 * MB,), 3, 0.03, 1, 1,
                       ("--iters", "3", "--batches-per-iter", "5", "--warmup-batches", "2"), (1, startup_processes),
                       1, ("sif", "sif_instance", "docker", "venv"), 0)
        return cls(False, tuple(1 << e for e in range(10, 29, 2)), (1 * MB, 16 * MB, 64 * MB, 256 * MB), 5, 0.1,
                   3, 3, ("--iters", "5", "--batches-per-iter", "10", "--warmup-batches", "3"),
                   tuple(sorted({1, min(4, startup_processes), startup_processes})), 2,
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
        if self._helper is None:
            self._helper = start_helper(helper_image_name(Manifest(), self.config), ["sleep", "infinity"],
                                        {str(SIF_DIR): "/sif:ro", str(PROBES): "/bench:ro", str(self.out): "/out"})
            self._helper.exec_run(["chmod", "0666", "/dev/fuse"], user="root")  # as tests/sif/conftest.py does
        code, output = self._helper.exec_run(["bash", "-c", command], user="tfhpc", demux=True)
        text = decode(output)
        if code != 0:
            raise RuntimeError(f"`{command[:200]}` in the apptainer helper exited {code}: {text[-1500:]}")
        return text

    def sif(self) -> str:
        """The app SIF's path in the helper; RuntimeError (the figures' reason) when it is not built."""
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
        self.environment.append({"moment": moment, "time": now(), **idle.machine_state()})



def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def decode(output) -> str:
    if isinstance(output, tuple):  # exec_run(demux=True)
        return "".join((part or b"").decode(errors="replace") for part in output)
    return (output or b"").decode(errors="replace")


class AppContainer:
    """The app image, kept running (sleep) for the whole benchmark; commands run in it with `docker exec` as the
    image's user. The probes are mounted read-only at /bench, an output directory at /out."""

    def __init__(self, image: str, out: Path):
        self.out = out
        self.container = client().containers.run(
            image, ["sleep", "infinity"], entrypoint=[], detach=True, name=f"tfhpc-bench-app-{os.getpid()}",
            cap_add=["SYS_PTRACE"],  # strace in the container
            volumes={str(PROBES): {"bind": "/bench", "mode": "ro"}, str(out): {"bind": "/out", "mode": "rw"}})

    def run(self, command: str, env: dict | None = None, check: bool = True) -> str:
        code, output = self.container.exec_run(["bash", "-c", command], environment=env or {}, demux=True)
        text = decode(output)
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
RANK_OUTPUT["abi"] = RANK_OUTPUT["mpich"]   # MPI=abi: PyPI MPICH's hydra


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
