"""Registry tags derived from the versions manifest (tfhpc/publish.py), and `make push`'s one-line errors that need
no registry and no image."""
import os
import re
import subprocess
import sys

import pytest

from tfhpc import REPO_ROOT, UserError
from tfhpc.publish import moving_tags, parse_registry, version_tag


def test_version_tag_names_the_stack_contents(manifest):
    config = manifest.config("latest", "cpu", "openmpi")
    tag = version_tag(config)
    tf = config.versions["tensorflow"].split(".")
    mpi = re.match(r"(?:\d+:)?(\d+)\.(\d+)", config.os["mpi"]["openmpi"]["package_version"]).groups()
    assert tag == f"tf{tf[0]}.{tf[1]}-hvd{config.versions['horovod']}-openmpi{mpi[0]}.{mpi[1]}-cpu"
    assert re.fullmatch(r"[\w][\w.-]{0,127}", tag)  # a valid OCI tag


def test_every_configuration_gets_its_own_version_tag(manifest):
    configs = []
    for stack in manifest.stacks:
        for flavor in manifest.flavors:
            for mpi in manifest.mpis():
                try:
                    configs.append(manifest.config(stack, flavor, mpi))
                except UserError:  # a stack without this flavour (the manifest says so)
                    continue
    tags = [version_tag(config) for config in configs]
    assert len(set(tags)) == len(tags) == len(configs) >= 4
    for config in configs:
        if getattr(config, "gpu", None):  # the GPU flavour names its CUDA, which decides the driver a site needs
            assert version_tag(config).endswith(f"-gpu-cuda{'.'.join(str(config.gpu['cuda']).split('.')[:2])}")


def test_moving_tags(manifest):
    default = manifest.config()
    assert moving_tags(manifest, default) == [default.tag, default.flavor]
    other_mpi = next(m for m in manifest.mpis() if m != default.mpi)
    config = manifest.config(None, None, other_mpi)
    assert moving_tags(manifest, config) == [config.tag]  # the bare flavour tag is the default stack's and MPI's


@pytest.mark.parametrize("registry", ["127.0.0.1:5000", "ghcr.io/org", "registry.example.org:443/a/b", "[::1]:5000"])
def test_registry_accepted(registry):
    assert parse_registry(registry + "/") == registry


@pytest.mark.parametrize("registry, message", [("", "REGISTRY is not set"), (None, "REGISTRY is not set"),
                                               ("http://127.0.0.1:5000", "is not host[:port]"),
                                               ("ghcr.io/Org", "is not host[:port]"),
                                               ("host:port", "is not host[:port]")])
def test_bad_registry_is_one_line(registry, message):
    with pytest.raises(UserError, match=re.escape(message)) as error:
        parse_registry(registry)
    assert "\n" not in str(error.value) and "make push REGISTRY=" in str(error.value)


def test_make_push_without_registry_fails_in_one_line():
    env = {k: v for k, v in os.environ.items() if k not in ("REGISTRY", "MAKEFLAGS")}
    done = subprocess.run(["make", "--no-print-directory", "push"], cwd=REPO_ROOT, capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode != 0
    ours = [line for line in done.stderr.splitlines() if line.startswith("tfhpc:")]
    assert ours == ["tfhpc: error: REGISTRY is not set: give the registry to push to, "
                    "e.g. make push REGISTRY=127.0.0.1:5000 (or ghcr.io/ORG)"], done.stderr
    assert "Traceback" not in done.stderr


def test_missing_sign_key_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tfhpc", "push", "--registry", "127.0.0.1:1",
                           "--sign-key", str(tmp_path / "none.pem")], cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"tfhpc: error: SIGN_KEY={tmp_path / 'none.pem'}: no such file: give a PEM private key "
        "(openssl genpkey -algorithm RSA); nothing was pushed"]
