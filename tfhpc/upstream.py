"""`make upstream-tests`: Horovod's own TensorFlow 2 and Keras suites (test/parallel of the pinned release) on 2 ranks
over Gloo in the app image, once with Keras 3 as `tf.keras` (TF_USE_LEGACY_KERAS=0) and once with tf_keras (=1).

The suites are read from Horovod's public source at the pinned tag, never committed: HOROVOD_SRC names a Horovod git
checkout (its tag v<version> is used) or a directory holding test/parallel; without it the tag's tarball is
downloaded from GitHub. The Keras 3 run takes a copy of the suites with tests/upstream/keras3-tests.patch applied (the
tests' own Keras 2 idioms in Keras 3's words, each hunk saying why) and deselects the tests about Keras 2 only
(NOT_APPLICABLE), which the report counts apart, never as passed. Writes build/upstream/results.{json,md} (counts per
Keras and rank, the failed tests, the time of each run) and fails when a test failed or a rank did not report."""
from __future__ import annotations

import io
import json
import re
import shutil
import ssl
import subprocess
import tarfile
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

import docker.errors

from .common import REPO_ROOT, UserError, log, write_atomically
from .dockerhost import client
from .imagebuild import build_image
from .manifest import Config

OUTPUT = REPO_ROOT / "build" / "upstream"
# The suites' own requirements on the app image, the way users add packages (examples/add-packages: the image's
# packages kept as they are); a local image tfhpc-test-upstream:TAG, never pushed.
DOCKERFILE = REPO_ROOT / "examples" / "add-packages" / "Dockerfile"
REQUIREMENTS = REPO_ROOT / "tests" / "upstream"
SUITES = ("test_tensorflow.py", "test_tensorflow2_keras.py")
# Keras as tf.keras -> the TF_USE_LEGACY_KERAS value that selects it
KERAS = {"3": "0", "2": "1"}
TARBALL = "https://codeload.github.com/horovod/horovod/tar.gz/refs/tags/v{version}"
# Keras -> the changes its run makes to the suites (a unified diff against test/ of the pinned release)
TEST_PATCHES = {"3": REQUIREMENTS / "keras3-tests.patch"}
# Keras -> the tests about Keras 2 only, deselected in its run and reported as not applicable: node id -> why
NOT_APPLICABLE = {
    "3": {
        "test_tensorflow2_keras.py::Tf2KerasTests::test_legacy_optimizer":
            "wraps keras.optimizers.legacy.Adam, the Keras 2 optimizers, which Keras 3 does not have",
    },
}
RANKS = 2
TIMEOUT = 3600


@dataclass
class RankResult:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)
    not_applicable: int = 0  # deselected (NOT_APPLICABLE)


def suite_tree(version: str, source: str | None, ca_bundle: Path | None, into: Path) -> Path:
    """Horovod's test/ tree of release `version` under `into`, from `source` (a git checkout or a tree with
    test/parallel) or GitHub's tarball of the tag."""
    target = into / f"horovod-v{version}"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    if source:
        path = Path(source).expanduser()
        if (path / "test" / "parallel").is_dir() and not _is_git(path):
            shutil.copytree(path / "test", target / "test")
            return target / "test"
        if not _is_git(path):
            raise UserError(f"HOROVOD_SRC={source} is neither a Horovod git checkout nor a tree with test/parallel: "
                            "clone https://github.com/horovod/horovod there, or leave HOROVOD_SRC empty")
        archive = subprocess.run(["git", "-C", str(path), "archive", f"v{version}", "test"], capture_output=True)
        if archive.returncode:
            raise UserError(f"HOROVOD_SRC={source} has no tag v{version}: run `git -C {source} fetch --tags`")
        tarfile.open(fileobj=io.BytesIO(archive.stdout)).extractall(target, filter="data")
        return target / "test"
    url = TARBALL.format(version=version)
    context = ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle else None)
    try:
        with urllib.request.urlopen(url, context=context, timeout=120) as response:
            data = response.read()
    except OSError as error:
        raise UserError(f"cannot download {url} ({error}): set HOROVOD_SRC to a Horovod git checkout") from error
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        members = [m for m in archive.getmembers() if m.name.split("/", 2)[1:2] == ["test"]]
        for member in members:
            member.name = member.name.split("/", 1)[1]
        archive.extractall(target, members=members, filter="data")
    return target / "test"


HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@.*$", re.M)


def apply_patch(patch: Path, root: Path) -> None:
    """Applies the unified diff `patch` (paths a/... b/... relative to root) to the files under root, as `patch -p1`
    without fuzz: each hunk's old lines at the line its header names, else where they occur once."""
    for section in re.split(r"^--- a/", patch.read_text(), flags=re.M)[1:]:
        path = root / section.splitlines()[1].removeprefix("+++ b/")
        content = path.read_text().splitlines(keepends=True)
        parts = HUNK.split(section)
        for start, hunk in zip(parts[1::2], parts[2::2]):
            # (an editor may have stripped the blank context lines to empty lines)
            lines = [" \n" if line == "\n" else line for line in hunk[1:].splitlines(keepends=True)]
            lines = [line for line in lines if line[:1] in (" ", "-", "+")]
            old = [line[1:] for line in lines if line[0] in " -"]
            new = [line[1:] for line in lines if line[0] in " +"]
            found = [i for i in range(len(content) - len(old) + 1) if content[i:i + len(old)] == old]
            # Earlier hunks are applied: the hunk's new start line is where its old lines are now.
            at = int(start) - 1 if int(start) - 1 in found else found[0] if len(found) == 1 else None
            if at is None:
                raise UserError(f"{patch.name} does not apply to {path.relative_to(root)}: the hunk at line {start} "
                                f"is found {len(found)} times elsewhere, not once")
            content[at:at + len(old)] = new
        path.write_text("".join(content))


def keras_tree(tests: Path, keras: str, into: Path) -> Path:
    """The suites (the test/ tree `tests`) as the run with `keras` takes them: a copy with TEST_PATCHES[keras]
    applied, or `tests` itself."""
    if keras not in TEST_PATCHES:
        return tests
    target = into / f"keras{keras}"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(tests, target / "test")
    apply_patch(TEST_PATCHES[keras], target)
    return target / "test"


def deselected(tests: Path, keras: str) -> dict[str, str]:
    """NOT_APPLICABLE[keras], each test checked to be in the suites (a deselection of a missing test is silent)."""
    tests_of_keras = NOT_APPLICABLE.get(keras, {})
    for node in tests_of_keras:
        suite, _, name = node.split("::")
        if f"def {name}(" not in (tests / "parallel" / suite).read_text():
            raise UserError(f"{node} is not in Horovod's suites: update NOT_APPLICABLE in tfhpc/upstream.py")
    return tests_of_keras


def _is_git(path: Path) -> bool:
    return subprocess.run(["git", "-C", str(path), "rev-parse", "--git-dir"], capture_output=True).returncode == 0


def parse_junit(xml: bytes) -> RankResult:
    """Counts of one rank's pytest junit report; a test with an <error> counts as failed."""
    result = RankResult()
    for case in ET.fromstring(xml).iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = {child.tag for child in case}
        if outcome & {"failure", "error"}:
            result.failed += 1
            result.failures.append(name)
        elif "skipped" in outcome:
            result.skipped += 1
        else:
            result.passed += 1
    return result


def run_suites(image: str, tests: Path, keras: str) -> dict[int, RankResult]:
    """Both suites on RANKS ranks (horovodrun --gloo) in a container of `image`, the tests NOT_APPLICABLE to `keras`
    deselected; each rank's junit report."""
    not_applicable = deselected(tests, keras)
    for node, why in not_applicable.items():
        log(f"not applicable with Keras {keras}, deselected: {node}: {why}")
    deselect = "".join(f" --deselect {node}" for node in not_applicable)
    script = (f"cd /suite/parallel && python -m pytest -p no:cacheprovider -q --junit-xml=/tmp/junit/rank-$HOROVOD_RANK"
              f".xml{deselect} {' '.join(SUITES)}")
    command = ["sh", "-c", f"mkdir -p /tmp/junit && horovodrun --gloo -np {RANKS} -H localhost:{RANKS} "
               f"sh -c '{script}'; echo status=$?"]
    container = client().containers.run(image, command, entrypoint=[], detach=True, shm_size="1g",
                                        environment={"TF_USE_LEGACY_KERAS": KERAS[keras]},
                                        volumes={str(tests): {"bind": "/suite", "mode": "ro"}})
    try:
        container.wait(timeout=TIMEOUT)
        output = container.logs().decode(errors="replace")
        (OUTPUT / f"keras{keras}.log").write_text(output)
        try:
            stream, _ = container.get_archive("/tmp/junit")
        except docker.errors.NotFound:
            raise UserError(f"no rank wrote a report with Keras {keras}: see {OUTPUT / f'keras{keras}.log'}") from None
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
            reports = {int(Path(m.name).stem.split("-")[1]): archive.extractfile(m).read()
                       for m in archive.getmembers() if m.isfile() and m.name.endswith(".xml")}
    finally:
        container.remove(force=True)
    missing = sorted(set(range(RANKS)) - set(reports))
    if missing:
        raise UserError(f"ranks {missing} wrote no report with Keras {keras}: see {OUTPUT / f'keras{keras}.log'}")
    results = {rank: parse_junit(xml) for rank, xml in sorted(reports.items())}
    for result in results.values():
        result.not_applicable = len(not_applicable)
    return results


def render(version: str, results: dict[str, dict[int, RankResult]], seconds: dict[str, float] | None = None) -> str:
    lines = [f"# Horovod {version}'s own suites ({', '.join(SUITES)}) on {RANKS} ranks over Gloo", "",
             "| tf.keras | rank | passed | failed | skipped | not applicable |", "|---|---|---|---|---|---|"]
    for keras, ranks in results.items():
        for rank, result in ranks.items():
            lines.append(f"| Keras {keras} | {rank} | {result.passed} | {result.failed} | {result.skipped} "
                         f"| {result.not_applicable} |")
    if seconds:
        lines += ["", "Time (both suites, all ranks): " + ", ".join(f"Keras {k} {s:.0f} s" for k, s in seconds.items())]
    for keras in results:
        if keras in TEST_PATCHES:
            lines += ["", f"With Keras {keras} the suites carry {TEST_PATCHES[keras].relative_to(REPO_ROOT)}: the tests' "
                      "own Keras 2 idioms in Keras 3's words, each hunk saying why."]
        if NOT_APPLICABLE.get(keras):
            lines += ["", f"Not applicable with Keras {keras} (deselected, not counted as passed):",
                      *[f"- `{node}`: {why}" for node, why in NOT_APPLICABLE[keras].items()]]
    for keras, ranks in results.items():
        failed = sorted({name for result in ranks.values() for name in result.failures})
        if failed:
            lines += ["", f"Failed with Keras {keras}:", *[f"- `{name}`" for name in failed]]
    return "\n".join(lines) + "\n"


def upstream_tests(config: Config, source: str | None, ca_bundle: Path | None, keras: tuple[str, ...]) -> Path:
    if not config.versions.get("tf_keras") and "3" in keras:
        raise UserError(f"stack {config.stack} has no Keras 3 (TensorFlow {config.versions['tensorflow']}): "
                        "use --keras 2, or STACK=latest")
    OUTPUT.mkdir(parents=True, exist_ok=True)
    version = config.versions["horovod"]
    with tempfile.TemporaryDirectory(prefix="tfhpc-upstream-") as tmp:
        tests = suite_tree(version, source, ca_bundle, Path(tmp))
        image = build_image(config, DOCKERFILE, f"tfhpc-test-upstream:{config.tag}", config.image("app"), ca_bundle,
                            context=REQUIREMENTS)
        results, seconds = {}, {}
        for choice in keras:
            log(f"Horovod {version}'s suites with Keras {choice} as tf.keras")
            started = time.monotonic()
            results[choice] = run_suites(image, keras_tree(tests, choice, Path(tmp)), choice)
            seconds[choice] = time.monotonic() - started
    report = {"horovod": version, "image": config.image("app"), "suites": list(SUITES), "ranks": RANKS,
              "seconds": {k: round(v) for k, v in seconds.items()},
              "not_applicable": {k: NOT_APPLICABLE.get(k, {}) for k in results},
              "results": {k: {str(r): asdict(v) for r, v in ranks.items()} for k, ranks in results.items()}}
    write_atomically(OUTPUT / "results.json", json.dumps(report, indent=2).encode())
    page = render(version, results, seconds)
    write_atomically(OUTPUT / "results.md", page.encode())
    print(page)
    failed = [k for k, ranks in results.items() if any(r.failed for r in ranks.values())]
    if failed:
        raise UserError(f"Horovod's suites failed with Keras {', '.join(failed)}: see {OUTPUT / 'results.md'}")
    return OUTPUT / "results.md"
