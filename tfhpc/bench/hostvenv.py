"""The host virtual environment the benchmark compares the container with: the same TensorFlow, tf_keras and
Horovod (same patches, same build switches as containers/horovod/Dockerfile), compiled on the host against the
host's Debian MPI of the version versions.toml pins. Built once into build/bench/host-venv (6-10 min: Horovod
compiles) and reused while its stamp matches the configuration."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .. import REPO_ROOT, UserError
from ..manifest import Config

HOST_VENV = REPO_ROOT / "build" / "bench" / "host-venv"
STAMP = "tfhpc-host-venv.json"
PATCH_DIR = REPO_ROOT / "containers" / "horovod" / "patches"
# The image's python3 is Debian's; the host's /usr/bin/python3 is the same package on a Debian host of the same
# release (a pyenv or conda python on the PATH would not be).
HOST_PYTHON = "/usr/bin/python3"
# Debian package whose version must equal the pinned MPI version (the development files Horovod compiles against).
MPI_DEV_PACKAGE = {"openmpi": "libopenmpi-dev", "mpich": "libmpich-dev"}


def stamp(config: Config) -> dict:
    """What the venv must have been built from; a different stamp means rebuild."""
    return {"tensorflow_package": config.tensorflow_package, "versions": config.versions,
            "horovod_patches": list(config.horovod_patches), "mpi": config.mpi,
            "mpi_package_version": config.os["mpi"][config.mpi]["package_version"], "python": HOST_PYTHON}


def _os_release() -> dict:
    try:
        lines = Path("/etc/os-release").read_text().splitlines()
    except OSError:
        return {}
    return {k: v.strip('"') for k, _, v in (line.partition("=") for line in lines) if k}


def _dpkg_version(package: str) -> str | None:
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Status} ${Version}", package],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = out.stdout.split()
    return words[-1] if out.returncode == 0 and "installed" in words else None


def host_problems(config: Config) -> list[str]:
    """Why this host cannot hold a like-for-like venv (empty: it can)."""
    problems = []
    release = _os_release()
    if release.get("VERSION_CODENAME") != config.os_release:
        problems.append(f"the host is {release.get('PRETTY_NAME', 'not Debian')}, the image {config.os_release}")
    try:
        version = subprocess.run([HOST_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=60).stdout.strip()
    except OSError:
        version = ""
    if version != config.os["python"]:
        problems.append(f"{HOST_PYTHON} is {version or 'missing'}, the image's python {config.os['python']}")
    package = MPI_DEV_PACKAGE[config.mpi]
    want = config.os["mpi"][config.mpi]["package_version"]
    have = _dpkg_version(package)
    if have != want:
        problems.append(f"{package} is {have or 'not installed'} on the host, the image has {want}: "
                        f"apt-get install $(containers/mpi/mpi-packages {config.mpi} {want} dev)")
    for tool in ("cmake", "g++", "patch"):
        if not shutil.which(tool):
            problems.append(f"{tool} is missing on the host (apt-get install build-essential cmake patch)")
    return problems


def ready(config: Config, path: Path = HOST_VENV) -> bool:
    try:
        return json.loads((path / STAMP).read_text()) == stamp(config)
    except (OSError, ValueError):
        return False


def _run(cmd: list[str], log, **kwargs) -> None:
    log("host venv: " + " ".join(cmd))
    status = subprocess.call(cmd, **kwargs)
    if status != 0:
        raise UserError(f"building the host venv failed at `{' '.join(cmd)}` (exit {status}, output above)")


def build(config: Config, log, path: Path = HOST_VENV) -> Path:
    """Build the venv (or keep it, when its stamp matches the configuration)."""
    if ready(config, path):
        return path
    problems = host_problems(config)
    if problems:
        raise UserError("cannot build a host venv like the image's: " + "; ".join(problems))
    # A venv is not relocatable (absolute paths in its scripts), so it is built in place; the stamp is written last,
    # so an interrupted build is never taken for a usable one and is rebuilt from scratch next time.
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    target = path
    v = config.versions
    _run([HOST_PYTHON, "-m", "venv", str(target)], log)
    pip = [str(target / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    env = {**os.environ, "TF_USE_LEGACY_KERAS": config.build_args()["TF_USE_LEGACY_KERAS"]}
    # pip and setuptools stay as the venv module made them, as in the image (whose Horovod build adds only wheel).
    _run([*pip, "wheel"], log)
    _run([*pip, f"{config.tensorflow_package}=={v['tensorflow']}"], log)
    if v.get("tf_keras"):
        # --no-deps as in the image: tf_keras requires "tensorflow", which would add the CUDA wheel over -cpu.
        _run([*pip, "--no-deps", f"tf_keras=={v['tf_keras']}"], log)
    with tempfile.TemporaryDirectory(prefix="tfhpc-horovod-src-") as tmp:
        _run([str(target / "bin" / "python"), "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
              "--dest", tmp, f"horovod=={v['horovod']}"], log)
        archive = next(Path(tmp).glob("horovod-*.tar.gz"))
        with tarfile.open(archive) as handle:
            handle.extractall(tmp, filter="data")
        source = next(p for p in Path(tmp).iterdir() if p.is_dir())
        for patch in config.horovod_patches:
            _run(["patch", "-p1", "-i", str(PATCH_DIR / patch)], log, cwd=source)
        # The image's build switches (containers/horovod/Dockerfile), against the host's MPI.
        build_env = {**env, "HOROVOD_WITH_TENSORFLOW": "1", "HOROVOD_WITH_MPI": "1", "HOROVOD_WITH_GLOO": "1",
                     "HOROVOD_WITHOUT_PYTORCH": "1", "HOROVOD_WITHOUT_MXNET": "1",
                     "MAKEFLAGS": f"-j{os.cpu_count() or 1}"}
        _run([*pip, "--no-build-isolation", str(source)], log, env=build_env)
    _run([str(target / "bin" / "python"), "-c",
          "import horovod.tensorflow as hvd; assert hvd.mpi_built() and hvd.gloo_built(), 'Horovod lacks MPI or Gloo'"],
         log, env=env)
    (target / STAMP).write_text(json.dumps(stamp(config), indent=2) + "\n")
    return target


if __name__ == "__main__":  # python -m tfhpc.bench.hostvenv: build it alone
    from ..manifest import Manifest
    print(build(Manifest().config(), lambda m: print(m, file=sys.stderr, flush=True)))
