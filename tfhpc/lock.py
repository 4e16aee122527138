"""make lock: every Python package an image layer takes from PyPI, pinned by version and sha256 hash, resolved from
versions.toml with uv (`uv pip compile --generate-hashes`) for the image's Python and platform.

One directory per stack x flavour x architecture: locks/<stack>-<flavor>/ for the default architecture,
locks/<stack>-<flavor>-<arch>/ for another, whose wheels and hashes differ (the MPI choice changes no Python package:
mpi4py's binary wheels serve every MPI ABI but the standard one, and Horovod is compiled against the MPI from one sdist), one file per layer stage that takes packages from
PyPI:

| file | stage | what | how the Dockerfile uses it |
|---|---|---|---|
| mpi-build.txt | mpi builder | mpi4py's build requirements (its sdist's build backend's) | installed |
| mpi.txt | mpi builder | mpi4py: its sdist and binary wheels | `pip download --only-binary` or `pip wheel --no-binary mpi4py` (versions.toml: mpi4py) |
| mpi-abi.txt | mpi (MPI=abi) | PyPI's MPICH wheel: the standard-ABI MPI library | installed (only its ABI parts kept) |
| tensorflow.txt | tensorflow | TensorFlow, tf_keras, the GPU flavour's CUDA wheels, all they need | installed |
| horovod.txt | horovod | the Horovod sdist (built in the builder), its run-time requirements | installed |
| app.txt | app | TensorBoard, matplotlib and all they need | installed |
| app-datasets.txt | app datasets | the scikit-learn wheel the digits data set is taken from | downloaded |

Each installed lock is resolved with the locks below it as constraints (`--constraint`), so a package two layers
share has one version, and with the stack's `lock_constraints` of versions.toml (bounds a package's own requirements
leave out). The Dockerfiles install with `pip --require-hashes --no-deps -r <lock>`: no resolver runs at
build time and a file whose hash differs stops the build. Every lock starts with a header naming the command and the
digest of its inputs (`inputs_digest`: what versions.toml gives the locks of that stack x flavour); `make image` and
tests/unit/test_locks.py compare it with versions.toml, without network, and ask for `make lock` on a difference.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .common import REPO_ROOT, UserError, default_ca_bundle, log, resolve_ca_bundle
from .manifest import Config, Manifest

HASH_OPTION = "--hash=sha256:"
INPUTS_PREFIX = "# inputs sha256:"
# Horovod's sdist computes its requirements when its metadata is built: cffi unless PyTorch is disabled. The image
# builds Horovod without PyTorch and MXNet (containers/horovod/Dockerfile), so its metadata is built the same way.
HOROVOD_METADATA_ENV = {"HOROVOD_WITHOUT_PYTORCH": "1", "HOROVOD_WITHOUT_MXNET": "1"}
# PEP 517's requirements for a source tree without pyproject.toml.
LEGACY_BUILD_REQUIREMENTS = ("setuptools>=40.8.0", "wheel")


@dataclass(frozen=True)
class LockSpec:
    """One lock file: what it is resolved from, and how."""

    name: str                                   # the file's stem: <layer> or <layer>-<stage>
    layer: str
    summary: str                                # what it holds and how the Dockerfile uses it (the header's line)
    requirements: tuple[str, ...] = ()
    build_requirements_of: str = ""             # "name==version": the requirements are that sdist's build-system
    constraints: tuple[str, ...] = ()           # names of the locks resolved before this one
    overrides: tuple[str, ...] = ()
    bounds: tuple[str, ...] = ()                # versions.toml's lock_constraints (passed as a constraints file)
    no_deps: bool = False
    metadata_env: dict = field(default_factory=dict)  # environment under which sdists' metadata is built
    # Resolved from nothing else and a constraint of no other lock (an MPI wheel): its header has a digest of its own
    # inputs, so adding or bumping it leaves the other locks' bytes, and the images built from them, as they were.
    own_digest: bool = False


def lock_dir(config: Config) -> Path:
    return REPO_ROOT / config.locks


def lock_specs(config: Config) -> list[LockSpec]:
    """The locks of `config`'s stack x flavour, in the order they are resolved (each constrained by those before)."""
    v = config.versions
    tensorflow = [f"{config.tensorflow_package}=={v['tensorflow']}"]
    overrides: tuple[str, ...] = ()
    if v.get("tf_keras"):
        tensorflow.append(f"tf_keras=={v['tf_keras']}")
        if config.tensorflow_distribution != "tensorflow":
            # tf_keras requires the distribution "tensorflow", which would add the full CUDA-enabled wheel beside
            # tensorflow-cpu (the same modules: the venv grew from 1.3 GB to 2.2 GB). A marker that never holds
            # removes that requirement. Drop when tf_keras accepts tensorflow-cpu.
            overrides = ('tensorflow ; sys_platform == "never"',)
    tensorflow += [f"{name}=={version}" for name, version in sorted(config.gpu.get("wheels", {}).items())]
    return [*_core_lock_specs(config, tensorflow, overrides), *mpi_wheel_lock_specs(config)]


def mpi_wheel_lock_specs(config: Config) -> list[LockSpec]:
    """mpi-<mpi>.txt for each MPI of the configuration's OS that comes from a PyPI wheel (versions.toml `wheel`: MPI=abi
    takes the standard-ABI library of PyPI's MPICH) and has this flavour; one file per stack x flavour, whichever MPI
    the image has, as the other locks."""
    specs = []
    for mpi, spec in sorted(config.os.get("mpi", {}).items()):
        if spec.get("wheel") and config.flavor in spec.get("flavors", [config.flavor]):
            specs.append(LockSpec(f"mpi-{mpi}", "mpi", f"the {spec['wheel']} wheel that MPI={mpi}'s mpi layer takes its MPI "
                                  "library from", requirements=(f"{spec['wheel']}=={spec['package_version']}",),
                                  no_deps=True, own_digest=True))
    return specs


def _core_lock_specs(config: Config, tensorflow: list[str], overrides: tuple[str, ...]) -> list[LockSpec]:
    v = config.versions
    return [
        LockSpec("mpi-build", "mpi", "mpi4py's build requirements, installed in the mpi builder stage",
                 build_requirements_of=f"mpi4py=={v['mpi4py']}"),
        LockSpec("mpi", "mpi", "mpi4py: its binary wheel, or its sdist compiled against the image's MPI "
                 "(versions.toml: mpi4py)",
                 requirements=(f"mpi4py=={v['mpi4py']}",), no_deps=True),
        LockSpec("tensorflow", "tensorflow", "TensorFlow and every package it needs, installed in the tensorflow layer",
                 requirements=tuple(tensorflow), constraints=("mpi",), overrides=overrides,
                 bounds=config.lock_constraints),
        LockSpec("horovod", "horovod", "the Horovod sdist (compiled in the horovod builder stage) and its run-time "
                 "requirements, installed in the horovod layer",
                 requirements=(f"horovod=={v['horovod']}",), constraints=("mpi", "tensorflow"),
                 bounds=config.lock_constraints, metadata_env=HOROVOD_METADATA_ENV),
        LockSpec("app", "app", "TensorBoard, matplotlib and every package they need, installed in the app layer",
                 requirements=(f"tensorboard=={v['tensorboard']}", f"matplotlib=={v['matplotlib']}"),
                 constraints=("mpi", "tensorflow", "horovod"), bounds=config.lock_constraints),
        LockSpec("app-datasets", "app", "the scikit-learn wheel the app layer takes the digits data set from "
                 "(downloaded, not installed)",
                 requirements=(f"scikit-learn=={config.scikit_learn_digits}",), no_deps=True),
    ]


def inputs_digest(config: Config, spec: LockSpec | None = None) -> str:
    """sha256 of everything versions.toml gives the locks of `config`'s stack x flavour: requirements, Python
    version and platform, how each is resolved. Offline: the drift check. A lock with `own_digest` (`spec`) has the
    digest of its own inputs only."""
    specs = [spec] if spec is not None and spec.own_digest else [s for s in lock_specs(config) if not s.own_digest]
    inputs = {"python": config.os["python"], "platform": config.python_platform,
              "locks": [{k: v for k, v in asdict(s).items() if k not in ("summary", "own_digest")} for s in specs]}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def stale_locks(config: Config) -> list[str]:
    """The locks of `config` that are missing or were made from other inputs than versions.toml's (no network)."""
    stale = []
    for spec in lock_specs(config):
        digest = inputs_digest(config, spec)
        path = lock_dir(config) / f"{spec.name}.txt"
        recorded = ""
        if path.is_file():
            recorded = next((line[len(INPUTS_PREFIX):].strip() for line in path.read_text().splitlines()
                             if line.startswith(INPUTS_PREFIX)), "")
        if recorded != digest:
            stale.append(str(path.relative_to(REPO_ROOT)))
    return stale


def check_locks(config: Config) -> None:
    """Stop before any build when the locks of `config` are out of date with versions.toml."""
    stale = stale_locks(config)
    if stale:
        raise UserError(f"{', '.join(stale)} out of date with versions.toml (or missing): run `make lock`, review "
                        "and commit the diff")


def header(config: Config, spec: LockSpec) -> str:
    constraints = ", ".join([*(f"{name}.txt" for name in spec.constraints), *spec.bounds]) or "none"
    return (f"# GENERATED by `make lock` (tfhpc/lock.py: uv pip compile --generate-hashes) from versions.toml: "
            f"do not edit.\n"
            f"# {config.stack} stack, {config.flavor} flavour{config.arch_suffix and f', {config.arch}'}: "
            f"{spec.summary}.\n"
            f"# Python {config.os['python']} on {config.python_platform}; constraints: {constraints}.\n"
            f"{INPUTS_PREFIX} {inputs_digest(config, spec)}\n")


def _uv() -> Path:
    uv = Path(sys.executable).parent / "uv"
    if not uv.is_file():
        raise UserError(f"{uv} not found: run `make venv` (uv is pinned in requirements.txt)")
    return uv


def _tls_environment() -> dict[str, str]:
    """The environment for uv and pip: the host's CA bundle (a TLS-intercepting proxy's) as SSL_CERT_FILE."""
    environment = dict(os.environ)
    bundle = resolve_ca_bundle(default_ca_bundle())
    if bundle:
        environment["SSL_CERT_FILE"] = str(bundle)
    return environment


# Asks a source tree's build backend for its dynamic build requirements (PEP 517 get_requires_for_build_wheel), run in
# a throw-away venv that holds the static ones and `build`.
DYNAMIC_REQUIRES_PROBE = ("import build, json; "
                          "print(json.dumps(sorted(build.ProjectBuilder('.').get_requires_for_build('wheel'))))")


def sdist_build_requirements(requirement: str) -> list[str]:
    """What building a wheel from `requirement`'s sdist needs: its build-system.requires (PEP 517's legacy default
    without pyproject.toml) and what its backend adds (mpi4py's: Cython, its sdist ships no generated C)."""
    environment = _tls_environment()
    with tempfile.TemporaryDirectory(prefix="tfhpc-lock-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                   "--dest", tmp, requirement]
        if environment.get("SSL_CERT_FILE"):
            command += ["--cert", environment["SSL_CERT_FILE"]]
        if subprocess.run(command, env=environment).returncode != 0:
            raise UserError(f"cannot download the sdist of {requirement} (pip's message above): check the network "
                            "or PIP_INDEX_URL")
        (archive,) = Path(tmp).glob("*.tar.gz")
        with tarfile.open(archive) as sdist:
            sdist.extractall(tmp, filter="data")
        (source,) = [path for path in Path(tmp).iterdir() if path.is_dir()]
        pyproject = source / "pyproject.toml"
        static = list(LEGACY_BUILD_REQUIREMENTS)
        if pyproject.is_file():
            static = tomllib.loads(pyproject.read_text()).get("build-system", {}).get("requires", static)
        venv = Path(tmp) / "venv"
        steps = [[str(_uv()), "venv", "--quiet", "--seed", "--python", sys.executable, str(venv)],
                 [str(_uv()), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), *static, "build"]]
        for step in steps:
            if subprocess.run(step, env=environment).returncode != 0:
                raise UserError(f"cannot prepare the build requirements of {requirement} (uv's message above): "
                                "check the network or PIP_INDEX_URL")
        probe = subprocess.run([str(venv / "bin" / "python"), "-c", DYNAMIC_REQUIRES_PROBE], cwd=source,
                               env=environment, capture_output=True, text=True)
        if probe.returncode != 0:
            raise UserError(f"the build backend of {requirement} did not list its requirements: {probe.stderr[-300:]}")
        dynamic = json.loads(probe.stdout.strip().splitlines()[-1])
    return list(dict.fromkeys([*static, *dynamic]))


def compile_lock(config: Config, spec: LockSpec, upgrade: bool = False) -> Path:
    """Resolve `spec` with uv into locks/<stack>-<flavor>/<name>.txt (existing pins are kept unless `upgrade`)."""
    directory = lock_dir(config)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{spec.name}.txt"
    requirements = list(spec.requirements)
    if spec.build_requirements_of:
        requirements = sdist_build_requirements(spec.build_requirements_of)
    with tempfile.TemporaryDirectory(prefix="tfhpc-lock-") as tmp:
        command = [str(_uv()), "pip", "compile", "-", "--quiet", "--generate-hashes", "--no-header",
                   "--python-version", config.os["python"], "--python-platform", config.python_platform,
                   "--output-file", str(target.relative_to(REPO_ROOT))]
        for name in spec.constraints:
            command += ["--constraint", str((directory / f"{name}.txt").relative_to(REPO_ROOT))]
        bounds = Path(tmp) / "lock_constraints.txt"
        if spec.bounds:
            bounds.write_text("".join(f"{line}\n" for line in spec.bounds))
            command += ["--constraint", str(bounds)]
        if spec.overrides:
            overrides = Path(tmp) / "overrides.txt"
            overrides.write_text("".join(f"{line}\n" for line in spec.overrides))
            command += ["--override", str(overrides)]
        if spec.no_deps:
            command.append("--no-deps")
        if upgrade:
            command.append("--upgrade")
        if spec.metadata_env:
            # uv caches an sdist's metadata regardless of the environment it was built under
            command += [arg for name in spec.requirements for arg in ("--refresh-package", name.split("==")[0])]
        if os.environ.get("PIP_INDEX_URL"):
            command += ["--index-url", os.environ["PIP_INDEX_URL"]]
        environment = {**_tls_environment(), **spec.metadata_env}
        result = subprocess.run(command, input="".join(f"{line}\n" for line in requirements), text=True,
                                cwd=REPO_ROOT, env=environment)
    if result.returncode != 0:
        raise UserError(f"uv could not resolve {target.relative_to(REPO_ROOT)} (uv's message above): fix the pins "
                        "in versions.toml, or the network / PIP_INDEX_URL")
    # uv's "via" notes name the bounds' file, a temporary one: name their source instead, so that the lock is the same
    # on every run
    body = target.read_text().replace(f"-c {bounds}", "versions.toml's lock_constraints")
    target.write_text(header(config, spec) + body)
    return target


def lock_configurations(manifest: Manifest, arches: list[str] | None = None,
                        flavors: list[str] | None = None) -> list[Config]:
    """One configuration per stack x flavour x architecture that versions.toml defines (a stack without a GPU table
    has no GPU flavour, a flavour `unavailable` on an architecture is not built there); the default MPI, which changes
    no Python package. `arches`, `flavors`: only these (default: all). A selection of which versions.toml defines
    nothing (FLAVOR=gpu ARCH=arm64) is refused with the reason of its first configuration."""
    configs, refusals = [], []
    for arch in arches or manifest.arches:
        for stack in manifest.stacks:
            for flavor in flavors or manifest.flavors:
                try:
                    configs.append(manifest.config(stack, flavor, arch=arch))
                except UserError as refusal:
                    refusals.append(refusal)
    if not configs and refusals:
        raise refusals[0]
    return configs


def write_locks(manifest: Manifest, upgrade: bool = False, arches: list[str] | None = None,
                flavors: list[str] | None = None) -> list[Path]:
    written = []
    for config in lock_configurations(manifest, arches, flavors):
        log(f"locking {config.locks} (Python {config.os['python']}, {config.python_platform})")
        for spec in lock_specs(config):
            written.append(compile_lock(config, spec, upgrade))
    return written


def locked_packages(path: Path) -> dict[str, list[str]]:
    """name==version -> its sha256 hashes, for every requirement of a lock file."""
    packages: dict[str, list[str]] = {}
    current = None
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not line[0].isspace():
            current = stripped.rstrip("\\").strip()
            packages[current] = []
        elif stripped.startswith(HASH_OPTION) and current:
            packages[current].append(stripped[len(HASH_OPTION):].rstrip("\\").strip())
    return packages
