"""What every tfhpc module uses: the checkout's root, the one-line user error, the log line, the CA bundle for builds,
file digests, the git revision and the source date."""
from __future__ import annotations

import datetime
import hashlib
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


class UserError(Exception):
    """A problem the user can fix; printed as one line with the fix, exit status 2."""


def log(message: str) -> None:
    print(f"tfhpc: {message}", file=sys.stderr, flush=True)


def default_ca_bundle() -> str:
    """CA_BUNDLE, else the bundle this host's pip or TLS clients are told to use (a proxying site sets one)."""
    for variable in ("CA_BUNDLE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        if os.environ.get(variable):
            return os.environ[variable]
    return "none"


def resolve_ca_bundle(value: str | None) -> Path | None:
    """CA_BUNDLE: a PEM file handed to apt and pip during the build only; 'none' or empty: no bundle."""
    if not value or value.lower() == "none":
        return None
    path = Path(value).expanduser()
    if not path.is_file() or path.stat().st_size == 0:
        raise UserError(f"CA_BUNDLE={value}: no such file or empty: give a PEM bundle's path, or CA_BUNDLE=none")
    return path.resolve()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_atomically(path: Path, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file renamed over it: the file is whole or absent, never half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)
    return path


# What the images are built from (the build context is containers/, locks/ and scripts/, .dockerignore; the build
# arguments come from versions.toml): the leaf image's revision and creation labels name the last commit that changed one of
# them, so a commit elsewhere (docs, tests, tooling) leaves the image id, and the SIF converted from it, as they are.
IMAGE_SOURCES = ("containers", "examples", "locks", "scripts", "versions.toml")


def _last_image_commit(sources: tuple[str, ...] = IMAGE_SOURCES) -> tuple[str, str]:
    """(full hash, commit time in seconds) of the last commit that changed `sources` (git pathspecs), or ("", "")."""
    try:
        line = subprocess.run(["git", "-C", str(REPO_ROOT), "log", "-1", "--format=%H %ct", "HEAD", "--",
                               *sources], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        line = ""
    commit, _, committed = line.partition(" ")
    return commit, committed


def git_head() -> tuple[str, bool]:
    """(full hash of HEAD, whether IMAGE_SOURCES differ from it), or ("", False) outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        changed = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", *IMAGE_SOURCES],
                                 capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "", False
    return head, bool(head and changed)


def git_revision() -> str:
    """The last commit (12 hex digits) that changed what the images are built from (IMAGE_SOURCES), or "" outside a
    git checkout."""
    return _last_image_commit()[0][:12]


# The creation time of an image built outside a git checkout without SOURCE_DATE_EPOCH: fixed, so that an unchanged
# tree still rebuilds to the same image id (reproducible-builds.org's SOURCE_DATE_EPOCH = 0).
FALLBACK_SOURCE_EPOCH = 0


def source_epoch(environ: dict[str, str] | None = None, sources: tuple[str, ...] = IMAGE_SOURCES) -> int:
    """The image creation time in seconds since 1970, taken from the source, never from the clock, so that a warm
    rebuild of an unchanged tree gives the same image ids: SOURCE_DATE_EPOCH when set, else the time of the last commit
    that changed `sources` (also for a tree with uncommitted changes), else FALLBACK_SOURCE_EPOCH."""
    environ = os.environ if environ is None else environ
    value = environ.get("SOURCE_DATE_EPOCH", "").strip()
    if value:
        if not value.isdigit():
            raise UserError(f"SOURCE_DATE_EPOCH={value}: not a number of seconds since 1970: give an integer or unset it")
        return int(value)
    committed = _last_image_commit(sources)[1]
    return int(committed) if committed.isdigit() else FALLBACK_SOURCE_EPOCH


def source_date(environ: dict[str, str] | None = None) -> str:
    """source_epoch() as ISO 8601, UTC: the leaf image's org.opencontainers.image.created label."""
    return datetime.datetime.fromtimestamp(source_epoch(environ), datetime.timezone.utc).isoformat(timespec="seconds")
