"""Write the benchmark's outputs: results.json (everything), results.md (the tables docs/measurements.md quotes) and
PNG plots. Each file is written under a temporary name and renamed, so a reader never sees half of one."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .stats import human_bytes

SECTIONS = (("allreduce", "Allreduce bus bandwidth (2 ranks; in the app container, or in the SIF where it says so)"),
            ("hvdphase", "Horovod's allreduce per phase (its timeline, 2 ranks, in the app container)"),
            ("coll", "The MPI's allreduce algorithms (mpi4py, 2 ranks, in the SIF)"),
            ("hostmpi", "Host MPI (bind model): the MPICH image on its own MPICH and on a host MPICH; the standard-ABI "
                        "image on its own MPICH and on host MPICH, Intel MPI and Open MPI 6"),
            ("train", "Training throughput (synthetic benchmark, small CNN, batch 32 per worker, 1 thread each)"),
            ("startup", "Start-up: `import tensorflow, horovod.tensorflow`"),
            ("footprint", "Footprint"), ("build", "Build"))


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _number(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def markdown(results: dict) -> str:
    lines = [f"`make bench{' QUICK=1' if results['quick'] else ''}` of {results['finished']} on "
             f"{results['app_image']} ({results['cpus']} cores), {results['duration_seconds']:.0f} s. "
             "Median of the samples; spread = min–max (n samples). Ratios are taken per round from runs back to back.",
             ""]
    loads = ", ".join(f"{e['moment']} {e['loadavg'][0]:.1f}" for e in results["environment"])
    others = sorted({c for e in results["environment"] for c in e["other_containers"]})
    lines += [f"Load average (1 min): {loads}. Other containers seen: {', '.join(others) or 'none'}.", ""]
    check = results.get("idle_check")
    if check and not check["idle"]:
        lines += [f"**Taken on a busy machine** ({'; '.join(check['reasons'])}"
                  f"{', QUICK=1 does not wait' if results['quick'] else ', INSIST=1'}): the figures are noisy.", ""]
    elif check:
        lines += [f"Idle at the start ({check['waited_seconds']:.0f} s of waiting).", ""]
    lines += ["| goal | target | measured | verdict |", "|---|---|---|---|"]
    for goal in results["goals"]:
        value = "—" if goal["value"] is None else _number(goal["value"])
        lines.append(f"| {goal['text']} | {'≤' if goal['at_most'] else '≥'} {_number(goal['target'])} | {value} | "
                     f"{goal['verdict']} |")
    for section, title in SECTIONS:
        figures = [f for f in results["figures"] if f["section"] == section]
        if not figures:
            continue
        lines += ["", f"**{title}**", "", "| figure | median | spread | unit | note |", "|---|---|---|---|---|"]
        for figure in figures:
            if figure["value"] is None:
                lines.append(f"| {figure['label']} | not measured | | {figure['unit']} | {figure['reason']} |")
                continue
            v = figure["value"]
            spread = f"{_number(v['min'])}–{_number(v['max'])} (n={v['n']})" if v["n"] > 1 else "(n=1)"
            note = "; ".join(part for part in (figure["note"], figure["source"]) if part)
            lines.append(f"| {figure['label']} | {_number(v['median'])} | {spread} | {figure['unit']} | {note} |")
    return "\n".join(lines) + "\n"


def plots(results: dict, directory: Path) -> list[Path]:
    import matplotlib  # here: only the plots need it (~0.4 s to import with pyplot)
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt  # after matplotlib.use(), which must come first
    written = []
    figures = {f["id"]: f for f in results["figures"]}

    sweep = results["raw"].get("allreduce_sweep", {})
    if sweep:
        fig, ax = plt.subplots(figsize=(8, 5))
        for name, by_size in sweep.items():
            points = sorted((int(k), v) for k, v in by_size.items() if k.isdigit())
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sizes = sorted({int(k) for by_size in sweep.values() for k in by_size if k.isdigit()})
        ax.set_xticks(sizes, [human_bytes(s) for s in sizes], rotation=45)
        ax.set_xlabel("message size")
        ax.set_ylabel("GB/s (busbw; memcpy: copy bandwidth)")
        ax.set_title("Allreduce, 2 ranks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        written.append(_save(fig, directory / "allreduce.png"))
        plt.close(fig)

    series = {}
    for id, figure in figures.items():
        parts = id.split(".")
        if parts[0] == "startup" and len(parts) == 3 and parts[2].isdigit() and figure["value"]:
            series.setdefault(parts[1], []).append((int(parts[2]), figure["value"]))
    if series:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for mode, points in sorted(series.items()):
            points.sort(key=lambda p: p[0])
            ax.errorbar([p[0] for p in points], [p[1]["median"] for p in points],
                        yerr=[[p[1]["median"] - p[1]["min"] for p in points],
                              [p[1]["max"] - p[1]["median"] for p in points]], marker="o", capsize=3, label=mode)
        ax.set_xlabel("processes started at once")
        ax.set_ylabel("seconds per process (start to exit)")
        ax.set_title("import tensorflow, horovod.tensorflow")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        written.append(_save(fig, directory / "startup.png"))
        plt.close(fig)

    bars = [(figures[id]["label"].split(":")[0], figures[id]["value"]) for id in figures
            if id.startswith("train.") and figures[id]["unit"] == "img/s" and figures[id]["value"]]
    if bars:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        ax.barh([b[0] for b in bars], [b[1]["median"] for b in bars],
                xerr=[[b[1]["median"] - b[1]["min"] for b in bars], [b[1]["max"] - b[1]["median"] for b in bars]],
                capsize=3)
        ax.set_xlabel("images/s (total)")
        ax.set_title("Synthetic training throughput")
        fig.tight_layout()
        written.append(_save(fig, directory / "training.png"))
        plt.close(fig)
    return written


def _save(fig, path: Path) -> Path:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
    os.close(fd)
    fig.savefig(tmp, dpi=100)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def write_outputs(results: dict, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    try:
        results["plots"] = [p.name for p in plots(results, directory)]
    except ImportError as error:  # matplotlib is in requirements.txt; say so rather than lose the figures
        results["plots"] = []
        results["plots_error"] = f"no plots: {error} (run `make venv`)"
    _atomic_write(directory / "results.json", (json.dumps(results, indent=2) + "\n").encode())
    _atomic_write(directory / "results.md", markdown(results).encode())
    return directory / "results.json"
