"""The size of the test suite's checks, counted the same way before and after a refactoring (issue 27: "no check
lost"): every `assert` statement plus every call of pytest.fail / pytest.raises in the Python files below tests/.

A check moved into a shared helper counts once there, however many tests call it: compare the numbers together with
the collected test count (`pytest --collect-only -q`), which does not move.

    python -m support.count            # from tests/: the total and the count per file
    python tests/support/count.py      # from the checkout's root
"""
import ast
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
PYTEST_CHECKS = {"fail", "raises"}


def checks_in(source):
    """How many assert statements and pytest.fail/pytest.raises calls the Python source holds."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assert):
            count += 1
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PYTEST_CHECKS
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "pytest"):
            count += 1
    return count


def count(root=TESTS):
    """{path relative to root: checks} for every .py file below root that holds at least one check."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        checks = checks_in(path.read_text())
        if checks:
            found[str(path.relative_to(root))] = checks
    return found


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    found = count(Path(argv[0]) if argv else TESTS)
    for path, checks in found.items():
        print(f"{checks:6d}  {path}")
    print(f"{sum(found.values()):6d}  total in {len(found)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
