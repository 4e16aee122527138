"""`make edf`: the CSCS Container Engine EDF (tfhpc/edf.py) of every configuration of versions.toml, parsed back and
checked against the entries, tables and annotations eth-cscs/cscs-docs documents (container-engine/edf.md,
resource-hook.md) and the srun --mpi its MPI pages name (Open MPI: pmix, MPICH: pmi2). No docker, no image."""
import re
import subprocess
import sys
import tomllib

import pytest

from support.stack import MANIFEST, REPO_ROOT
from tfhpc import UserError
from tfhpc.edf import write_edf
from tfhpc.publish import version_tag
from tfhpc.sqsh import sqsh_path

# edf.md: "EDF entries" and "EDF tables", with their documented TOML types.
DOCUMENTED = {"base_environment": (list, str), "image": str, "workdir": str, "entrypoint": bool, "writable": bool,
              "mounts": list, "env": dict, "annotations": dict}
MOUNT = re.compile(r"[^:]+:[^:]+(:[a-z]+(\+[a-z]+)*)?")  # SOURCE:DESTINATION[:FLAGS], flags joined by "+"


def configurations():
    found = []
    for stack in MANIFEST.stacks:
        for flavor in MANIFEST.flavors:
            for mpi in MANIFEST.mpis():
                try:
                    found.append(pytest.param(MANIFEST.config(stack, flavor, mpi), id=f"{stack}-{flavor}-{mpi}"))
                except UserError:  # a stack without this flavour (versions.toml says so)
                    continue
    return found


def flatten(table, prefix=""):
    """TOML tables of annotations as the dotted names the Container Engine reads (com.hooks.cxi.enabled)."""
    flat = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def test_every_configuration_is_covered():
    assert len(configurations()) >= 6  # 2 stacks x cpu x 2 MPIs + the GPU flavour's 2 MPIs


@pytest.mark.parametrize("config", configurations())
def test_edf_per_configuration(config, tmp_path):
    path = write_edf(MANIFEST, config, output=tmp_path / "app.toml")
    text = path.read_text()
    data = tomllib.loads(text)
    assert set(data) <= set(DOCUMENTED), set(data) - set(DOCUMENTED)
    for key, value in data.items():
        assert isinstance(value, DOCUMENTED[key]), key
    assert data["image"] == str(sqsh_path(config, "app"))
    assert data["mounts"] and all(isinstance(m, str) and MOUNT.fullmatch(m) for m in data["mounts"])
    assert data["workdir"] in {m.split(":")[1] for m in data["mounts"]}  # a mounted, user-writable directory
    annotations = flatten(data["annotations"])
    assert all(isinstance(value, str) for value in annotations.values())  # annotation values are strings
    assert annotations["com.hooks.cxi.enabled"] == "true"
    env = data.get("env", {})
    assert all(isinstance(value, str) for value in env.values())
    stack_gpu = MANIFEST.data["stacks"][config.stack].get("gpu", {})
    if config.flavor == "gpu":
        assert annotations["com.hooks.aws_ofi_nccl.enabled"] == "true"
        assert annotations["com.hooks.aws_ofi_nccl.variant"] == f"cuda{stack_gpu['cuda'].split('.')[0]}"
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all"  # the image sets no NVIDIA_* (no driver injection without)
    else:
        assert not any(key.startswith("com.hooks.aws_ofi_nccl") for key in annotations)
        assert not any(key.startswith("NVIDIA_") for key in env)
    srun = {"openmpi": "--mpi=pmix", "mpich": "--mpi=pmi2"}[config.mpi]
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert any(srun in line and f"--environment={path}" in line for line in comments), comments
    if config.mpi == "openmpi":  # cscs-docs communication/openmpi.md: PMIx security, CXI provider via cm/ofi
        assert {k: env[k] for k in ("PMIX_MCA_psec", "FI_PROVIDER", "OMPI_MCA_pml", "OMPI_MCA_mtl")} == \
            {"PMIX_MCA_psec": "native", "FI_PROVIDER": "cxi", "OMPI_MCA_pml": "cm", "OMPI_MCA_mtl": "ofi"}
    else:
        assert not any(key.startswith(("OMPI_", "PMIX_")) for key in env)


@pytest.mark.parametrize("registry, prefix", [("ghcr.io/org", "ghcr.io#org/tfhpc-app:"),
                                              ("127.0.0.1:5000", "127.0.0.1:5000#tfhpc-app:"),
                                              ("registry.example.org/a/b", "registry.example.org#a/b/tfhpc-app:")])
def test_registry_reference_is_enroot_style_and_versioned(registry, prefix, tmp_path):
    config = MANIFEST.config()
    data = tomllib.loads(write_edf(MANIFEST, config, registry=registry, output=tmp_path / "x.toml").read_text())
    assert data["image"] == prefix + version_tag(config)


def test_make_edf_command_writes_the_default_file(tmp_path):
    out = tmp_path / "edf.toml"
    done = subprocess.run([sys.executable, "-m", "tfhpc", "edf", "--output", str(out), "--image", "/scratch/x.sqsh"],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    assert tomllib.loads(out.read_text())["image"] == "/scratch/x.sqsh"


@pytest.mark.parametrize("arch", MANIFEST.arches)
def test_the_squashfs_and_the_header_are_of_the_architecture(arch, tmp_path):
    """Alps' GH200 nodes are aarch64: ARCH=arm64 names the arm64 squashfs; a pushed tag is an index over both."""
    config = MANIFEST.config(arch=arch)
    text = write_edf(MANIFEST, config, output=tmp_path / "sqsh.toml").read_text()
    assert tomllib.loads(text)["image"] == str(sqsh_path(config, "app"))
    assert f"# The squashfs is {config.platform}: for " in text
    assert ("GH200 nodes." in text) is (config.machine == "aarch64")
    text = write_edf(MANIFEST, config, registry="127.0.0.1:5000", output=tmp_path / "index.toml").read_text()
    assert tomllib.loads(text)["image"] == f"127.0.0.1:5000#tfhpc-app:{version_tag(config)}"
    assert "# The tag is an index over the published platforms: GH200 nodes (aarch64) take linux/arm64" in text
