"""The benchmark's arithmetic and parsing, free of docker and subprocesses (unit-tested in tests/unit/test_bench.py).

Every figure is a `Figure`: the median of repeated samples with their spread, or, when it could not be measured, no
value and the reason. Nothing is dropped: a figure that failed stays in the results with `reason` set.
"""
from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import asdict, dataclass, field


def busbw(size_bytes: float, seconds: float, ranks: int) -> float:
    """Allreduce bus bandwidth in bytes/s, nccl-tests' definition: algbw = S/t, busbw = algbw * 2(N-1)/N (the
    bytes each rank's link must carry in a ring allreduce, so the figure is comparable with the hardware's)."""
    if seconds <= 0 or ranks < 1 or size_bytes < 0:
        raise ValueError(f"busbw needs seconds > 0 and ranks >= 1 (got {seconds}, {ranks})")
    return size_bytes / seconds * 2 * (ranks - 1) / ranks


def efficiency(throughput_n: float, throughput_1: float, workers: int) -> float:
    """Scaling efficiency X_N / (N * X_1): 1.0 means N workers do N times the work of one."""
    if throughput_1 <= 0 or workers < 1:
        raise ValueError(f"efficiency needs X_1 > 0 and N >= 1 (got {throughput_1}, {workers})")
    return throughput_n / (workers * throughput_1)


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default, 'inclusive' method); q in [0, 1]."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary(values: list[float]) -> dict:
    """Median and spread of repeated samples: min, max, interquartile range and the relative half-spread
    (max - min) / 2 / median, the figure's noise in one number."""
    values = [float(v) for v in values]
    if not values or not all(math.isfinite(v) for v in values):
        raise ValueError(f"summary needs finite samples, got {values}")
    median = statistics.median(values)
    return {"median": median, "min": min(values), "max": max(values), "q1": quantile(values, 0.25),
            "q3": quantile(values, 0.75), "n": len(values),
            "rel_spread": (max(values) - min(values)) / 2 / abs(median) if median else 0.0}


@dataclass
class Figure:
    """One reported figure. `samples` are the repeated measurements (or per-run ratios) its median comes from."""

    id: str
    section: str
    label: str
    unit: str
    samples: list[float] = field(default_factory=list)
    reason: str = ""  # why it was not measured (then samples is empty)
    source: str = ""  # where a figure not measured in this run comes from (e.g. a recorded build)
    note: str = ""

    @property
    def measured(self) -> bool:
        return bool(self.samples) and not self.reason

    def to_json(self) -> dict:
        data = asdict(self)
        data["status"] = "measured" if self.measured else "not measured"
        data["value"] = summary(self.samples) if self.measured else None
        return data

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.measured else None


def unmeasured(id: str, section: str, label: str, unit: str, reason: str) -> Figure:
    if not reason:
        raise ValueError(f"figure {id}: a figure not measured needs the reason")
    return Figure(id, section, label, unit, reason=reason)


def ratios(numerators: list[float], denominators: list[float]) -> list[float]:
    """Pairwise ratios of samples taken side by side (sample i of both in the same round)."""
    if len(numerators) != len(denominators):
        raise ValueError(f"side-by-side ratios need as many samples on both sides ({len(numerators)} vs "
                         f"{len(denominators)})")
    return [a / b for a, b in zip(numerators, denominators) if b]


def parse_results(output: str) -> list[dict]:
    """The `RESULT {json}` lines of a run's output, in order. Launchers may prefix lines ("[1,0]<stdout>:",
    "[worker 1] ", "1: "): whatever precedes "RESULT {" is ignored. A line that is not valid JSON raises."""
    reports = []
    for line in output.splitlines():
        head, sep, tail = line.partition("RESULT {")
        if not sep:
            continue
        try:
            reports.append(json.loads("{" + tail))
        except json.JSONDecodeError as error:
            raise ValueError(f"malformed RESULT line ({error}): {line[:200]}") from None
    return reports


def one_per_rank(reports: list[dict], ranks: int) -> list[dict]:
    """Exactly one report per rank 0..ranks-1, sorted by rank."""
    by_rank = sorted(reports, key=lambda r: r.get("rank", -1))
    if [r.get("rank") for r in by_rank] != list(range(ranks)):
        raise ValueError(f"expected one RESULT from each of {ranks} ranks, got ranks "
                         f"{[r.get('rank') for r in by_rank]}")
    return by_rank


# strace -c prints one row per system call: "% time  seconds  usecs/call  calls  errors syscall" (errors may be
# empty), then a dashed line and a "total" row.
_STRACE_ROW = re.compile(r"^\s*([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+(?:(\d+)\s+)?([a-z_0-9]+)\s*$")
OPEN_CALLS = ("open", "openat", "openat2", "creat")
STAT_CALLS = ("stat", "lstat", "fstat", "newfstatat", "statx", "fstatat64", "stat64", "lstat64", "fstat64",
              "access", "faccessat", "faccessat2", "readlink", "readlinkat", "statfs", "fstatfs")


def parse_strace_summary(text: str) -> dict[str, dict[str, int]]:
    """`strace -c` output -> {syscall: {"calls": n, "errors": n}} (the total row is left out)."""
    counts = {}
    for line in text.splitlines():
        match = _STRACE_ROW.match(line)
        if match and match.group(6) != "total":
            counts[match.group(6)] = {"calls": int(match.group(4)), "errors": int(match.group(5) or 0)}
    if not counts:
        raise ValueError("no strace -c summary rows in: " + text[:300])
    return counts


def file_calls(counts: dict[str, dict[str, int]]) -> dict[str, int]:
    """Open-family and stat-family calls (with failed ones: a failed stat still costs a metadata lookup)."""
    return {"open": sum(counts.get(name, {}).get("calls", 0) for name in OPEN_CALLS),
            "stat": sum(counts.get(name, {}).get("calls", 0) for name in STAT_CALLS),
            "failed": sum(counts.get(name, {}).get("errors", 0) for name in (*OPEN_CALLS, *STAT_CALLS)),
            "all": sum(row["calls"] for row in counts.values())}


@dataclass(frozen=True)
class Goal:
    """A target a figure should reach: value >= target (or <= target when `at_most`)."""

    id: str
    figure: str
    target: float
    text: str
    at_most: bool = False

    def judge(self, figure: Figure | None, missing: str = "figure missing") -> dict:
        """`missing`: the reason when the run has no such figure (a plan without it)."""
        result = {"id": self.id, "figure": self.figure, "target": self.target, "text": self.text,
                  "at_most": self.at_most}
        if figure is None or not figure.measured:
            reason = figure.reason if figure is not None else missing
            return {**result, "met": None, "value": None, "verdict": f"not judged: {reason}"}
        value = figure.median
        met = value <= self.target if self.at_most else value >= self.target
        gap = value - self.target
        shortfall = abs(gap) / abs(self.target) if self.target else abs(gap)
        verdict = "met" if met else (f"missed by {abs(gap):.3g} {figure.unit} ({shortfall:.0%} of the target)")
        return {**result, "met": met, "value": value, "gap": gap, "verdict": verdict}


def human_bytes(n: float) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n:.0f} B"


def load_trace(text: str) -> list[dict]:
    """A Chrome trace as Horovod's timeline writes it: a JSON array that is left open while the job runs (and
    possibly cut mid-event when the job ends): the complete events are returned."""
    text = text.strip()
    while text:
        try:
            return json.loads(text if text.endswith("]") else text.rstrip(",") + "]")
        except json.JSONDecodeError:
            cut = text.rfind("}", 0, len(text) - 1)  # drop the last, incomplete event
            text = text[:cut + 1] if cut > 0 else ""
    return []


def horovod_phases(events: list[dict]) -> dict[int, dict]:
    """Where a Horovod allreduce's time goes, per message size (bytes of float32), from its timeline
    (docs.horovod.ai timeline: NEGOTIATE_ALLREDUCE, then ALLREDUCE with MPI_ALLREDUCE and the fusion-buffer copies
    inside). For every operation: `negotiate` (rank 0's negotiation, from the first rank's request to the
    response), `queue` (the response to the start of the operation), `mpi` (MPI_ALLREDUCE), `copies` (ALLREDUCE
    minus MPI_ALLREDUCE: fusion-buffer copies and scheduling) and `outside` (the end of the operation to the next
    same-size negotiation's start: TensorFlow's op, the output tensor, Python; None without two operations of a
    size in a row). Medians in ms (robust to the probe's own barriers), with the number of operations."""
    open_by_pid: dict = {}
    ops: list[dict] = []
    current: dict = {}
    for event in events:
        phase, pid = event.get("ph"), event.get("pid")
        if phase == "B":
            open_by_pid.setdefault(pid, []).append((event["name"], event["ts"]))
        elif phase == "E" and open_by_pid.get(pid):
            name, begin = open_by_pid[pid].pop()
            if name == "NEGOTIATE_ALLREDUCE":
                current[pid] = {"negotiate": (begin, event["ts"])}
            elif name == "MPI_ALLREDUCE" and pid in current:
                current[pid]["mpi"] = event["ts"] - begin
            elif name == "ALLREDUCE" and pid in current:
                args = event.get("args", {})
                if args.get("dtype") == "float32":
                    shape = json.loads(args.get("shape", "[]"))
                    elements = math.prod(shape) if shape else 1
                    op = current.pop(pid)
                    ops.append({"pid": pid, "bytes": 4 * elements, "negotiate": op["negotiate"],
                                "begin": begin, "end": event["ts"], "mpi": op.get("mpi", 0)})
    phases: dict[int, dict] = {}
    for index, op in enumerate(ops):
        entry = phases.setdefault(op["bytes"], {key: [] for key in ("negotiate", "queue", "mpi", "copies",
                                                                     "outside")})
        entry["negotiate"].append(op["negotiate"][1] - op["negotiate"][0])
        entry["queue"].append(op["begin"] - op["negotiate"][1])
        entry["mpi"].append(op["mpi"])
        entry["copies"].append(op["end"] - op["begin"] - op["mpi"])
        following = next((o for o in ops[index + 1:] if o["pid"] == op["pid"]), None)
        if following is not None and following["bytes"] == op["bytes"]:  # not the set-up of the next size
            entry["outside"].append(following["negotiate"][0] - op["end"])
    return {size: {**{key: statistics.median(values) / 1e3 if values else None for key, values in entry.items()},
                   "ops": len(entry["mpi"])} for size, entry in phases.items()}
