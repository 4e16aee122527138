"""`make repro`: build layers twice without the build cache, on the stack's existing parent images, and compare the
files each build installed (a sorted sha256 list of the regular files, and symlink targets, under the layer's
compared trees). Writes build/repro/report.{json,md} and one listing per build; the stack's own tags are not touched.

A difference is either explained in EXPLAINED (a known cause outside this project, with the reason) or it fails the
check; `diagnose` names what a differing file's bytes show (a timestamp .pyc, an embedded build path), to start the
investigation with."""
from __future__ import annotations

import datetime
import fnmatch
import hashlib
import io
import json
import re
import struct
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable, Iterator

import docker.errors

from .common import REPO_ROOT, UserError, git_head, log, write_atomically
from .dockerhost import client
from .imagebuild import build_image, layer_inputs
from .manifest import Config

REPORT_DIR = REPO_ROOT / "build" / "repro"

# The layers `make repro` builds twice, and the trees compared in each: the Python environment every layer installs
# into, and for the app layer also its scripts, data set, locks and SBOM.
COMPARED_TREES = {
    "tensorflow": ("/opt/venv",),
    "app": ("/opt/venv", "/opt/tfhpc"),
}

# Differences that remain for a cause outside this project: glob on the path -> why. Empty: two cold builds of the
# compared layers give the same bytes (docs/measurements.md, "Same bytes twice").
EXPLAINED: dict[str, str] = {}

PYC_FLAGS = {0: "timestamp", 1: "unchecked-hash", 3: "checked-hash"}  # PEP 552: the .pyc header's flags word


@dataclass(frozen=True)
class Entry:
    """One compared file: `digest` is "sha256:<hex>" for a regular file, "symlink:<target>" or "hardlink:<target>";
    `pyc_flags` the PEP 552 flags of a .pyc (None otherwise)."""

    digest: str
    pyc_flags: int | None = None
    size: int = 0


@dataclass
class Difference:
    path: str
    a: str
    b: str
    reason: str
    explained: bool


@dataclass
class LayerResult:
    layer: str
    roots: tuple[str, ...]
    files: int
    identical: int
    differences: list[Difference] = field(default_factory=list)
    build_seconds: list[float] = field(default_factory=list)
    image_ids: list[str] = field(default_factory=list)

    @property
    def unexplained(self) -> list[Difference]:
        return [d for d in self.differences if not d.explained]


def _under(name: str, roots: tuple[str, ...]) -> bool:
    path = "/" + name.lstrip("./").lstrip("/")
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def tree_listing(tar: tarfile.TarFile, roots: tuple[str, ...]) -> dict[str, Entry]:
    """Path -> Entry for every regular file, symlink and hard link under `roots` in the tar stream `tar` (a `docker
    export`); directories and their modes are not compared."""
    listing: dict[str, Entry] = {}
    for member in tar:
        if not _under(member.name, roots):
            continue
        path = "/" + member.name.lstrip("./").lstrip("/")
        if member.issym():
            listing[path] = Entry(f"symlink:{member.linkname}")
        elif member.islnk():
            listing[path] = Entry(f"hardlink:/{member.linkname.lstrip('./')}")
        elif member.isfile():
            handle = tar.extractfile(member)
            digest = hashlib.sha256()
            head = b""
            for block in iter(lambda: handle.read(1 << 20), b""):
                if not head:
                    head = block[:16]
                digest.update(block)
            flags = struct.unpack("<I", head[4:8])[0] if path.endswith(".pyc") and len(head) >= 8 else None
            listing[path] = Entry(f"sha256:{digest.hexdigest()}", flags, member.size)
    return listing


def sha256_lines(listing: dict[str, Entry]) -> str:
    """The listing as `sha256sum` prints it (symlinks and hard links with their target instead of a digest), sorted
    by path."""
    return "".join(f"{entry.digest.removeprefix('sha256:')}  {path}\n" for path, entry in sorted(listing.items()))


def diagnose(path: str, a: Entry | None, b: Entry | None) -> str:
    """What the two versions of a differing file show about why they differ."""
    if a is None or b is None:
        return f"only in build {'b' if a is None else 'a'}"
    if a.digest.split(":")[0] != b.digest.split(":")[0]:
        return f"a {a.digest.split(':')[0]} in build a, a {b.digest.split(':')[0]} in build b"
    if not a.digest.startswith("sha256:"):
        return f"link target differs: {a.digest} / {b.digest}"
    if path.endswith(".pyc"):
        modes = {PYC_FLAGS.get(e.pyc_flags, f"flags {e.pyc_flags}") for e in (a, b)}
        if modes == {"timestamp"}:
            return "timestamp .pyc: the header holds the source file's mtime, the time of the install"
        return f".pyc ({' / '.join(sorted(modes))}) with different code: the compiled source differs"
    if path.endswith("/RECORD"):
        return "pip's RECORD lists the sha256 of each installed file: another file of this package differs"
    if a.size != b.size:
        return f"content differs ({a.size} / {b.size} bytes)"
    return "content differs, same size (an embedded time, build path or random value)"


def explanation(path: str) -> str | None:
    for pattern, reason in EXPLAINED.items():
        if fnmatch.fnmatch(path, pattern):
            return reason
    return None


def compare(layer: str, roots: tuple[str, ...], a: dict[str, Entry], b: dict[str, Entry]) -> LayerResult:
    """The files of two builds of `layer` compared: identical, and each difference with its reason."""
    paths = sorted(set(a) | set(b))
    result = LayerResult(layer, roots, files=len(paths), identical=0)
    for path in paths:
        if a.get(path) is not None and b.get(path) is not None and a[path].digest == b[path].digest:
            result.identical += 1
            continue
        known = explanation(path)
        result.differences.append(Difference(
            path, a[path].digest if path in a else "(absent)", b[path].digest if path in b else "(absent)",
            known or diagnose(path, a.get(path), b.get(path)), known is not None))
    return result


def report_json(config: Config, results: list[LayerResult], seconds: float, when: str) -> dict:
    return {
        "date": when,
        "config": config.tag,
        "commit": git_head()[0][:12],
        "duration_seconds": round(seconds, 1),
        "passed": not any(r.unexplained for r in results),
        "layers": {r.layer: {
            "compared_trees": list(r.roots), "files": r.files, "identical": r.identical,
            "differences": [vars(d) for d in r.differences], "unexplained": len(r.unexplained),
            "build_seconds": r.build_seconds, "image_ids": r.image_ids} for r in results},
    }


def report_markdown(report: dict) -> str:
    lines = [f"# Same bytes twice: {report['config']}, {report['date']}, commit {report['commit'] or '(none)'}", "",
             f"Two builds of each layer without the build cache, {report['duration_seconds']} s in all: "
             f"{'passed' if report['passed'] else 'FAILED'}.", "",
             "| layer | compared trees | files | identical | differing | unexplained | build times (s) |",
             "|---|---|---|---|---|---|---|"]
    for layer, r in report["layers"].items():
        lines.append(f"| {layer} | {', '.join(r['compared_trees'])} | {r['files']} | {r['identical']} | "
                     f"{len(r['differences'])} | {r['unexplained']} | {' / '.join(map(str, r['build_seconds']))} |")
    lines += ["", "Image ids of the two builds (they differ: each build's layers and history hold its own times):", ""]
    lines += [f"- {layer}: {' / '.join(r['image_ids'])}" for layer, r in report["layers"].items()]
    for layer, r in report["layers"].items():
        if r["differences"]:
            lines += ["", f"## {layer}: differing files", "", "| file | reason | explained |", "|---|---|---|"]
            lines += [f"| `{d['path']}` | {d['reason']} | {'yes' if d['explained'] else 'no'} |"
                      for d in r["differences"]]
    return "\n".join(lines) + "\n"


class _ChunkReader(io.RawIOBase):
    """A file object over an iterator of byte chunks (the docker SDK's export stream), for tarfile's stream mode."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks: Iterator[bytes] = iter(chunks)
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending:
            self._pending = next(self._chunks, b"")
            if not self._pending:
                return 0
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count


def image_listing(image: str, roots: tuple[str, ...]) -> dict[str, Entry]:
    """tree_listing of `image`'s file system (a created, never started, container exported)."""
    container = client().containers.create(image, entrypoint=["/bin/true"], command=[])
    try:
        stream: IO[bytes] = io.BufferedReader(_ChunkReader(container.export(chunk_size=1 << 20)), 1 << 20)
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            return tree_listing(tar, roots)
    finally:
        container.remove(force=True)


def docker_time(text: str) -> datetime.datetime:
    """A docker API time ("2026-11-24T16:32:24.922855914Z": nanoseconds, Z) as an aware datetime."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", text)
    if not match:
        raise ValueError(f"not a docker API time: {text}")
    whole, fraction, zone = match.groups()
    fraction = (fraction or ".0")[:7]
    return datetime.datetime.fromisoformat(whole + fraction + ("+00:00" if zone == "Z" else zone))


def records_made_between(records: list[dict], started: datetime.datetime,
                         ended: datetime.datetime | None = None) -> list[str]:
    """The ids of the build cache records (`docker system df`'s BuildCache) made from `started` to `ended` (open:
    None) that no image or build uses any more: layer snapshots only, not pip's cache mount or the build context."""
    def made_then(record: dict) -> bool:
        created = docker_time(record["CreatedAt"])
        return started <= created and (ended is None or created <= ended)
    return [record["ID"] for record in records
            if record.get("Type") == "regular" and not record.get("InUse") and made_then(record)]


def prune_build_cache(started: datetime.datetime, ended: datetime.datetime | None = None) -> int:
    """Remove the build cache records the repro builds made (records_made_between); returns how many. BuildKit answers
    a cached step with its newest record, so these would otherwise stand in for the stack's own at the next `make
    image`: the same files with other file times, hence new image ids from that layer up, and Horovod compiled
    again. A build that runs at the same time loses its new records too: a cache miss later, its images stay."""
    engine = client()

    def remaining() -> set[str]:
        return set(records_made_between(engine.df().get("BuildCache") or [], started, ended))
    made = left = remaining()
    while left:  # a record that others were made from goes once they have gone: rounds while that shrinks the set
        for record in left:
            try:  # one id per call: the engine takes one value per filter
                engine.api.prune_builds(filters={"id": record})
            except docker.errors.APIError as error:
                log(f"warning: build cache record {record} not removed ({error.explanation})")
        before, left = left, remaining()
        if left >= before:
            break
    if left:
        log(f"{len(left)} build cache records of the repro builds are kept: a later build was made from them")
    return len(made - left)


def run_repro(config: Config, layers: list[str], ca_bundle: Path | None, pip_index_url: str | None) -> dict:
    """Build each of `layers` twice with --no-cache on the stack's existing parent image, compare, write the report.
    Returns the report (report_json)."""
    engine = client()
    for layer in layers:
        if layer not in COMPARED_TREES:
            raise UserError(f"repro: no compared trees for layer '{layer}': choose from {', '.join(COMPARED_TREES)}")
        parent = config.image(config.layers.get(layer).parent)
        try:
            engine.images.get(parent)
        except docker.errors.ImageNotFound:
            raise UserError(f"repro: the parent image {parent} is missing: build it with `make image "
                            f"LAYER={config.layers.get(layer).parent}`") from None
    started = time.monotonic()
    started_at = datetime.datetime.now(datetime.timezone.utc)
    REPORT_DIR.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for layer in layers:
            parent = config.image(config.layers.get(layer).parent)
            labels, extra_args = layer_inputs(config, layer)
            listings, seconds, image_ids = [], [], []
            for build in ("a", "b"):
                image = f"tfhpc-repro-{layer}:{config.tag}-{build}"
                build_started = time.monotonic()
                try:
                    build_image(config, REPO_ROOT / "containers" / layer / "Dockerfile", image, parent, ca_bundle,
                                pip_index_url, labels, extra_args, no_cache=True)
                    seconds.append(round(time.monotonic() - build_started, 1))
                    image_ids.append(engine.images.get(image).id)
                    log(f"listing {', '.join(COMPARED_TREES[layer])} of {image}")
                    listing = image_listing(image, COMPARED_TREES[layer])
                finally:
                    try:
                        engine.images.remove(image, noprune=False)
                    except docker.errors.ImageNotFound:
                        pass  # the build failed before tagging: nothing to remove
                write_atomically(REPORT_DIR / f"{layer}-{build}.sha256", sha256_lines(listing).encode())
                listings.append(listing)
            result = compare(layer, COMPARED_TREES[layer], *listings)
            result.build_seconds, result.image_ids = seconds, image_ids
            results.append(result)
            log(f"{layer}: {result.identical} of {result.files} files identical, "
                f"{len(result.unexplained)} unexplained differences")
    finally:
        log(f"removed {prune_build_cache(started_at)} build cache records of the repro builds")
    when = started_at.isoformat(timespec="seconds")
    report = report_json(config, results, time.monotonic() - started, when)
    write_atomically(REPORT_DIR / "report.json", (json.dumps(report, indent=2) + "\n").encode())
    write_atomically(REPORT_DIR / "report.md", report_markdown(report).encode())
    return report
