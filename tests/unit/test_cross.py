"""An emulated build's compiles by the build host's cross compilers (tfhpc/cross.py, containers/cross/cross-env):
the build arguments, which layers take them, and cross-env's choice between the cross compilers and none."""
import os
import subprocess

import pytest

from tfhpc import REPO_ROOT, cross, emulation, imagebuild
from tfhpc.manifest import Manifest

CROSS_ENV = REPO_ROOT / "containers" / "cross" / "cross-env"


@pytest.fixture(scope="module")
def manifest():
    return Manifest()


def test_the_host_architecture_is_found_by_its_machine(manifest):
    assert emulation.host_arch(manifest, "x86_64") == "amd64"
    assert emulation.host_arch(manifest, "aarch64") == "arm64"
    assert emulation.host_arch(manifest, "riscv64") is None


def test_an_arm64_build_on_x86_64_gets_the_hosts_root_and_the_triplet(monkeypatch, manifest):
    roots = []
    monkeypatch.setattr(cross, "needs_emulation", lambda config: True)
    monkeypatch.setattr(cross, "host_machine", lambda: "x86_64")
    monkeypatch.setattr(cross, "resolve_root", lambda config, source: roots.append((config.arch, source)) or "root:x")
    args = cross.cross_args(manifest.config(arch="arm64"), "auto", manifest)
    assert args == {"CROSS_IMAGE": "root:x", "CROSS_TRIPLET": "aarch64-linux-gnu"}
    assert roots == [("amd64", "auto")]  # the host's OS root, of the same stack (so the same Debian release)


def test_a_native_build_passes_nothing(monkeypatch, manifest):
    monkeypatch.setattr(cross, "needs_emulation", lambda config: False)
    monkeypatch.setattr(cross, "resolve_root", lambda config, source: pytest.fail("no root for a native build"))
    assert cross.cross_args(manifest.config(), "auto", manifest) == {}


def test_only_the_layers_that_compile_take_the_cross_arguments(monkeypatch, manifest):
    assert [layer for layer in manifest.layers.names if cross.uses_cross(layer)] == ["mpi", "horovod"]
    seen = {}
    monkeypatch.setattr(imagebuild, "build_image", lambda *a, **k: seen.setdefault(a[2], a[7]) and a[2])
    config = manifest.config(arch="arm64")
    for layer in ("tensorflow", "horovod"):
        imagebuild.build_layer(config, layer, "parent", None, None, image=layer,
                               cross={"CROSS_IMAGE": "root:x", "CROSS_TRIPLET": "aarch64-linux-gnu"})
    assert "CROSS_TRIPLET" not in seen["tensorflow"] and seen["horovod"]["CROSS_TRIPLET"] == "aarch64-linux-gnu"


def test_cross_env_runs_the_command_as_it_is_without_cross_compilers(tmp_path):
    # A native build's `cross` stage has no /cross/etc/tfhpc-cross-triplet: the command runs unchanged, PATH too.
    done = subprocess.run([str(CROSS_ENV), "sh", "-c", 'echo "$PATH"; exit 7'], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"]})
    assert done.returncode == 7 and done.stdout.strip() == os.environ["PATH"] and done.stderr == ""
