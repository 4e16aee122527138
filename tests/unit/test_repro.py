"""`make repro`'s comparison and report, on tar streams made here (no docker): what is listed, what counts as a
difference, the reason given for each, and when the check fails."""
import datetime
import importlib.util
import io
import py_compile
import tarfile

import pytest

from tfhpc import repro
from tfhpc.imagebuild import layer_inputs, layer_sources
from tfhpc.manifest import Manifest


def tar_of(files: dict[str, bytes], links: dict[str, str] | None = None) -> tarfile.TarFile:
    """A tar stream like `docker export`'s: relative names, regular files and symlinks."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for directory in ("opt", "opt/venv"):
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    buffer.seek(0)
    return tarfile.open(fileobj=buffer, mode="r|")


def pyc_bytes(tmp_path, mode: py_compile.PycInvalidationMode, mtime: int) -> bytes:
    """The .pyc py_compile writes for one source whose mtime is `mtime`."""
    import os
    source = tmp_path / "module.py"
    source.write_text("VALUE = 1\n")
    os.utime(source, (mtime, mtime))
    target = tmp_path / f"module-{mode.name}-{mtime}.pyc"
    py_compile.compile(str(source), cfile=str(target), invalidation_mode=mode, doraise=True)
    return target.read_bytes()


def test_listing_holds_files_and_symlinks_under_the_roots_only():
    tar = tar_of({"opt/venv/lib/a.py": b"a = 1\n", "opt/tfhpc/data.csv": b"1,2\n", "etc/hostname": b"x\n"},
                 {"opt/venv/bin/python": "/usr/bin/python3"})
    listing = repro.tree_listing(tar, ("/opt/venv",))
    assert sorted(listing) == ["/opt/venv/bin/python", "/opt/venv/lib/a.py"]
    assert listing["/opt/venv/lib/a.py"].digest == \
        "sha256:" + __import__("hashlib").sha256(b"a = 1\n").hexdigest()
    assert listing["/opt/venv/bin/python"].digest == "symlink:/usr/bin/python3"


def test_a_root_does_not_match_a_longer_sibling():
    listing = repro.tree_listing(tar_of({"opt/venv2/x": b"x", "opt/venv/y": b"y"}), ("/opt/venv",))
    assert list(listing) == ["/opt/venv/y"]


def test_sha256_lines_are_sorted_like_sha256sum():
    listing = repro.tree_listing(tar_of({"opt/venv/b": b"b", "opt/venv/a": b"a"}), ("/opt/venv",))
    lines = repro.sha256_lines(listing).splitlines()
    assert [line.split("  ")[1] for line in lines] == ["/opt/venv/a", "/opt/venv/b"]
    assert len(lines[0].split("  ")[0]) == 64


def test_timestamp_pycs_of_two_installs_differ_and_are_named(tmp_path):
    roots = ("/opt/venv",)
    name = "opt/venv/lib/__pycache__/module.cpython-311.pyc"
    a = repro.tree_listing(tar_of({name: pyc_bytes(tmp_path, py_compile.PycInvalidationMode.TIMESTAMP, 1000)}), roots)
    b = repro.tree_listing(tar_of({name: pyc_bytes(tmp_path, py_compile.PycInvalidationMode.TIMESTAMP, 2000)}), roots)
    result = repro.compare("tensorflow", roots, a, b)
    assert (result.files, result.identical) == (1, 0)
    assert "timestamp .pyc" in result.differences[0].reason
    assert result.unexplained == result.differences


def test_checked_hash_pycs_do_not_depend_on_the_install_time(tmp_path):
    roots = ("/opt/venv",)
    name = "opt/venv/lib/__pycache__/module.cpython-311.pyc"
    mode = py_compile.PycInvalidationMode.CHECKED_HASH
    a = repro.tree_listing(tar_of({name: pyc_bytes(tmp_path, mode, 1000)}), roots)
    b = repro.tree_listing(tar_of({name: pyc_bytes(tmp_path, mode, 2000)}), roots)
    assert a[f"/{name}"].pyc_flags == 3
    result = repro.compare("tensorflow", roots, a, b)
    assert (result.files, result.identical, result.differences) == (1, 1, [])


def test_source_date_epoch_selects_checked_hash_pycs(monkeypatch):
    """What the Dockerfiles rely on: pip compiles with py_compile's default mode, checked-hash under
    SOURCE_DATE_EPOCH."""
    spec = importlib.util.find_spec("py_compile")
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module._get_default_invalidation_mode() == module.PycInvalidationMode.TIMESTAMP
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    assert module._get_default_invalidation_mode() == module.PycInvalidationMode.CHECKED_HASH


@pytest.mark.parametrize("path, a, b, reason", [
    ("/opt/venv/x.dist-info/RECORD", b"x,sha256=1\n", b"x,sha256=2\n", "RECORD"),
    ("/opt/venv/x.so", b"abc", b"abcd", "3 / 4 bytes"),
    ("/opt/venv/x.txt", b"built 1", b"built 2", "same size"),
])
def test_each_difference_has_a_reason(path, a, b, reason):
    roots = ("/opt/venv",)
    name = path.lstrip("/")
    result = repro.compare("app", roots, repro.tree_listing(tar_of({name: a}), roots),
                           repro.tree_listing(tar_of({name: b}), roots))
    assert len(result.differences) == 1 and reason in result.differences[0].reason


def test_a_file_in_one_build_only_is_a_difference():
    roots = ("/opt/venv",)
    a = repro.tree_listing(tar_of({"opt/venv/x": b"x", "opt/venv/y": b"y"}), roots)
    b = repro.tree_listing(tar_of({"opt/venv/x": b"x"}), roots)
    result = repro.compare("app", roots, a, b)
    assert (result.files, result.identical) == (2, 1)
    assert result.differences[0].b == "(absent)" and result.differences[0].reason == "only in build a"


def test_explained_differences_pass_and_unexplained_fail(monkeypatch):
    roots = ("/opt/venv",)
    a = repro.tree_listing(tar_of({"opt/venv/stamp.txt": b"1", "opt/venv/other.txt": b"1"}), roots)
    b = repro.tree_listing(tar_of({"opt/venv/stamp.txt": b"2", "opt/venv/other.txt": b"2"}), roots)
    monkeypatch.setattr(repro, "EXPLAINED", {"*/stamp.txt": "upstream writes the build time"})
    result = repro.compare("app", roots, a, b)
    assert [(d.path, d.explained) for d in result.differences] == [("/opt/venv/other.txt", False),
                                                                    ("/opt/venv/stamp.txt", True)]
    assert result.differences[1].reason == "upstream writes the build time"
    config = Manifest().config()
    assert repro.report_json(config, [result], 1.0, "2026-01-01T00:00:00+00:00")["passed"] is False
    monkeypatch.setattr(repro, "EXPLAINED", {"*.txt": "upstream writes the build time"})
    result = repro.compare("app", roots, a, b)
    report = repro.report_json(config, [result], 1.0, "2026-01-01T00:00:00+00:00")
    assert report["passed"] is True and report["layers"]["app"]["unexplained"] == 0
    markdown = repro.report_markdown(report)
    assert "`/opt/venv/other.txt`" in markdown and "passed" in markdown


def test_identical_builds_pass_with_counts():
    roots = ("/opt/venv",)
    files = {"opt/venv/a": b"a", "opt/venv/b": b"b"}
    result = repro.compare("tensorflow", roots, repro.tree_listing(tar_of(files), roots),
                           repro.tree_listing(tar_of(files), roots))
    report = repro.report_json(Manifest().config(), [result], 2.5, "2026-01-01T00:00:00+00:00")
    assert report["passed"] is True
    assert report["layers"]["tensorflow"]["files"] == 2 and report["layers"]["tensorflow"]["identical"] == 2


def test_docker_times_with_nanoseconds():
    assert repro.docker_time("2026-11-24T16:32:24.922855914Z") == \
        datetime.datetime(2026, 11, 24, 16, 32, 24, 922855, tzinfo=datetime.timezone.utc)
    assert repro.docker_time("2026-11-24T16:32:24Z").second == 24
    with pytest.raises(ValueError):
        repro.docker_time("yesterday")


def test_only_new_unused_layer_records_are_pruned():
    started = datetime.datetime(2026, 11, 24, 22, 0, tzinfo=datetime.timezone.utc)
    records = [
        {"ID": "old", "Type": "regular", "InUse": False, "CreatedAt": "2026-11-24T21:59:59.9Z"},
        {"ID": "new", "Type": "regular", "InUse": False, "CreatedAt": "2026-11-24T22:00:01.5Z"},
        {"ID": "used", "Type": "regular", "InUse": True, "CreatedAt": "2026-11-24T22:00:01Z"},
        {"ID": "pipcache", "Type": "exec.cachemount", "InUse": False, "CreatedAt": "2026-11-24T22:00:01Z"},
    ]
    assert repro.records_made_between(records, started) == ["new"]
    assert repro.records_made_between(records, started, started + datetime.timedelta(seconds=1)) == []
    assert repro.records_made_between(records, started - datetime.timedelta(hours=1)) == ["old", "new"]


def test_layers_that_declare_source_date_epoch_get_their_own_sources_time():
    """The tensorflow and app Dockerfiles declare SOURCE_DATE_EPOCH; its value is the last commit of that layer's
    own sources, so that a script edit (app's leaf labels change) leaves the tensorflow layer's arguments alone."""
    config = Manifest().config()
    for layer in ("tensorflow", "app"):
        epoch = layer_inputs(config, layer)[1]["SOURCE_DATE_EPOCH"]
        assert epoch.isdigit()
        assert layer_sources(config, layer)[0] == f"containers/{layer}"
    assert "SOURCE_DATE_EPOCH" not in layer_inputs(config, "base")[1]


@pytest.mark.parametrize("layer", ["tensorflow", "horovod", "app"])
def test_every_pip_install_of_the_final_stage_runs_under_source_date_epoch(layer):
    """An ARG is in the environment of the RUN steps after it in its stage: every `build-pip install` of the image's
    own stage (the last FROM) must come after `ARG SOURCE_DATE_EPOCH`, or its .pyc files embed the install time."""
    text = (repro.REPO_ROOT / "containers" / layer / "Dockerfile").read_text()
    final_stage = text[text.rindex("\nFROM "):]
    installs = [index for index in range(len(final_stage)) if final_stage.startswith("build-pip install", index)]
    declared = final_stage.find("\nARG SOURCE_DATE_EPOCH")
    assert installs, f"no pip install in {layer}'s final stage"
    assert 0 <= declared < min(installs), f"{layer}: ARG SOURCE_DATE_EPOCH must precede the stage's pip installs"
