"""Facts the docs state that the code decides, checked against the code so that a stale one fails here: the registry
tag examples, the module and support lists of docs/development.md, the host dependencies against requirements.txt,
the `python -m tfhpc` commands the README names, `make help`'s defaults, the job scripts and the variables each reads,
the MPI and OS versions named against versions.toml, every TFHPC_* environment variable against docs/environment.md,
and the commands of docs/getting-started.md against what the image ships."""
import re
import subprocess
import tomllib

import pytest

from tfhpc import REPO_ROOT, UserError
from tfhpc.manifest import upstream_version
from tfhpc.publish import version_tag

DOCS = REPO_ROOT / "docs"
README = (REPO_ROOT / "README.md").read_text()
DEVELOPMENT = (DOCS / "development.md").read_text()
SITE_GUIDE = (DOCS / "site-guide.md").read_text()
GETTING_STARTED = (DOCS / "getting-started.md").read_text()
ENVIRONMENT = (DOCS / "environment.md").read_text()
JOB_SCRIPTS = sorted((REPO_ROOT / "scripts" / "slurm").glob("*.sbatch"))
TFHPC_VARIABLE = re.compile(r"\bTFHPC_[A-Z0-9_]*[A-Z0-9]\b")
VERSION_TAG = re.compile(r"\btf\d+\.\d+-hvd[\d.]+-[a-z]+\d+\.\d+-(?:cpu|gpu)(?:-cuda\d+\.\d+)?\b")
# Pages written by hand (measurements.md is generated from records.toml, which is checked through its own text).
PAGES = {path.name: path.read_text() for path in [REPO_ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
         if path.name != "measurements.md"}


def section(text, heading):
    """The text under a Markdown heading, up to the next heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    start = text.index(heading + "\n")
    end = re.compile(rf"^#{{1,{level}}} ", re.M).search(text, start + len(heading))
    return text[start:end.start() if end else len(text)]


def table_rows(text):
    return [line for line in text.splitlines() if line.startswith("| `")]


def configurations(manifest):
    for stack in manifest.stacks:
        for flavor in manifest.flavors:
            for mpi in ("openmpi", "mpich", "abi"):
                try:
                    yield manifest.config(stack, flavor, mpi)
                except UserError:  # a stack without this flavour or MPI
                    continue


def test_tag_examples_are_tags_the_code_makes(manifest):
    made = {version_tag(config) for config in configurations(manifest)}
    for name, text in PAGES.items():
        stale = sorted(set(VERSION_TAG.findall(text)) - made)
        assert not stale, f"{name} shows tags the code does not make: {stale} (tfhpc/publish.py makes {sorted(made)})"
    default = version_tag(manifest.config())
    row = next(line for line in PAGES["publishing.md"].splitlines() if line.startswith("| versioned |"))
    assert f"`{default}`" in row, f"publishing.md's example of the default stack's versioned tag is not {default}"


@pytest.mark.parametrize("folder, heading", [
    ("tfhpc", "## Host tooling: `tfhpc/`"),
    ("scripts/runtime/tfhpc_runtime", "## In the image: `scripts/` and `tfhpc_runtime`"),
    ("tests/support", "## Tests: `tests/`"),
    ("tfhpc/bench", "## Host tooling: `tfhpc/`"),
])
def test_every_module_is_in_development_md(folder, heading):
    described = section(DEVELOPMENT, heading)
    modules = sorted(path.name for path in (REPO_ROOT / folder).glob("*.py")
                     if path.name not in ("__init__.py", "__main__.py"))
    missing = [name for name in modules if f"`{name}`" not in described]
    assert not missing, f"docs/development.md ({heading}) leaves out {folder}/{missing}"


def test_every_bench_section_is_in_development_md():
    row = next(line for line in DEVELOPMENT.splitlines() if line.startswith("| `bench/` |"))
    sections = sorted(path.stem for path in (REPO_ROOT / "tfhpc" / "bench" / "sections").glob("*.py")
                      if path.name != "__init__.py")
    missing = [name for name in sections if f"`{name}`" not in row]
    assert not missing, f"docs/development.md's bench row leaves out the sections {missing}"


def test_modules_development_md_names_exist():
    named = set(re.findall(r"`(\w+)\.py`", DEVELOPMENT))
    existing = {path.stem for folder in ("tfhpc", "tfhpc/bench", "scripts/runtime/tfhpc_runtime", "tests/support",
                                         "scripts", "scripts/train", "scripts/smoke", "scripts/launch")
                for path in (REPO_ROOT / folder).glob("*.py")}
    existing |= {path.stem for path in REPO_ROOT.glob("tests/**/*.py")}
    gone = sorted(named - existing)
    assert not gone, f"docs/development.md names modules that do not exist: {gone}"


def test_host_dependencies_match_requirements_txt():
    required = set()
    for line in (REPO_ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            required.add(re.split(r"[\[=<>~!; ]", line, maxsplit=1)[0].lower())
    table = section((DOCS / "versions.md").read_text(), "## Host dependencies (`requirements.txt`)")
    listed = {line.split("|")[1].strip().split(" (")[0].lower() for line in table.splitlines()
              if line.startswith("| ") and not line.startswith(("| package", "|---"))}
    assert listed == required, (f"versions.md's host dependencies differ from requirements.txt: missing "
                                f"{sorted(required - listed)}, not required {sorted(listed - required)}")


def test_the_readme_names_every_python_m_tfhpc_command():
    commands = re.findall(r"add_parser\(\s*\"([\w-]+)\"", (REPO_ROOT / "tfhpc" / "__main__.py").read_text())
    assert commands, "no subcommands found in tfhpc/__main__.py"
    named = README[README.index("(`python -m tfhpc` with"):]
    named = set(re.findall(r"`([\w-]+)`", named[:named.index(")")]))
    assert named == set(commands), (f"README's `python -m tfhpc` commands differ from tfhpc/__main__.py: missing "
                                    f"{sorted(set(commands) - named)}, extra {sorted(named - set(commands))}")


def test_make_help_shows_every_variable_with_its_default():
    makefile = (REPO_ROOT / "Makefile").read_text()
    variables = re.findall(r"^([A-Z_]+) \?=[ \t]*([^#\n]*?)[ \t]*##", makefile, re.M)
    shown = subprocess.run(["make", "--no-print-directory", "-s", "help"], cwd=REPO_ROOT, capture_output=True,
                           text=True, check=True).stdout
    lines = {line.split()[0]: line for line in shown.split("variables:", 1)[1].splitlines() if line.strip()}
    for name, default in variables:
        assert name in lines, f"make help does not list {name}"
        if default:
            assert f"(default: {default})" in lines[name], f"make help drops {name}'s default {default!r}"


def test_the_site_guide_lists_every_job_script_with_the_variables_it_reads():
    rows = {re.match(r"\| `([\w.-]+)`", line).group(1): line
            for line in table_rows(section(SITE_GUIDE, "## The job scripts"))}
    assert sorted(rows) == [path.name for path in JOB_SCRIPTS], "site-guide.md's job-script table is not scripts/slurm"
    for path in JOB_SCRIPTS:
        code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        read = set(TFHPC_VARIABLE.findall(code))
        listed = set(TFHPC_VARIABLE.findall(rows[path.name].split("|")[-2]))
        assert listed == read, f"site-guide.md: {path.name} reads {sorted(read)}, its row lists {sorted(listed)}"


def test_which_job_scripts_take_a_command():
    """The scripts that end in `"$@"` (run the command given) against the getting-started list; the MWMS script
    passes its arguments to tfhpc-train-mwms-fit and must be named as the one that does not."""
    takes = {path.name for path in JOB_SCRIPTS if 'set -- ' in path.read_text()}
    listed = section(GETTING_STARTED, "## 5. Run your own Keras 3 script on the cluster")
    listed = listed[listed.index("**Which job scripts take your command**"):]
    listed = listed[:listed.index("does not")]
    named = set(re.findall(r"`([\w-]+\.sbatch)`", listed))
    assert named - takes == {"mwms-slurm-resolver.sbatch"}, named - takes
    assert takes <= named, f"getting-started.md leaves out job scripts that take a command: {sorted(takes - named)}"
    assert "mwms-slurm-resolver.sbatch" not in takes


def image_openmpi(manifest):
    """{Debian version: the upstream version of its Open MPI package} from versions.toml's [os.*]."""
    return {spec["version_id"]: upstream_version(spec["mpi"]["openmpi"]["package_version"])
            for spec in manifest.data["os"].values() if "openmpi" in spec.get("mpi", {})}


def test_open_mpi_on_debian_as_versions_toml_has_it(manifest):
    pairs = image_openmpi(manifest)
    texts = dict(PAGES, **{"records.toml text": tomllib.loads((DOCS / "measurements" / "records.toml")
                                                               .read_text())["text"]})
    for name, text in texts.items():
        text = " ".join(text.split())
        for version, debian in re.findall(r"Open MPI (\d+\.\d+\.\d+),? on Debian (\d+)", text):
            assert pairs.get(debian) == version, f"{name}: Open MPI {version} on Debian {debian} (versions.toml: {pairs})"
        for debian, version in re.findall(r"Debian (\d+) \(Open MPI (\d+\.\d+\.\d+)", text):
            assert pairs.get(debian) == version, f"{name}: Debian {debian} (Open MPI {version}) (versions.toml: {pairs})"
        for version, debian in re.findall(r"Open MPI (?:is )?(\d+\.\d+\.\d+) \(Debian (\d+)\)", text):
            assert pairs.get(debian) == version, f"{name}: Open MPI {version} (Debian {debian}) (versions.toml: {pairs})"


def test_the_stacks_open_mpi_as_the_docs_name_it(manifest):
    openmpi = {stack: upstream_version(manifest.config(stack, "cpu", "openmpi").os["mpi"]["openmpi"]["package_version"])
               for stack in manifest.stacks}
    for name, text in PAGES.items():
        text = " ".join(text.split())
        for stack, version in re.findall(r"\b(latest|conservative)(?: stack's| stack:|) \(?Open MPI (\d+\.\d+\.\d+)",
                                         text):
            assert openmpi[stack] == version, f"{name}: the {stack} stack's Open MPI is {openmpi[stack]}, not {version}"


def test_the_measurements_page_describes_the_default_stack(manifest):
    default = manifest.config()
    text = " ".join(tomllib.loads((DOCS / "measurements" / "records.toml").read_text())["text"].split())
    stated = re.search(r"default stack: TF ([\d.]+), tf_keras ([\d.]+), Horovod ([\d.]+), Open MPI ([\d.]+) on "
                       r"Debian (\d+)", text)
    assert stated, "records.toml's text no longer describes the default stack: describe it, or drop this test"
    assert stated.groups() == (default.versions["tensorflow"], default.versions["tf_keras"],
                               default.versions["horovod"],
                               upstream_version(default.os["mpi"]["openmpi"]["package_version"]),
                               default.os["version_id"]), stated.group(0)


def variables_in_the_code():
    """Every TFHPC_* name in scripts/ and tfhpc/ (the job scripts, the entrypoint, the runtime, the host tooling),
    and every one an image's Dockerfile sets (ENV NAME=...)."""
    found = set()
    for folder in ("scripts", "tfhpc"):
        for path in (REPO_ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".png"):
                found |= set(TFHPC_VARIABLE.findall(path.read_text(errors="replace")))
    for path in (REPO_ROOT / "containers").rglob("Dockerfile"):
        found |= set(re.findall(r"\b(TFHPC_[A-Z0-9_]*[A-Z0-9])=", path.read_text()))
    return found


def test_environment_md_lists_every_tfhpc_variable_of_the_code():
    listed = {re.match(r"\| `(TFHPC_\w+)`", line).group(1) for line in table_rows(ENVIRONMENT)
              if line.startswith("| `TFHPC_")}
    code = variables_in_the_code()
    assert listed == code, (f"docs/environment.md differs from the code: missing {sorted(code - listed)}, "
                            f"read or set by nothing {sorted(listed - code)}")


def code_blocks(text):
    return re.findall(r"^```(?:sh|bash)\n(.*?)^```", text, re.M | re.S)


def test_getting_started_commands_name_what_exists():
    shipped = set(tomllib.loads((REPO_ROOT / "scripts" / "entrypoints.toml").read_text()))
    targets = set(re.findall(r"^([a-z0-9-]+):", (REPO_ROOT / "Makefile").read_text(), re.M))
    commands = "\n".join(code_blocks(GETTING_STARTED))
    assert commands, "no shell blocks in docs/getting-started.md"
    for name in re.findall(r"\btfhpc-([a-z0-9-]+)", commands):
        assert name in shipped or name.startswith("app"), f"getting-started.md runs tfhpc-{name}, which is not shipped"
    for target in re.findall(r"^\s*make ([a-z0-9-]+)", commands, re.M):
        assert target in targets, f"getting-started.md runs make {target}, which the Makefile does not have"
    for script in re.findall(r"([\w-]+\.sbatch)", GETTING_STARTED):
        assert (REPO_ROOT / "scripts" / "slurm" / script).is_file(), f"getting-started.md names {script}"
    for example in re.findall(r"/opt/tfhpc/examples/([\w.]+\.py)", GETTING_STARTED):
        assert (REPO_ROOT / "examples" / example).is_file(), f"getting-started.md names examples/{example}"


def test_getting_started_flags_are_the_entrypoints_flags():
    """Every --flag given to a shipped training command in getting-started.md is one its scripts define."""
    defined = set()
    for path in [*(REPO_ROOT / "scripts" / "train").glob("*.py"),
                 *(REPO_ROOT / "scripts" / "runtime" / "tfhpc_runtime").glob("*.py")]:
        defined |= set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", path.read_text()))
    for block in code_blocks(GETTING_STARTED):
        for command in re.findall(r"(?:tfhpc-train-[\w-]+|launch-local-mwms)((?:[^\n]|\\\n)*)", block):
            for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", command):
                assert flag in defined, f"getting-started.md passes {flag}, which no training script defines"


# The docs speak of the project, not of the machine it was built on, nor in a changelog's voice.
MACHINE_VOICE = re.compile(r"\b(?:ran|run|tested|built|measured|done|available|seen) here\b|\bmin(?:utes)? here\b|"
                           r"\bnot made yet\b|\bnow (?:removes|validates|sets|runs|uses|a)\b", re.I)


@pytest.mark.parametrize("name", sorted(set(PAGES) - {"testing.md"}))
def test_no_build_machine_voice(name):
    found = sorted({match.group(0) for match in MACHINE_VOICE.finditer(" ".join(PAGES[name].split()))})
    assert not found, f"{name} speaks of the build machine or in a changelog's voice: {found}"



def test_every_page_is_in_the_readme_documentation_table():
    table = section(README, "## Documentation")
    missing = [path.name for path in sorted(DOCS.glob("*.md")) if f"](docs/{path.name})" not in table]
    assert not missing, f"README's documentation table leaves out {missing}"
