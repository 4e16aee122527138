"""A flavour versions.toml marks `unavailable` on an architecture (FLAVOR=gpu ARCH=arm64: TensorFlow's aarch64 wheels
are built without CUDA) is refused by every command that takes a configuration, in one line that names the cause and
the options, with a non-zero status and nothing written; its locks are not made. The reason is versions.toml's, not
the tooling's. The commands run in a copy of the tooling and the manifest (tmp_path), so that "nothing written" is
checked on a tree nothing else writes to, even beside `make test`'s other worker."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tfhpc import REPO_ROOT, UserError
from tfhpc.emulation import host_config
from tfhpc.lock import lock_configurations
from tfhpc.manifest import Manifest

REFUSED = {"FLAVOR": "gpu", "ARCH": "arm64"}
# What the one line must say: the configuration, the cause and its source, the options.
MESSAGE = ("FLAVOR=gpu ARCH=arm64 is not built: ", "TensorFlow's aarch64 wheels are built without CUDA",
           "tensorflow/tensorflow#121157", "FLAVOR=cpu ARCH=arm64", "built from source for aarch64 with CUDA",
           "vendor container")
# Every command of `python -m tfhpc` that takes a configuration, with the arguments it cannot run without.
COMMANDS = [["build"], ["sif"], ["push"], ["sqsh"], ["edf"], ["show"], ["bench"], ["native-sif"], ["repro"],
            ["upstream-tests"], ["image-name"], ["site-mpis"], ["ci-build-layer", "--layer", "base"], ["lock"],
            ["lock", "--check"]]
# The Makefile's targets that build, lock or publish (`make sif` fails at its `image` prerequisite).
MAKE_TARGETS = ["image", "sif", "lock", "push", "sqsh", "edf", "show", "bench"]
# What the CLI and the Makefile read: the copy they run in.
TREE = ["tfhpc", "versions.toml", "containers/layers.toml", "Makefile", "requirements.txt"]


@pytest.fixture
def tree(tmp_path):
    for name in TREE:
        source, target = REPO_ROOT / name, tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    return tmp_path


def snapshot(root: Path) -> dict[str, int]:
    """Every file and directory below `root`, each with its modification time (a directory: -1)."""
    return {str(path.relative_to(root)): path.stat().st_mtime_ns if path.is_file() else -1
            for path in root.rglob("*")}


def run(command: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, **REFUSED, "PYTHONDONTWRITEBYTECODE": "1", **env}
    for name in ("STACK", "MPI", "LAYER", "REGISTRY"):
        environment.pop(name, None)
    return subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=120)


def assert_refused(error_lines: list[str]) -> None:
    assert len(error_lines) == 1, error_lines
    assert error_lines[0].startswith("tfhpc: error: ")
    for part in MESSAGE:
        assert part in error_lines[0], (part, error_lines[0])


def test_the_manifest_refuses_the_configuration_with_versions_tomls_reason(manifest):
    with pytest.raises(UserError) as error:
        manifest.config("latest", "gpu", arch="arm64")
    assert_refused([f"tfhpc: error: {error.value}"])
    assert str(error.value) == f"FLAVOR=gpu ARCH=arm64 is not built: {manifest.unavailable('gpu', 'arm64')}"
    with pytest.raises(UserError, match="FLAVOR=gpu ARCH=arm64 is not built"):
        manifest.config("conservative", "gpu", arch="arm64")  # before the stack's own lack of a GPU table
    # the flavour on the other architecture, and the other flavour on this one, are built
    assert manifest.unavailable("gpu", "amd64") == manifest.unavailable("cpu", "arm64") == ""
    assert manifest.config("latest", "gpu").gpu and manifest.config("latest", "cpu", arch="arm64").arch == "arm64"


def test_the_refusal_is_data(tmp_path):
    """versions.toml decides: without `unavailable` the configuration resolves; `unavailable` on another flavour and
    architecture refuses that one, with its text on one line."""
    text = (REPO_ROOT / "versions.toml").read_text()
    start = text.index("[arches.arm64.flavors.gpu]")
    end = text.index('"""', text.index('unavailable = """', start) + len('unavailable = """')) + 3
    (tmp_path / "without.toml").write_text(text[:start] + text[end:])
    assert Manifest(tmp_path / "without.toml").config("latest", "gpu", arch="arm64").tensorflow_package == \
        "tensorflow[and-cuda]"
    (tmp_path / "other.toml").write_text(text + '\n[arches.amd64.flavors.cpu]\nunavailable = """not here:\n  ask"""\n')
    other = Manifest(tmp_path / "other.toml")
    with pytest.raises(UserError, match=r"^FLAVOR=cpu ARCH=amd64 is not built: not here: ask$"):
        other.config("latest", "cpu", arch="amd64")
    assert other.config("latest", "cpu", arch="arm64").tensorflow_package == "tensorflow"


def test_the_hosts_own_tools_are_not_refused(monkeypatch, manifest):
    """On an aarch64 host, an amd64 GPU build's apptainer helper and cross compilers' root are the host's
    configuration of the same flavour: never an image, so not refused."""
    monkeypatch.setattr("tfhpc.emulation.host_machine", lambda: "aarch64")
    helper = host_config(manifest, manifest.config("latest", "gpu"))
    assert (helper.arch, helper.flavor) == ("arm64", "gpu")


def test_lock_leaves_the_configuration_out_and_refuses_it_when_named(manifest):
    assert "locks/latest-gpu-arm64" not in {config.locks for config in lock_configurations(manifest)}
    assert [c.locks for c in lock_configurations(manifest, ["amd64", "arm64"], ["gpu"])] == ["locks/latest-gpu"]
    with pytest.raises(UserError) as error:
        lock_configurations(manifest, ["arm64"], ["gpu"])
    assert_refused([f"tfhpc: error: {error.value}"])
    assert not (REPO_ROOT / "locks" / "latest-gpu-arm64").exists()


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_every_command_refuses_it_in_one_line_and_writes_nothing(tree, args):
    before = snapshot(tree)
    result = run([sys.executable, "-m", "tfhpc", *args], tree)
    assert result.returncode == 2 and result.stdout == ""
    assert_refused(result.stderr.splitlines())
    assert snapshot(tree) == before


@pytest.mark.parametrize("target", MAKE_TARGETS)
def test_make_refuses_it_and_writes_nothing(tree, target):
    """Through the front door, with this venv (its `make venv` step taken as done: -o)."""
    venv = Path(sys.executable).parent.parent
    before = snapshot(tree)
    result = run(["make", "--no-print-directory", "-s", "-o", f"{venv}/.installed", target, f"VENV={venv}"], tree)
    assert result.returncode != 0 and result.stdout == ""
    assert_refused([line for line in result.stderr.splitlines() if line.startswith("tfhpc:")])
    assert snapshot(tree) == before
