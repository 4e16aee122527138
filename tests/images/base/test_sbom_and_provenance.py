"""Every image's SBOM (build/sbom/) and provenance statement (build/provenance/) that `make image` wrote: valid
CycloneDX, the image's own packages at the versions the image reports (build/images.json, dpkg), and a statement
whose subject is the image's id and whose materials are the checkout's and the parent's."""
import hashlib
import json

import pytest

from support.attestations import materials, schema_errors, versions
from support.stack import CONFIG, MANIFEST, REPO_ROOT
from tfhpc.provenance import IMAGES_JSON
from tfhpc.sbom import file_name, sbom_path
from tfhpc.slsa import statement_path


@pytest.fixture(scope="module")
def sbom(image):
    path = sbom_path(image)
    if not path.is_file():
        pytest.fail(f"{path.relative_to(REPO_ROOT)} is missing: run `make image`")
    return path


def test_sbom_is_valid_cyclonedx_naming_the_image(sbom, image, image_layer):
    assert schema_errors(sbom.read_text()) is None
    bom = json.loads(sbom.read_text())
    assert bom["specVersion"] == "1.6" and bom["metadata"]["component"]["bom-ref"] == image
    assert bom["serialNumber"].startswith("urn:uuid:")


def test_python_packages_are_those_the_image_reports(sbom, image, image_layer):
    reported = json.loads(IMAGES_JSON.read_text())["images"][image]["reported"]["packages"]
    listed = versions(json.loads(sbom.read_text()), "python")
    assert listed == reported
    assert "cyclonedx-bom" not in listed and "cyclonedx-python-lib" not in listed  # the generator is not in the image


def test_debian_packages_are_those_dpkg_lists(sbom, image, image_layer, host):
    listing = host.check_output("dpkg-query -W -f '${db:Status-Abbrev} ${Package} ${Version}\\n'")
    installed = {name: version for status, name, version in (line.split() for line in listing.splitlines())
                 if status == "ii"}
    bom = json.loads(sbom.read_text())
    assert versions(bom, "deb") == installed
    distro = f"debian-{CONFIG.os['version_id']}"
    assert all(c["purl"].endswith(f"&distro={distro}") for c in bom["components"] if c.get("purl", "").startswith("pkg:deb/"))
    mpi_packages = {"openmpi": "openmpi-bin", "mpich": "mpich"}
    if CONFIG.mpi_wheel:  # MPI=abi: the MPI is PyPI's wheel (the SBOM's Python packages), no Debian MPI at all
        assert not set(mpi_packages.values()) & set(installed), installed
        assert not [name for name in installed if name.startswith(("libmpich", "libopenmpi"))], installed
    elif image_layer != "base":
        assert installed[mpi_packages[CONFIG.mpi]] == CONFIG.os["mpi"][CONFIG.mpi]["package_version"]


def test_provenance_subject_is_the_image_and_materials_are_the_sources(sbom, image, image_layer, docker_client):
    path = statement_path(file_name(image))
    statement = json.loads(path.read_text())
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    assert statement["subject"] == [{"name": image, "digest": {"sha256": docker_client.images.get(image).id[7:]}}]
    found = materials(statement)
    assert found["versions.toml"]["digest"]["sha256"] == hashlib.sha256(
        (REPO_ROOT / "versions.toml").read_bytes()).hexdigest()
    assert len(found["git"]["digest"]["gitCommit"]) == 40
    root = found["root image"]
    if root["uri"] == CONFIG.os["apt_mirror"]:
        assert root["annotations"]["debootstrap"] == CONFIG.os_release
        assert root["digest"]["sha256"] == docker_client.images.get(CONFIG.debootstrap_root_image).id[7:]
    else:
        assert root["uri"].startswith(f"docker://{CONFIG.registry_root_image.partition(':')[0]}@sha256:")
    parent = MANIFEST.layers.get(image_layer).parent
    if parent:
        parent_image = CONFIG.image(parent)
        assert found[parent_image]["digest"]["sha256"] == docker_client.images.get(parent_image).id[7:]
    [byproduct] = statement["predicate"]["runDetails"]["byproducts"]
    assert byproduct["digest"]["sha256"] == hashlib.sha256(sbom.read_bytes()).hexdigest()
    assert statement["predicate"]["buildDefinition"]["externalParameters"]["layer"] == image_layer
