"""Bad input to the command line: one line naming the problem and the fix, exit status 2, nothing built."""
import os
import subprocess
import sys

import pytest

from tfhpc import REPO_ROOT


def tfhpc(*args, **env):
    environment = {**os.environ, **env}
    result = subprocess.run([sys.executable, "-m", "tfhpc", *args], cwd=REPO_ROOT, env=environment,
                            capture_output=True, text=True, timeout=120)
    return result.returncode, result.stdout, result.stderr


@pytest.mark.parametrize("args, env, message", [
    (["build"], {"STACK": "newest"}, "unknown STACK 'newest': valid values are conservative, latest"),
    (["build", "--mpi", "mvapich"], {"STACK": "latest"}, "unknown MPI 'mvapich': valid values are abi, mpich, openmpi"),
    (["build", "--flavor", "tpu"], {}, "unknown FLAVOR 'tpu'"),
    (["build", "--base-source", "floppy"], {"DOCKER_HOST": "unix:///nonexistent/docker.sock"},
     "unknown BASE_SOURCE 'floppy': valid values are auto, debootstrap, registry"),
    (["build", "--ca-bundle", "/nonexistent/ca.pem"], {}, "CA_BUNDLE=/nonexistent/ca.pem: no such file"),
    (["build", "--layer", "jupyter"], {}, "unknown layer 'jupyter': valid values are base, mpi"),
    (["sif", "--layer", "mpi"], {}, "make sif converts the app layer (its commands are the SIF's runscript"),
    (["build"], {"DOCKER_HOST": "unix:///nonexistent/docker.sock", "CA_BUNDLE": "none"},
     "docker daemon unreachable"),
])
def test_bad_input_is_one_line_and_exit_2(args, env, message):
    status, out, err = tfhpc(*args, **env)
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("tfhpc: error: ") and message in err, err


def test_docker_unreachable_says_how_to_start_it():
    _, _, err = tfhpc("build", DOCKER_HOST="unix:///nonexistent/docker.sock", CA_BUNDLE="none")
    assert "start it with" in err


def test_show_prints_the_resolved_configuration():
    import json
    status, out, _ = tfhpc("show", STACK="conservative", FLAVOR="cpu", MPI="mpich")
    assert status == 0
    shown = json.loads(out)
    assert shown["tag"] == "conservative-cpu-mpich"
    assert shown["images"]["app"] == "tfhpc-app:conservative-cpu-mpich"
    assert shown["platform"] == "linux/amd64"
    status, out, _ = tfhpc("show", STACK="conservative", FLAVOR="cpu", MPI="mpich", ARCH="arm64")
    shown = json.loads(out)
    assert (shown["tag"], shown["platform"]) == ("conservative-cpu-mpich-arm64", "linux/arm64")
    assert shown["images"]["app"] == "tfhpc-app:conservative-cpu-mpich-arm64"


def test_make_help_lists_targets_and_variables():
    result = subprocess.run(["make", "-s", "help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for word in ("make image", "make test", "make clean", "STACK", "FLAVOR", "MPI", "ARCH", "BASE_SOURCE", "CA_BUNDLE",
                 "make test-arm64"):
        assert word in result.stdout
