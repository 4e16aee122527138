"""The docker engine (through the docker SDK) and a docker CLI able to run BuildKit builds.

Builds go through the CLI because only BuildKit mounts secrets (the proxy CA bundle, a private index URL) into a
RUN step without writing them to a layer; the SDK's build API is the legacy builder. Everything else (inspect, tag,
run, prune) uses the SDK, so no human-readable CLI output is parsed.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass

from .common import UserError

START_HINT = "start it with 'systemctl start docker' (or 'dockerd &' as root), or install Debian's docker.io"


@functools.lru_cache(maxsize=1)
def client():
    try:
        import docker  # here: a venv without the SDK gets the one-line error below
    except ImportError:
        raise UserError("the docker Python SDK is missing: run 'make venv' (or pip install -r requirements.txt)") from None
    try:
        engine = docker.from_env(timeout=600)
        engine.ping()
    except Exception as error:  # the SDK raises DockerException, requests' errors or FileNotFoundError
        raise UserError(f"docker daemon unreachable ({type(error).__name__}): {START_HINT}") from None
    return engine


@dataclass(frozen=True)
class BuildCli:
    """How to call `docker build` with BuildKit: argv prefix and extra environment."""

    argv: tuple[str, ...]
    env: dict

    def run(self, args: list[str]) -> int:
        return subprocess.call([*self.argv, *args], env={**os.environ, **self.env})


def _client_version(path: str) -> tuple[int, ...]:
    try:
        out = subprocess.run([path, "version", "--format", "{{.Client.Version}}"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        return tuple(int(part) for part in out.split("+")[0].split("~")[0].split(".")[:2])
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return ()


def _has_buildx(path: str) -> bool:
    try:
        return subprocess.run([path, "buildx", "version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.lru_cache(maxsize=1)
def build_cli() -> BuildCli:
    """A docker client that builds with BuildKit: `docker buildx build --load`, or a pre-23 client with
    DOCKER_BUILDKIT=1 (Debian 12's docker.io 20.10). A client >= 23 without buildx cannot use BuildKit."""
    candidates = []
    for path in (os.environ.get("DOCKER") or shutil.which("docker"), "/usr/bin/docker"):
        if path and path not in candidates and os.access(path, os.X_OK):
            candidates.append(path)
    for path in candidates:
        if _has_buildx(path):
            return BuildCli((path, "buildx", "build", "--load"), {})
    for path in candidates:
        version = _client_version(path)
        if version and version < (23,):
            return BuildCli((path, "build"), {"DOCKER_BUILDKIT": "1"})
    raise UserError("no docker client can build with BuildKit: install the buildx plugin (docker-buildx) "
                    "or Debian's docker.io (its /usr/bin/docker 20.10 builds with DOCKER_BUILDKIT=1)")
