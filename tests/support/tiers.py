"""The suite's two tiers (docs/testing.md#two-tiers). `make test` (TFHPC_TIER=test, what CI runs) proves every
behaviour once; `make test-full` (TFHPC_TIER=full, also any pytest run without the variable) adds the tests whose
behaviour the `test` tier already proves by another test, each marked with the reason:

- `@pytest.mark.full("...")`: in the full tier only; the reason names what in the test tier proves the same code;
- `@pytest.mark.patch_reversal`: a patch reversed to show a user script fails without it. Full tier, and the test
  tier too whenever the patch set or its package's pin differs from the one the last passing full run recorded
  (PROVEN_PATCHES, written by that run: commit it with the change);
- the image tests of tests/images/<layer> run on the leaf image in the test tier, on every image built on <layer> in
  the full tier (tests/images/conftest.py).

Deselected tests are reported as deselected, never as skipped or passed."""
import hashlib
import os
import re
import tomllib

from support.patches import HOROVOD_PATCHES, KERAS_PATCHES
from support.stack import CONFIG, MANIFEST, REPO_ROOT

TIERS = ("test", "full")
TIER = os.environ.get("TFHPC_TIER") or "full"
# config tag -> digest of the patch set whose reversal tests last passed in a full run of that configuration.
PROVEN_PATCHES = REPO_ROOT / "tests" / "proven-patches.toml"


def check_tier():
    """The tier asked for, or a one-line error naming the valid ones."""
    if TIER not in TIERS:
        raise ValueError(f"TFHPC_TIER={TIER}: not one of {', '.join(TIERS)}: use `make test` or `make test-full`")
    return TIER


def patch_set_digest(config=CONFIG):
    """sha256 over what the patch reversal tests prove: each listed patch's name and bytes, the Horovod pin and the
    Keras 3 the tensorflow lock installs (the package the Keras patches apply to)."""
    digest = hashlib.sha256()
    for directory, names in ((KERAS_PATCHES, config.keras_patches), (HOROVOD_PATCHES, config.horovod_patches)):
        for name in names:
            digest.update(name.encode() + b"\0" + (directory / name).read_bytes() + b"\0")
    digest.update(f"horovod=={config.versions['horovod']}\0".encode())
    lock = REPO_ROOT / config.locks / "tensorflow.txt"
    keras = re.search(r"^keras==\S+", lock.read_text(), re.MULTILINE) if lock.is_file() else None
    digest.update((keras.group(0) if keras else "no keras").encode())
    return digest.hexdigest()


def proven_digests():
    return tomllib.loads(PROVEN_PATCHES.read_text()) if PROVEN_PATCHES.is_file() else {}


def patches_proven(config=CONFIG):
    """True when a full run of this configuration recorded the current patch set's reversal tests as passed."""
    return proven_digests().get(config.tag) == patch_set_digest(config)


def record_proven_patches(config=CONFIG):
    """After a full run whose patch reversal tests all passed: this configuration's digest into PROVEN_PATCHES (the
    other configurations' entries kept, sorted; written whole, then renamed)."""
    digests = {**proven_digests(), config.tag: patch_set_digest(config)}
    text = ("# Written by `make test-full` when every patch reversal test of a configuration passed (tests/support/"
            "tiers.py):\n# `make test` runs those tests itself while a configuration's patch set differs from this.\n"
            + "".join(f'"{tag}" = "{digest}"\n' for tag, digest in sorted(digests.items())))
    partial = PROVEN_PATCHES.with_suffix(".toml.partial")
    partial.write_text(text)
    os.replace(partial, PROVEN_PATCHES)


def deselected_reason(item, tier=TIER, proven=None):
    """Why `item` is not run in `tier` (None: it runs)."""
    if tier == "full":
        return None
    full = item.get_closest_marker("full")
    if full is not None:
        return full.args[0] if full.args else "full tier"
    if item.get_closest_marker("patch_reversal") is not None:
        if proven if proven is not None else patches_proven():
            return "patch reversal of a patch set a full run proved"
    layer = getattr(item, "callspec", None) and item.callspec.params.get("image_layer")
    if layer and layer != MANIFEST.layers.leaf:
        return f"an image test on the {layer} layer: the test tier runs it on the {MANIFEST.layers.leaf} image"
    return None
