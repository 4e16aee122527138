"""What a built image reports about itself (not what the manifest says), recorded in build/images.json."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from .common import REPO_ROOT
from .dockerhost import client
from .manifest import Config

IMAGES_JSON = REPO_ROOT / "build" / "images.json"

# Runs inside the image with its own python3; prints one JSON object. Each probe tolerates the layer lacking it.
PROBE = r'''
import json, platform, re, shutil, subprocess
from importlib import metadata
report = {"python": platform.python_version()}
with open("/etc/os-release") as f:
    osr = dict(line.rstrip().split("=", 1) for line in f if "=" in line)
report["os"] = "%s %s" % (osr.get("ID"), osr.get("VERSION_ID", "").strip('"'))
# names in PEP 503 normal form (tf_keras -> tf-keras), as pip and versions.toml's flavours spell them
report["packages"] = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version for d in metadata.distributions()}
def run(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout.strip()
    except Exception as error:
        return "error: %s" % error
if shutil.which("mpirun"):
    # Open MPI: "mpirun (Open MPI) 4.1.4"; MPICH's hydra: "HYDRA build details:", then "    Version:   4.0.2"
    lines = run("mpirun", "--version").splitlines() or [""]
    hydra = [line.split(":", 1)[1].strip() for line in lines if line.strip().startswith("Version:")]
    report["mpirun_version"] = "HYDRA %s" % hydra[0] if lines[0].startswith("HYDRA") and hydra else lines[0]
if "mpi4py" in report["packages"]:
    report["mpi4py_library"] = run("python", "-c", "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])")
if "horovod" in report["packages"]:
    report["horovod_check_build"] = run("horovodrun", "--check-build")
print(json.dumps(report))
'''


def probe_image(config: Config, image: str) -> dict:
    engine = client()
    attrs = engine.images.get(image).attrs
    output = engine.containers.run(image, ["python3", "-c", PROBE], entrypoint=[], remove=True,
                                   stdout=True, stderr=False)
    reported = json.loads(output.decode().strip().splitlines()[-1])
    name, _, tag = image.partition(":")
    return {
        "name": name,
        "tag": tag,
        "image_id": attrs["Id"],
        "size_bytes": attrs["Size"],
        "layer": attrs["Config"]["Labels"].get("io.tfhpc.layer", ""),
        "stack": config.stack,
        "flavor": config.flavor,
        "mpi": config.mpi,
        "reported": reported,
    }


def update_images_json(image: str, record: dict, path: Path = IMAGES_JSON) -> None:
    """Merge one record into images.json, written to a temporary file and renamed (never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        data = {}
    data.setdefault("images", {})[image] = record
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".images.json.")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, path)
