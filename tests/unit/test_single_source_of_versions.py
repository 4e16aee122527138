"""No version is written twice: every pin of versions.toml appears in no other file that builds or runs images
(Dockerfiles, build helpers, scripts, the tooling, the Makefile, CI pipelines, recipes). The generated native recipes
(recipes/native/) carry the pins by design: they are checked against the manifest by the drift test instead."""
import re

from tfhpc import REPO_ROOT

CHECKED = ["Makefile", ".ci/run", "containers/**/*", "scripts/**/*",
           "tfhpc/*.py", "ci/**/*", "recipes/**/*", "tests/**/*.py"]
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
