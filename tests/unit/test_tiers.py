"""The two tiers (tests/support/tiers.py): which tests `make test` leaves to `make test-full`, and the record of
proven patch sets that brings the patch reversals back into `make test` when a patch or its package's pin changes."""
import dataclasses

import pytest

from support import tiers
from support.stack import CONFIG, MANIFEST


class Item:
    """What deselected_reason reads of a collected test: its markers and its parametrisation."""

    def __init__(self, markers=(), image_layer=None):
        self.markers = {mark.name: mark for mark in markers}
        if image_layer is not None:
            self.callspec = type("CallSpec", (), {"params": {"image_layer": image_layer}})()

    def get_closest_marker(self, name):
        return self.markers.get(name)


FULL = pytest.mark.full("proven by test_x").mark
REVERSAL = pytest.mark.patch_reversal.mark


@pytest.mark.parametrize("item, proven, reason", [
    (Item(), False, None),
    (Item([FULL]), False, "proven by test_x"),
    (Item([REVERSAL]), False, None),
    (Item([REVERSAL]), True, "patch reversal of a patch set a full run proved"),
    (Item(image_layer=MANIFEST.layers.leaf), False, None),
    (Item(image_layer="mpi"), False, f"an image test on the mpi layer: the test tier runs it on the {MANIFEST.layers.leaf} image"),
])
def test_the_test_tier_leaves_out_what_the_table_says_and_the_full_tier_nothing(item, proven, reason):
    assert tiers.deselected_reason(item, "test", proven) == reason
    assert tiers.deselected_reason(item, "full", proven) is None


def test_the_patch_set_digest_follows_every_patch_and_the_pins(monkeypatch, tmp_path):
    digest = tiers.patch_set_digest(CONFIG)
    assert digest == tiers.patch_set_digest(CONFIG)
    if not CONFIG.horovod_patches:
        pytest.fail(f"{CONFIG.tag} lists no Horovod patch: choose a stack that does")
    copy = tmp_path / "horovod"
    copy.mkdir()
    for name in CONFIG.horovod_patches:
        (copy / name).write_bytes((tiers.HOROVOD_PATCHES / name).read_bytes())
    monkeypatch.setattr(tiers, "HOROVOD_PATCHES", copy)
    assert tiers.patch_set_digest(CONFIG) == digest
    first = copy / CONFIG.horovod_patches[0]
    first.write_bytes(first.read_bytes() + b"\n")
    assert tiers.patch_set_digest(CONFIG) != digest
    monkeypatch.setattr(tiers, "HOROVOD_PATCHES", tiers.REPO_ROOT / "containers" / "horovod" / "patches")
    bumped = dataclasses.replace(CONFIG, versions={**CONFIG.versions, "horovod": "9.9.9"})
    assert tiers.patch_set_digest(bumped) != digest


def test_a_recorded_patch_set_is_proven_until_it_changes(monkeypatch, tmp_path):
    monkeypatch.setattr(tiers, "PROVEN_PATCHES", tmp_path / "proven-patches.toml")
    assert not tiers.patches_proven(CONFIG)
    (tmp_path / "proven-patches.toml").write_text('"other-tag" = "abc"\n')
    tiers.record_proven_patches(CONFIG)
    assert tiers.patches_proven(CONFIG)
    assert tiers.proven_digests()["other-tag"] == "abc"
    assert not list(tmp_path.glob("*.partial"))
    monkeypatch.setattr(tiers, "patch_set_digest", lambda config: "changed")
    assert not tiers.patches_proven(CONFIG)


def test_an_unknown_tier_is_one_line_naming_the_make_targets(monkeypatch):
    monkeypatch.setattr(tiers, "TIER", "quick")
    with pytest.raises(ValueError, match=r"^TFHPC_TIER=quick: not one of test, full: use `make test` or `make test-full`$"):
        tiers.check_tier()


def test_every_module_with_a_full_tier_test_is_in_the_behaviour_table():
    table = (tiers.REPO_ROOT / "docs" / "testing.md").read_text().split("## Two tiers", 1)[1].split("\n## ", 1)[0]
    marked = sorted(path.relative_to(tiers.REPO_ROOT).as_posix() for path in (tiers.REPO_ROOT / "tests").rglob("test_*.py")
                    if "pytest.mark.full(" in path.read_text() or "mark.patch_reversal" in path.read_text())
    assert marked, "no full-tier test found: the markers moved?"
    missing = [path for path in marked if path.split("/")[-1] not in table]
    assert not missing, f"docs/testing.md's tier table does not name {missing}"
