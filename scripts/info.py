#!/usr/bin/env python3
"""Print what the tfhpc image holds, the commands it ships and how to run N ranks. Imports no framework, so it
answers in well under a second, also on a login node."""
import platform
import shutil
import subprocess
import tomllib
from pathlib import Path

from tfhpc_runtime.versions import installed_versions

SCRIPTS = Path(__file__).resolve().parent


def main():
    with open("/etc/os-release") as handle:
        os_release = {key: value.strip('"') for key, value in
                      (line.rstrip().split("=", 1) for line in handle if "=" in line)}
    print("tfhpc: TensorFlow + Horovod for HPC clusters")
    print(f"  os             {os_release.get('PRETTY_NAME', '?')}")
    print(f"  python         {platform.python_version()}")
    for name, version in installed_versions().items():
        print(f"  {name:<14} {version}")
    if shutil.which("mpirun"):
        lines = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.splitlines()
        # Open MPI: "mpirun (Open MPI) 4.1.4"; MPICH's hydra: "HYDRA build details:", then "    Version:   4.0.2"
        hydra = [line.split(":", 1)[1].strip() for line in lines if line.strip().startswith("Version:")]
        shown = f"MPICH (hydra mpirun {hydra[0]})" if lines and lines[0].startswith("HYDRA") and hydra else \
            (lines[0] if lines else "?")
        print(f"  mpi            {shown}")
    with (SCRIPTS / "entrypoints.toml").open("rb") as handle:
        entrypoints = tomllib.load(handle)
    print("\ncommands (docker run IMAGE NAME, or apptainer run --app NAME image.sif):")
    for name, spec in entrypoints.items():
        print(f"  {name:<18} {spec['help']}")
    print("""
run 2 ranks:
  docker run --rm IMAGE horovodrun -np 2 python /opt/tfhpc/scripts/smoke/hvd_collectives.py
  docker run --rm IMAGE mpirun -np 2 python /opt/tfhpc/scripts/smoke/hvd_collectives.py
  srun -N2 --ntasks-per-node=1 --mpi=pmix singularity exec image.sif python /opt/tfhpc/scripts/smoke/hvd_collectives.py""")


if __name__ == "__main__":
    main()
