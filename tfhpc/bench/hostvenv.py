"""The host virtual environment the benchmark compares the container with: the image's own /opt/venv (TensorFlow,
tf_keras, Horovod as containers/ builds them), exported from the horovod layer into build/bench/host-venv and run
with the host's python and MPI, which must be the Debian packages the image has. Exported once (a minute) and reused
while its stamp matches the configuration and the image."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import docker.errors

from ..common import REPO_ROOT, UserError
from ..dockerhost import client
from ..manifest import Config

HOST_VENV = REPO_ROOT / "build" / "bench" / "host-venv"
IMAGE_VENV = "/opt/venv"  # containers/base/Dockerfile
STAMP = "tfhpc-host-venv.json"
# The image's python3 is Debian's; the host's /usr/bin/python3 is the same package on a Debian host of the same
# release (a pyenv or conda python on the PATH would not be).
HOST_PYTHON = "/usr/bin/python3"
# Debian package whose version must equal the pinned MPI version: the runtime Horovod and mpi4py were linked with.
MPI_PACKAGE = {"openmpi": "openmpi-bin", "mpich": "mpich"}


def stamp(config: Config, image_id: str) -> dict:
    """What the venv was exported from; a different stamp means export again."""
    return {"image": config.image("horovod"), "image_id": image_id, "python": HOST_PYTHON}


def _image_id(config: Config) -> str | None:

    try:
        return client().images.get(config.image("horovod")).id
    except docker.errors.ImageNotFound:
        return None


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
    """Why this host cannot run the image's venv like the image does (empty: it can)."""
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
    package = MPI_PACKAGE[config.mpi]
    want = config.os["mpi"][config.mpi]["package_version"]
    have = _dpkg_version(package)
    if have != want:
        problems.append(f"{package} is {have or 'not installed'} on the host, the image has {want}: "
                        f"apt-get install $(containers/mpi/mpi-packages {config.mpi} {want} runtime)")
    return problems


def ready(config: Config, path: Path = HOST_VENV) -> bool:
    image_id = _image_id(config)
    try:
        return image_id is not None and json.loads((path / STAMP).read_text()) == stamp(config, image_id)
    except (OSError, ValueError):
        return False


def build(config: Config, log, path: Path = HOST_VENV) -> Path:
    """Export the image's venv to `path` (or keep it, when its stamp matches the image)."""
    if ready(config, path):
        return path
    image_id = _image_id(config)
    if image_id is None:
        raise UserError(f"{config.image('horovod')} is not built: run `make image` first")
    problems = host_problems(config)
    if problems:
        raise UserError("cannot run the image's venv on this host: " + "; ".join(problems))
    # The stamp is written last, so an interrupted export is never taken for a usable one.
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    log(f"host venv: exporting {IMAGE_VENV} of {config.image('horovod')} to {path}")
    container = client().containers.create(image_id, ["true"])
    try:
        stream, _ = container.get_archive(IMAGE_VENV)
        archive = io.BytesIO(b"".join(stream))
    finally:
        container.remove(force=True)
    with tarfile.open(fileobj=archive) as handle:
        handle.extractall(path.parent / ".host-venv-export", filter="tar")
    (path.parent / ".host-venv-export" / Path(IMAGE_VENV).name).rename(path)
    (path.parent / ".host-venv-export").rmdir()
    # Scripts name their interpreter by absolute path (#!/opt/venv/bin/python): point them at the exported venv.
    for script in (path / "bin").iterdir():
        if script.is_file() and not script.is_symlink():
            head = script.read_bytes()[:len(IMAGE_VENV) + 3]
            if head.startswith(f"#!{IMAGE_VENV}/".encode()):
                script.write_bytes(script.read_bytes().replace(f"#!{IMAGE_VENV}/".encode(), f"#!{path}/".encode(), 1))
    done = subprocess.run([str(path / "bin" / "python"), "-c",
                           "import horovod.tensorflow as hvd; assert hvd.mpi_built() and hvd.gloo_built()"],
                          capture_output=True, text=True,
                          env={**os.environ, "TF_USE_LEGACY_KERAS": config.build_args()["TF_USE_LEGACY_KERAS"]})
    if done.returncode != 0:
        raise UserError(f"the exported venv does not import Horovod on this host: {done.stderr.strip()[-300:]}")
    (path / STAMP).write_text(json.dumps(stamp(config, image_id), indent=2) + "\n")
    return path


if __name__ == "__main__":  # python -m tfhpc.bench.hostvenv: export it alone
    from ..manifest import Manifest
    print(build(Manifest().config(), lambda m: print(m, file=sys.stderr, flush=True)))
