"""No version is written twice: every pin of versions.toml appears in no other file that builds or runs images
(Dockerfiles, build helpers, scripts, the tooling, the Makefile, CI pipelines, recipes), nor in the README, which
points to versions.toml and `make show` instead. The generated native recipes (recipes/native/) carry the pins by
design: they are checked against the manifest by the drift test instead."""
import re

from tfhpc import REPO_ROOT

# docs/ is not checked, on purpose: docs/versions.md explains why each pin was chosen (and says versions.toml is
# authoritative), docs/measurements.md names the versions each figure was measured with, and the other pages name the
# versions a workaround or a compatibility note is about. The README is checked, more strictly still (below).
CHECKED = ["Makefile", ".ci/run", "containers/**/*", "scripts/**/*",
           "tfhpc/*.py", "ci/**/*", "recipes/**/*", "tests/**/*.py", "README.md"]
THIS_FILE = "tests/unit/test_single_source_of_versions.py"  # names a few pins to prove the check finds them


def pins(manifest):
    data = manifest.data
    found = set()
    for table in [data["defaults"], *data["stacks"].values()]:
        found.update(v for k, v in table.items() if isinstance(v, str) and re.fullmatch(r"[\d.]+", v) and k != "os")
    for stack in data["stacks"].values():  # the GPU flavour's CUDA/cuDNN and CUDA wheel pins (NCCL's among them)
        gpu = stack.get("gpu", {})
        found.update(str(gpu[k]) for k in ("cuda", "cudnn") if k in gpu)
        found.update(gpu.get("wheels", {}).values())
    for os_table in data["os"].values():
        found.update(mpi["package_version"] for mpi in os_table["mpi"].values())
        found.update(v for k, v in os_table.items() if k.endswith("package_version"))
        found.add(os_table["python"])
    found.update(v for k, v in data.get("sif", {}).items() if k.endswith("version"))
    found.update(data.get("site_mpi", {}).values())  # the host MPIs of the site-portability tests
    return found


def test_pins_are_written_only_in_the_manifest(manifest):
    versions = pins(manifest)
    assert {"2.21.0", "0.28.1", "12.5.1", "2.27.7"} <= versions  # the check looks for real pins
    offenders = []
    for pattern in CHECKED:
        for path in REPO_ROOT.glob(pattern):
            generated = path.is_relative_to(REPO_ROOT / "recipes" / "native")
            if (not path.is_file() or path.suffix == ".patch" or "__pycache__" in path.parts or generated
                    or str(path.relative_to(REPO_ROOT)) == THIS_FILE):
                continue
            text = path.read_text(errors="replace")
            for version in versions:
                if re.search(rf"(?<![\d.]){re.escape(version)}(?![\d.])", text):
                    offenders.append(f"{path.relative_to(REPO_ROOT)}: {version}")
    assert not offenders, "versions written outside versions.toml: " + ", ".join(offenders)


def short_forms(pin):
    """The ways a pin is also written in prose: a Debian package version's upstream part ("4.1.4-3+b1" -> "4.1.4")
    and major.minor ("2.21.0" -> "2.21", "TF 2.21")."""
    upstream = re.split(r"[-+~]", pin.split(":")[-1])[0]
    parts = upstream.split(".")
    return {pin, upstream, ".".join(parts[:2])} if len(parts) >= 2 else {pin, upstream}


def test_readme_names_no_version(manifest):
    """The README names no version, not even shortened ("TF 2.21", "Open MPI 4.1"): it points to versions.toml and
    `make show`, so it cannot go stale when a pin moves. Versions belong in docs/ (docs/versions.md)."""
    assert {"4.1.4", "4.1", "2.21"} <= set().union(*map(short_forms, pins(manifest)))  # the check sees short forms
    text = (REPO_ROOT / "README.md").read_text()
    found = sorted({form for pin in pins(manifest) for form in short_forms(pin)
                    if re.search(rf"(?<![\d.]){re.escape(form)}(?!\d)", text)})
    assert not found, f"README.md names versions {found}: refer to versions.toml / `make show` (or docs/versions.md)"
