"""The SIF's provenance statement that `make sif` wrote (build/provenance/<sif>.intoto.json): its subject is the SIF
file as built, its materials the app image it was converted from and the definition file used."""
import json

from support.attestations import materials
from support.stack import CONFIG, LEAF, REPO_ROOT
from tfhpc.common import sha256_file
from tfhpc.slsa import signature_path, statement_path


def test_sif_statement_names_the_sif_the_image_and_the_definition(sif):
    path = statement_path(sif.name)
    statement = json.loads(path.read_text())
    assert statement["subject"] == [{"name": sif.name, "digest": {"sha256": sha256_file(sif)}}]
    assert statement["predicate"]["buildDefinition"]["buildType"] == "urn:tfhpc:build:make-sif:v1"
    recorded = json.loads((REPO_ROOT / "build" / "images.json").read_text())["images"][f"sif:{sif.name}"]
    assert recorded["sha256"] == sha256_file(sif)
    found = materials(statement)
    assert found[CONFIG.image(LEAF)]["digest"]["sha256"] == recorded["image_id"].removeprefix("sha256:")
    assert found[sif.with_suffix(".def").name]["digest"]["sha256"] == sha256_file(sif.with_suffix(".def"))
    assert found["versions.toml"]["digest"]["sha256"] == sha256_file(REPO_ROOT / "versions.toml")
    assert signature_path(path).exists() == recorded["signed"]
