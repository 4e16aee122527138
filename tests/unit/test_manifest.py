"""The versions manifest and the stack's shape: reading, derivation of names, tags, build args and labels."""
import re
import textwrap

import pytest

from tfhpc import UserError
from tfhpc.manifest import Layers, Manifest, upstream_version


def test_layers_in_build_order_with_parents_first(manifest):
    names = manifest.layers.names
    for layer in manifest.layers.layers:
        if layer.parent:
            assert names.index(layer.parent) < names.index(layer.name)
    assert manifest.layers.chain("horovod") == ["base", "mpi", "tensorflow", "horovod"]
    assert manifest.layers.descendants("tensorflow") == ["tensorflow", "horovod", "app"]
    assert manifest.layers.leaf == "app"


def test_every_layer_has_a_dockerfile_taking_its_parent_as_base_image(manifest):
    from tfhpc import REPO_ROOT
    for name in manifest.layers.names:
        dockerfile = (REPO_ROOT / "containers" / name / "Dockerfile").read_text()
        assert dockerfile.count("ARG BASE_IMAGE\n") == 1 and re.search(r"^FROM \$\{BASE_IMAGE\}", dockerfile, re.M), name


def test_default_config_is_the_latest_cpu_openmpi_stack(manifest):
    config = manifest.config()
    assert (config.stack, config.flavor, config.mpi) == ("latest", "cpu", "openmpi")
    assert config.tag == "latest-cpu-openmpi"
    assert config.image("horovod") == "tfhpc-horovod:latest-cpu-openmpi"


def test_build_args_carry_the_pins(manifest):
    args = manifest.config("latest").build_args()
    data = manifest.data
    assert args["TENSORFLOW_VERSION"] == data["stacks"]["latest"]["tensorflow"]
    assert args["HOROVOD_VERSION"] == data["defaults"]["horovod"]
    # the default MPI, Open MPI, adds its own patches (horovod_openmpi_patches); MPICH takes the stack's alone
    assert args["HOROVOD_PATCHES"].split() == (data["stacks"]["latest"]["horovod_patches"]
                                               + data["stacks"]["latest"]["horovod_openmpi_patches"])
    mpich = manifest.config("latest", mpi="mpich").build_args()
    assert mpich["HOROVOD_PATCHES"].split() == data["stacks"]["latest"]["horovod_patches"]
    assert args["MPI_PACKAGE_VERSION"] == data["os"][data["stacks"]["latest"]["os"]]["mpi"]["openmpi"]["package_version"]
    conservative = manifest.config("conservative").build_args()
    assert conservative["TF_KERAS_VERSION"] == "" and conservative["TF_USE_LEGACY_KERAS"] == "0"
    assert conservative["HOROVOD_PATCHES"].split() == data["stacks"]["conservative"]["horovod_patches"]


def test_labels_have_one_version_label_per_component(manifest):
    config = manifest.config("latest", mpi="mpich")
    labels = config.labels("mpi")
    spec = manifest.data["os"][config.os_release]["mpi"]["mpich"]
    # an MPI from a PyPI wheel names the wheel too (MPI=abi: "abi mpich <version>")
    assert labels["io.tfhpc.mpi.version"] == " ".join(
        ["mpich", *([spec["wheel"]] if spec.get("wheel") else []), upstream_version(spec["package_version"])])
    for component in ("tensorflow", "tf_keras", "horovod", "mpi4py", "python", "os"):
        assert f"io.tfhpc.{component}.version" in labels
    assert labels["org.opencontainers.image.title"] == "tfhpc-mpi"
    assert "io.tfhpc.tf_keras.version" not in manifest.config("conservative").labels("mpi")


def test_app_layer_packages_are_pinned_per_stack_and_labelled_from_the_app_layer_on(manifest):
    data = manifest.data
    for stack in manifest.stacks:
        config = manifest.config(stack)
        args = config.build_args()
        assert args["TENSORBOARD_VERSION"] == data["stacks"][stack]["tensorboard"]
        assert args["MATPLOTLIB_VERSION"] == data["defaults"]["matplotlib"]
        for package in ("tensorboard", "matplotlib"):
            assert config.labels("app")[f"io.tfhpc.{package}.version"] == config.versions[package]
            assert f"io.tfhpc.{package}.version" not in config.labels("horovod"), "installed by the app layer"
            assert package in config.component_versions()
        # tensorboard at TensorFlow's minor version (TF 2.21 -> 2.21.x, TF 2.15 -> 2.15.x)
        assert config.versions["tensorboard"].split(".")[:2] == config.versions["tensorflow"].split(".")[:2]


@pytest.mark.parametrize("kwargs, message", [
    ({"stack": "newest"}, "unknown STACK 'newest': valid values are conservative, latest"),
    ({"flavor": "tpu"}, "unknown FLAVOR 'tpu': valid values are"),
    ({"mpi": "mvapich"}, "unknown MPI 'mvapich': valid values are abi, mpich, openmpi"),
])
def test_unknown_values_list_the_valid_ones(manifest, kwargs, message):
    with pytest.raises(UserError, match=message):
        manifest.config(**kwargs)


def test_upstream_version():
    assert upstream_version("4.1.6-7+b2") == "4.1.6"
    assert upstream_version("1:2.3-1") == "2.3"
    assert upstream_version("4.0.2") == "4.0.2"
    assert upstream_version("2.0+really1.9-3") == "1.9"


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_circular_parents_are_refused(tmp_path):
    path = write(tmp_path, "layers.toml", """
        [a]
        parent = ""
        [b]
        parent = "c"
        [c]
        parent = "b"
    """)
    with pytest.raises(UserError, match="b, c have unknown or circular parents"):
        Layers.load(path)


def test_missing_patch_file_is_named(tmp_path, manifest):
    text = (manifest.path.read_text()
            .replace('"0003-lr-callback-float-momentum.patch",', '"0004-does-not-exist.patch",'))
    path = write(tmp_path, "versions.toml", text)
    with pytest.raises(UserError, match="patch '0004-does-not-exist.patch' of stack 'latest'"):
        Manifest(path).config("latest")


def test_broken_toml_is_one_line(tmp_path):
    path = write(tmp_path, "versions.toml", "stacks = [\n")
    with pytest.raises(UserError, match="is not valid TOML"):
        Manifest(path)


def test_gpu_flavour_pins_tensorflows_tested_cuda_build(manifest):
    config = manifest.config("latest", "gpu")
    gpu = manifest.data["stacks"]["latest"]["gpu"]
    assert "nccl" not in gpu, "NCCL's version is the nvidia-nccl-cu12 pin: written once"
    assert config.os_release == manifest.data["flavors"]["gpu"]["os"]  # the flavour's OS (for its nvcc)
    args = config.build_args()
    assert args["TENSORFLOW_PACKAGE"] == "tensorflow[and-cuda]"
    pins = dict(pin.split("==") for pin in args["TENSORFLOW_EXTRA_PINS"].split())
    assert pins == gpu["wheels"] and config.gpu["nccl"] == gpu["wheels"]["nvidia-nccl-cu12"]
    assert pins["nvidia-cudnn-cu12"].startswith(gpu["cudnn"])
    assert args["CUDA_ARCHITECTURES"] == gpu["cuda_architectures"] and args["CUDA_HOST_COMPILER"]
    assert args["HOROVOD_PATCHES"].split() == (manifest.data["stacks"]["latest"]["horovod_patches"]
                                               + manifest.data["stacks"]["latest"]["horovod_gpu_patches"]
                                               + manifest.data["stacks"]["latest"]["horovod_openmpi_patches"])
    labels = config.labels("tensorflow")
    for component in ("cuda", "cudnn", "nccl"):
        assert labels[f"io.tfhpc.{component}.version"] == config.gpu[component]
    assert config.tag == "latest-gpu-openmpi"


def test_cpu_flavour_gets_no_gpu_arguments_or_patches(manifest):
    args = manifest.config("latest", "cpu").build_args()
    assert args["TENSORFLOW_EXTRA_PINS"] == args["CUDA_TOOLKIT_PACKAGE_VERSION"] == args["CUDA_ARCHITECTURES"] == ""
    assert not any("gpu" in patch for patch in args["HOROVOD_PATCHES"].split())
    assert "io.tfhpc.cuda.version" not in manifest.config("latest", "cpu").labels("app")


def test_stack_without_gpu_table_refuses_the_gpu_flavour_in_one_line(manifest):
    with pytest.raises(UserError, match=r"stack 'conservative' has no GPU flavour.*use STACK=latest with FLAVOR=gpu"):
        manifest.config("conservative", "gpu")



def test_site_tests_take_the_standard_abi_stack_only_where_versions_toml_has_it(manifest):
    """`make site-images` builds what `tfhpc site-mpis` prints: MPICH always; MPI=abi where the OS table of the stack
    has [os.<release>.mpi.abi] and its `flavors` include the flavour (Debian 13's CPU images only)."""
    assert manifest.config("latest", "cpu").site_test_mpis == ["mpich", "abi"]
    assert manifest.config("latest", "cpu", "mpich").site_test_mpis == ["mpich", "abi"], "whatever MPI= says"
    assert manifest.config("latest", "gpu").site_test_mpis == ["mpich"]
    assert manifest.config("conservative", "cpu").site_test_mpis == ["mpich"]
