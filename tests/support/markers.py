"""The markers (pytest.ini: image, sif, cluster, network) that say what a test directory needs, put on its tests by
its conftest's pytest_collection_modifyitems: `make test` and CI select and skip whole directories by them, so the
directory, not each test module, decides."""
from pathlib import Path


def mark_directory(items, conftest_file, *marks, except_modules=()):
    """Add `marks` to every collected item below the directory of `conftest_file` (pytest hands each conftest's hook
    the items of the whole session), except those of the test modules named in `except_modules` (basenames)."""
    here = Path(conftest_file).parent
    for item in items:
        path = Path(item.fspath)
        if here in path.parents and path.name not in except_modules:
            for mark in marks:
                item.add_marker(mark)
