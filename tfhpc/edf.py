"""make edf: an Environment Definition File (EDF) for the CSCS Container Engine (Alps: `srun --environment=FILE.toml`)
for the current configuration, written to build/edf/tfhpc-app_<tag>.toml.

Keys and annotations as eth-cscs/cscs-docs documents them (docs/software/container-engine/edf.md,
resource-hook.md; communication/openmpi.md and mpich.md for the srun --mpi choice):
  - image: the registry reference `REGISTRY#repository:tag` (`make edf REGISTRY=...`: the versioned tag `make push`
    writes) or the path of the squashfs `make sqsh` writes (`--image` gives any other);
  - mounts / workdir: the scratch file system at the same path, and the working directory there (the image's own
    WorkingDir belongs to uid 1000, which the site's user is not);
  - [annotations] com.hooks.cxi.enabled: the host's libfabric (Slingshot CXI provider) replaces the image's;
    GPU flavour: com.hooks.aws_ofi_nccl.enabled with the variant of the image's CUDA major version ("cudaNN": the
    pip CUDA wheels carry no unversioned libcudart.so, which the dynamically linked "cuda-dl" variant looks for);
  - [env]: Open MPI over libfabric/CXI as CSCS documents it (PMIX_MCA_psec, FI_PROVIDER, OMPI_MCA_pml/mtl);
    GPU flavour: NVIDIA_VISIBLE_DEVICES/NVIDIA_DRIVER_CAPABILITIES, which turn the NVIDIA driver injection on
    (the image does not set them).
The srun --mpi the image's MPI needs (Open MPI: pmix, MPICH: pmi2) is written in the file's header comment.
"""
from __future__ import annotations

from pathlib import Path

from .common import REPO_ROOT, UserError
from .manifest import Config, Manifest
from .publish import parse_registry, version_tag
from .sqsh import sqsh_path

EDF_DIR = REPO_ROOT / "build" / "edf"
# The EDF entries and tables cscs-docs documents (edf.md: "EDF entries", "EDF tables").
DOCUMENTED_KEYS = {"base_environment": (list, str), "image": str, "workdir": str, "entrypoint": bool,
                   "writable": bool, "mounts": list, "env": dict, "annotations": dict}
DEFAULT_MOUNTS = ("${SCRATCH}:${SCRATCH}",)
DEFAULT_WORKDIR = "${SCRATCH}"
SRUN_MPI = {"openmpi": "pmix", "mpich": "pmi2", "abi": "pmi2"}   # abi: PyPI MPICH 5 (PMI-1 wire over pmi2)
# CSCS's Open MPI page: PMIx in Slurm's security domain, libfabric's CXI provider through the cm PML and ofi MTL.
OPENMPI_ENV = {"PMIX_MCA_psec": "native", "FI_PROVIDER": "cxi", "OMPI_MCA_pml": "cm", "OMPI_MCA_mtl": "ofi"}
GPU_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}


def edf_path(config: Config, layer: str) -> Path:
    return EDF_DIR / f"tfhpc-{layer}_{config.tag}.toml"


def srun_mpi(config: Config) -> str:
    try:
        return SRUN_MPI[config.mpi]
    except KeyError:
        raise UserError(f"no srun --mpi plugin known for MPI={config.mpi}: add it to tfhpc/edf.py") from None


def registry_reference(config: Config, registry: str, layer: str) -> str:
    """The enroot-style reference of the versioned tag `make push` writes: host[:port]#[namespace/]tfhpc-LAYER:TAG."""
    host, _, namespace = parse_registry(registry).partition("/")
    repository = config.image(layer).partition(":")[0]
    return f"{host}#{namespace + '/' if namespace else ''}{repository}:{version_tag(config)}"


def cuda_variant(config: Config) -> str:
    return f"cuda{str(config.gpu['cuda']).split('.')[0]}"


def edf_data(config: Config, image: str, mounts=DEFAULT_MOUNTS, workdir: str = DEFAULT_WORKDIR) -> dict:
    """The EDF as a dictionary (TOML tables as nested dictionaries, annotation names split at their dots)."""
    hooks = {"cxi": {"enabled": "true"}}
    env = dict(OPENMPI_ENV) if config.mpi == "openmpi" else {}
    if config.flavor == "gpu":
        hooks["aws_ofi_nccl"] = {"enabled": "true", "variant": cuda_variant(config)}
        env.update(GPU_ENV)
    data = {"image": image, "mounts": list(mounts), "workdir": workdir}
    if env:
        data["env"] = env
    data["annotations"] = {"com": {"hooks": hooks}}
    return data


def platform_note(config: Config, from_registry: bool) -> str:
    """Which of Alps' nodes the image entry fits: a pushed tag is an index over every published architecture
    (tfhpc/imageindex.py), which enroot resolves for the node; a squashfs is one architecture's."""
    if from_registry:
        return ("The tag is an index over the published platforms: GH200 nodes (aarch64) take linux/arm64, "
                "x86 nodes linux/amd64.")
    if config.machine == "aarch64":
        return f"The squashfs is {config.platform}: for Alps' GH200 nodes."
    return (f"The squashfs is {config.platform}: for x86 nodes; Alps' GH200 nodes need "
            "`make sqsh edf ARCH=arm64` (docs/arm64.md).")


def header(config: Config, path: Path, from_registry: bool = False) -> str:
    """Comment lines: what the file is for and how to launch with it (TOML has no other place for this)."""
    lines = [f"CSCS Container Engine environment (EDF) for {config.image('app')}, written by `make edf`.",
             f"Run (MPI {config.mpi}: srun --mpi={srun_mpi(config)}):",
             f"  srun -N2 --ntasks-per-node=1 --mpi={srun_mpi(config)} --environment={path} tfhpc-smoke-collectives",
             "Keys: eth-cscs/cscs-docs docs/software/container-engine/edf.md; hooks: resource-hook.md.",
             platform_note(config, from_registry)]
    return "".join(f"# {line}\n" for line in lines) + "\n"


def write_edf(manifest: Manifest, config: Config, image: str | None = None, registry: str | None = None,
              output: Path | None = None) -> Path:
    try:
        import tomli_w  # here: a venv without it gets the one-line error below
    except ImportError:
        raise UserError("tomli-w is missing: run `make venv` (requirements.txt: tomli-w)") from None
    layer = manifest.layers.leaf
    if not image:
        image = registry_reference(config, registry, layer) if registry else str(sqsh_path(config, layer))
    path = (output or edf_path(config, layer)).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header(config, path, from_registry="#" in image) + tomli_w.dumps(edf_data(config, image)))
    return path
