"""What the README and docs/development.md state about the tree holds: the number of job scripts the README names in
words, every test directory in the README's layout, every module of tfhpc/ in development.md's module table."""
import re

from tfhpc import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
DEVELOPMENT = (REPO_ROOT / "docs" / "development.md").read_text()
NUMBERS = {word: value for value, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split())}


def test_the_number_of_job_scripts_the_readme_states():
    stated = re.findall(r"\b(\w+) job scripts\b", README, re.I)
    actual = len(list((REPO_ROOT / "scripts" / "slurm").glob("*.sbatch")))
    counts = [NUMBERS[word.lower()] for word in stated if word.lower() in NUMBERS]
    assert counts, "the README no longer says how many job scripts there are: say it, or drop this test"
    assert set(counts) == {actual}, f"README states {counts} job scripts, scripts/slurm has {actual}"


def test_every_test_directory_is_in_the_readme_layout():
    layout = README[README.index("- `tests/`:"):].split("\n- ", 1)[0]
    directories = sorted(path.name for path in (REPO_ROOT / "tests").iterdir()
                         if path.is_dir() and not path.name.startswith((".", "_")))
    missing = [name for name in directories if f"`{name}/" not in layout]
    assert not missing, f"README's layout of tests/ leaves out {missing}"


def test_every_tfhpc_module_is_in_the_development_module_table():
    modules = sorted(path.name for path in (REPO_ROOT / "tfhpc").glob("*.py")
                     if path.name not in ("__init__.py", "__main__.py"))
    table = "\n".join(line for line in DEVELOPMENT.splitlines() if line.startswith("| `"))
    missing = [name for name in modules if f"`{name}`" not in table]
    assert not missing, f"docs/development.md's module table leaves out {missing}"
