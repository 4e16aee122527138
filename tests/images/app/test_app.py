"""Checks of the app layer (the leaf): entrypoint, labels and the provenance record of build/images.json."""
import json
import re

import pytest

from conftest import run_ranks
from support.stack import CONFIG, MANIFEST, REPO_ROOT
from tfhpc.manifest import upstream_version


def run(docker_client, image, command=None):
    container = docker_client.containers.run(image, command, detach=True)
    try:
        status = container.wait(timeout=300)["StatusCode"]
        return status, container.logs(stdout=True, stderr=False).decode(), container.logs(stdout=False, stderr=True).decode()
    finally:
        container.remove(force=True)


def test_run_without_command_prints_what_is_inside(docker_client, image, image_layer):
    status, out, _ = run(docker_client, image)
    assert status == 0
    assert re.search(rf"tensorflow\S*\s+{re.escape(CONFIG.versions['tensorflow'])}", out), out
    assert re.search(rf"horovod\s+{re.escape(CONFIG.versions['horovod'])}", out), out
    assert upstream_version(CONFIG.os["mpi"][CONFIG.mpi]["package_version"]) in out
    for name in ("info", "smoke-collectives", "smoke-train"):
        assert f"  {name} " in out
    assert "horovodrun -np 2" in out and "srun" in out


def test_unknown_command_is_a_one_line_error(docker_client, image, image_layer):
    status, _, err = run(docker_client, image, ["no-such-command"])
    assert status == 127
    assert err.strip().count("\n") == 0 and "no-such-command" in err and "smoke-collectives" in err


def test_shipped_command_dispatch(docker_client, image, image_layer):
    status, out, _ = run(docker_client, image, ["smoke-collectives", "--help"])
    assert status == 0 and "--min-ranks" in out


def test_shipped_tensorboard_is_the_pinned_one(docker_client, image, image_layer):
    status, out, _ = run(docker_client, image, ["tensorboard", "--version_tb"])
    assert status == 0 and out.strip().splitlines()[-1] == CONFIG.versions["tensorboard"], out


def test_labels_carry_every_component_version(docker_client, image, image_layer):
    labels = docker_client.images.get(image).labels
    expected = CONFIG.labels(image_layer)
    for key, value in expected.items():
        assert labels.get(key) == value, key
    assert labels["org.opencontainers.image.revision"]
    assert labels["org.opencontainers.image.created"]


@pytest.mark.parametrize("layer", MANIFEST.layers.names)
def test_images_json_records_what_each_image_reports(docker_client, layer):
    record = json.loads((REPO_ROOT / "build" / "images.json").read_text())["images"][CONFIG.image(layer)]
    image = docker_client.images.get(CONFIG.image(layer))
    assert record["image_id"] == image.id
    assert record["size_bytes"] == image.attrs["Size"] > 0
    assert (record["stack"], record["flavor"], record["mpi"], record["layer"]) == (
        CONFIG.stack, CONFIG.flavor, CONFIG.mpi, layer)
    reported = record["reported"]
    assert reported["os"] == f"{CONFIG.os['distro']} {CONFIG.os['version_id']}"
    assert reported["python"].startswith(CONFIG.os["python"] + ".")
    chain = MANIFEST.layers.chain(layer)
    if "mpi" in chain:
        assert upstream_version(CONFIG.os["mpi"][CONFIG.mpi]["package_version"]) in reported["mpirun_version"]
        assert reported["packages"]["mpi4py"] == CONFIG.versions["mpi4py"]
    if "tensorflow" in chain:
        assert reported["packages"][CONFIG.tensorflow_distribution] == CONFIG.versions["tensorflow"]
    if "horovod" in chain:
        assert reported["packages"]["horovod"] == CONFIG.versions["horovod"]
        assert "[X] MPI" in reported["horovod_check_build"]
    if "app" in chain:
        for package in ("tensorboard", "matplotlib"):
            assert reported["packages"][package] == CONFIG.versions[package]


def test_shipped_commands_are_on_path_for_launchers(host, image_layer):
    reports = run_ranks(host, "mpirun -np 2 tfhpc-smoke-collectives --sizes 1,4096 --dtypes float32,int32")
    assert [r["size"] for r in reports] == [2, 2]
    assert all(r["allreduce"]["sum/int32/4096"] == float(sum(i % 7 for i in range(4096)) * 6) for r in reports)
