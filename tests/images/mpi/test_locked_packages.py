"""Every Python package in the image's venv comes from the lock files (locks/<stack>-<flavor>/, tfhpc/lock.py) at the
locked version, and the locks the layers installed from are in the image (/opt/tfhpc/locks) as committed."""
import json
import re

from support.stack import CONFIG, REPO_ROOT

IMAGE_LOCKS = "/opt/tfhpc/locks"
# Not from a lock: pip (and setuptools until the tensorflow lock pins one) come with the venv from Debian's python3-venv,
# tfhpc-runtime is the app layer's own package (scripts/runtime), installed from the copied source.
UNLOCKED = {"pip", "setuptools", "tfhpc-runtime"}


def normalized(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def test_image_holds_the_committed_locks(host, image_layer):
    names = host.check_output(f"ls {IMAGE_LOCKS}").split()
    assert "mpi.txt" in names
    for name in names:
        assert host.file(f"{IMAGE_LOCKS}/{name}").content_string == (REPO_ROOT / CONFIG.locks / name).read_text()


def test_every_installed_package_is_locked_at_its_version(host, image_layer):
    locked = {}
    for name in host.check_output(f"ls {IMAGE_LOCKS}").split():
        for line in host.file(f"{IMAGE_LOCKS}/{name}").content_string.splitlines():
            if line and not line[0].isspace() and not line.startswith("#"):
                package, _, version = line.rstrip(" \\").partition("==")
                locked[normalized(package)] = version
    installed = json.loads(host.check_output("/opt/venv/bin/pip list --format json --disable-pip-version-check"))
    mismatched = [f"{p['name']}=={p['version']}" for p in installed
                  if locked.get(normalized(p["name"]), p["version"]) != p["version"]]
    unlocked = [p["name"] for p in installed if normalized(p["name"]) not in set(locked) | UNLOCKED]
    assert not mismatched, f"installed at another version than locked: {mismatched}"
    assert not unlocked, f"installed without a lock: {unlocked}"
