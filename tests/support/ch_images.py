"""A Charliecloud directory image of a built Docker image, for `ch-run` (tests/runtimes on one node, tests/cluster on
the Slurm nodes): the image's `docker export` archive plus its environment as /ch/environment (what
`ch-convert -i docker` adds, through a gzip it does not need), converted by the host's `ch-convert -i tar -o dir`."""
import shutil
import subprocess
import tarfile

import pytest


def export_archive(docker_client, image, path, labels=None):
    """`docker export` of a fresh container of `image` into the file `path` (the container is removed)."""
    container = docker_client.containers.create(image.id, labels=labels or {})
    try:
        with path.open("wb") as handle:
            for chunk in container.export(chunk_size=1 << 20):
                handle.write(chunk)
    finally:
        container.remove(force=True)


def directory_image(docker_client, image, work, target, labels=None, env=None):
    """Convert `image` (a docker SDK image) into the directory `target`, with `work` for the temporary files."""
    missing = [tool for tool in ("ch-convert", "ch-run") if not shutil.which(tool)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: install it with `apt-get install charliecloud` (Debian 12)")
    archive = work / "app-export.tar"
    export_archive(docker_client, image, archive, labels)
    environment = work / "environment"
    environment.write_text("".join(f"{line}\n" for line in image.attrs["Config"]["Env"]))
    with tarfile.open(archive, "a") as tar:
        tar.add(environment, arcname="ch/environment")
    try:
        done = subprocess.run(["ch-convert", "--tmp", str(work), "-i", "tar", "-o", "dir", str(archive), str(target)],
                              capture_output=True, text=True, timeout=900, env=env)
    finally:
        archive.unlink()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return target
