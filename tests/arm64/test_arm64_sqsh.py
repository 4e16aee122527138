"""`make sqsh ARCH=arm64` and `make edf ARCH=arm64`: the squashfs that enroot, pyxis and the CSCS Container Engine
mount on a GH200 node holds the arm64 image's programs, and the EDF names it. (enroot and the Container Engine are not
available here: docs/arm64.md.)"""
import subprocess
import sys
import tomllib

import pytest

from support.stack import CONFIG, MANIFEST, REPO_ROOT
from tfhpc.apptainer import helper_image_name

ELF_MACHINES = {"aarch64": 0xB7, "x86_64": 0x3E}  # e_machine: EM_AARCH64, EM_X86_64


@pytest.fixture(scope="module")
def squashfs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sqsh")
    directory.chmod(0o755)
    target = directory / "app.sqsh"
    done = subprocess.run([sys.executable, "-m", "tfhpc", "sqsh", "--arch", CONFIG.arch, "--output", str(target),
                           "--mksquashfs", "helper"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return target


def test_the_squashfs_holds_the_architectures_programs(squashfs, docker_client):
    # The ELF header's first 20 bytes as decimal text: docker's log of the container's output is not binary-safe.
    output = docker_client.containers.run(
        helper_image_name(MANIFEST, CONFIG),
        ["sh", "-c", f"unsquashfs -cat /sqsh/{squashfs.name} usr/bin/dash | head -c 20 | od -An -tu1"],
        volumes={str(squashfs.parent): {"bind": "/sqsh", "mode": "ro"}}, network_disabled=True, remove=True,
        user="root", stdout=True, stderr=False)
    header = bytes(int(word) for word in output.split())
    assert header[:4] == b"\x7fELF", output
    assert int.from_bytes(header[18:20], "little") == ELF_MACHINES[CONFIG.machine]


def test_the_edf_names_the_squashfs_and_its_platform(squashfs, tmp_path):
    out = tmp_path / "alps.toml"
    done = subprocess.run([sys.executable, "-m", "tfhpc", "edf", "--arch", CONFIG.arch, "--output", str(out),
                           "--image", str(squashfs)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert tomllib.loads(out.read_text())["image"] == str(squashfs)
    assert f"# The squashfs is {CONFIG.platform}: for Alps' GH200 nodes." in out.read_text()
