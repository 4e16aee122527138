"""The machine's cache of what is derived from an image id (tfhpc/cache.py): an entry is whole or absent, is found
by every input of its key, lives outside any checkout, and `make clean` drops the entries of removed images."""
import os

from tfhpc import cache


def test_location_follows_tfhpc_cache_then_xdg_then_home(tmp_path):
    assert cache.cache_root({"TFHPC_CACHE": str(tmp_path)}) == tmp_path
    assert cache.cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "tfhpc"
    assert cache.cache_root({}).parts[-2:] == (".cache", "tfhpc")


def test_key_changes_with_every_input():
    base = cache.key("sif", "sha256:aa", definition="d", compression="zstd")
    assert base == cache.key("sif", "sha256:aa", compression="zstd", definition="d")
    others = {cache.key("sif", "sha256:ab", definition="d", compression="zstd"),
              cache.key("sif", "sha256:aa", definition="e", compression="zstd"),
              cache.key("sif", "sha256:aa", definition="d", compression="gzip"),
              cache.key("sbom", "sha256:aa", definition="d", compression="zstd")}
    assert base not in others and len(others) == 4


def test_store_then_fetch_into_another_checkout(tmp_path):
    root, source = tmp_path / "cache", tmp_path / "one" / "a.sif"
    source.parent.mkdir()
    source.write_bytes(b"squashfs")
    cache.store("sif-1", "sha256:aa", {"image.sif": source}, root=root)
    target = tmp_path / "two" / "build" / "a.sif"
    assert cache.fetch("sif-1", {"image.sif": target}, root=root)
    assert target.read_bytes() == b"squashfs"
    assert os.stat(target).st_ino == os.stat(source).st_ino  # linked, not copied, on one file system


def test_an_entry_missing_a_file_places_nothing(tmp_path):
    root, source = tmp_path / "cache", tmp_path / "record.json"
    source.write_text("{}")
    cache.store("sif-1", "sha256:aa", {"record.json": source}, root=root)
    wanted = {"record.json": tmp_path / "out" / "record.json", "image.sif": tmp_path / "out" / "image.sif"}
    assert not cache.fetch("sif-1", wanted, root=root)
    assert not (tmp_path / "out").exists()
    assert not cache.fetch("sif-2", {"record.json": tmp_path / "x"}, root=root)


def test_an_unwritable_cache_is_passed_over(tmp_path, capsys):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    source = tmp_path / "record.json"
    source.write_text("{}")
    cache.store("sif-1", "sha256:aa", {"record.json": source}, root=blocker / "cache")
    assert "not kept" in capsys.readouterr().err


def test_prune_keeps_the_entries_of_known_images_only(tmp_path):
    root, source = tmp_path / "cache", tmp_path / "f"
    source.write_text("x")
    cache.store("probe-kept", "sha256:kept", {"f": source}, root=root)
    cache.store("probe-gone", "sha256:gone", {"f": source}, root=root)
    (root / ".probe-interrupted.123").mkdir()
    assert cache.prune({"sha256:kept"}, root=root) == 2
    assert sorted(path.name for path in root.iterdir()) == ["probe-kept"]
    assert cache.prune(set(), root=tmp_path / "absent") == 0
