"""Provenance statements without docker: their shape, their materials (commit, versions.toml, patches, locks, root
image), signatures made here and checked by the library and by `openssl dgst` as docs/publishing.md tells sites."""
import json
import shutil
import subprocess

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from support.attestations import materials
from support.stack import CONFIG, REPO_ROOT
from tfhpc import UserError, slsa
from tfhpc.common import sha256_file


def write_key(path, key, password=None):
    encryption = (serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    return path


@pytest.fixture
def keys(tmp_path):
    return {"rsa": write_key(tmp_path / "rsa.pem", rsa.generate_private_key(65537, 2048)),
            "ec": write_key(tmp_path / "ec.pem", ec.generate_private_key(ec.SECP256R1())),
            "ed25519": write_key(tmp_path / "ed.pem", ed25519.Ed25519PrivateKey.generate())}


@pytest.mark.parametrize("kind", ["rsa", "ec", "ed25519"])
def test_signature_verifies_with_the_public_key_only_and_only_for_the_signed_bytes(keys, kind):
    data = slsa.encode({"_type": slsa.STATEMENT_TYPE, "subject": []})
    signature = slsa.sign(data, keys[kind])
    public = slsa.public_key_pem(keys[kind])
    assert public.startswith(b"-----BEGIN PUBLIC KEY-----")
    assert slsa.verify(data, signature, public)
    assert not slsa.verify(data.replace(b"[]", b"[1]"), signature, public)
    other = "ec" if kind != "ec" else "rsa"
    assert not slsa.verify(data, signature, slsa.public_key_pem(keys[other]))


@pytest.mark.parametrize("kind", ["rsa", "ec"])
def test_openssl_dgst_verifies_a_signed_statement_as_the_docs_say(keys, kind, tmp_path):
    statement = slsa.write_statement(tmp_path / "x.intoto.json", {"_type": slsa.STATEMENT_TYPE}, keys[kind])
    public = tmp_path / "key.pub"
    public.write_bytes(slsa.public_key_pem(keys[kind]))
    command = ["openssl", "dgst", "-sha256", "-verify", str(public), "-signature",
               str(slsa.signature_path(statement)), str(statement)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "Verified OK", done.stdout + done.stderr
    statement.write_text(statement.read_text().replace("Statement", "statement"))
    assert subprocess.run(command, capture_output=True, text=True).returncode == 1


def test_unsigned_rewrite_removes_the_old_signature(keys, tmp_path):
    path = slsa.write_statement(tmp_path / "x.intoto.json", {"a": 1}, keys["rsa"])
    assert slsa.signature_path(path).is_file()
    slsa.write_statement(path, {"a": 2})
    assert not slsa.signature_path(path).exists() and json.loads(path.read_text()) == {"a": 2}


def test_encrypted_or_missing_key_is_a_one_line_error(tmp_path):
    encrypted = write_key(tmp_path / "enc.pem", rsa.generate_private_key(65537, 2048), b"secret")
    with pytest.raises(UserError, match=r"^SIGN_KEY=.*enc.pem: not an unencrypted PEM private key .*: give one"):
        slsa.sign(b"x", encrypted)
    with pytest.raises(UserError, match=r"^SIGN_KEY=.*missing.pem: no such file: give a PEM private key"):
        slsa.sign(b"x", tmp_path / "missing.pem")


def test_source_materials_are_the_commit_the_manifest_the_patches_and_every_lock(tmp_path, monkeypatch):
    (tmp_path / "locks" / "latest").mkdir(parents=True)
    (tmp_path / "locks" / "latest" / "app.txt").write_text("numpy==2.4.0 --hash=sha256:00\n")
    (tmp_path / "locks" / "base.txt").write_text("pip==25.0\n")
    (tmp_path / "versions.toml").write_bytes((REPO_ROOT / "versions.toml").read_bytes())
    shutil.copytree(REPO_ROOT / "containers" / "horovod" / "patches", tmp_path / "patches")
    shutil.copytree(REPO_ROOT / "containers" / "tensorflow" / "patches" / "keras", tmp_path / "keras-patches")
    monkeypatch.setattr(slsa, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(slsa, "LOCKS_DIR", tmp_path / "locks")
    monkeypatch.setattr(slsa, "MANIFEST_PATH", tmp_path / "versions.toml")
    monkeypatch.setattr(slsa, "PATCH_DIR", tmp_path / "patches")
    monkeypatch.setattr(slsa, "KERAS_PATCH_DIR", tmp_path / "keras-patches")
    monkeypatch.setattr(slsa, "git_head", lambda: ("a" * 40, True))
    monkeypatch.setattr(slsa, "git_revision", lambda: "b" * 12)
    found = {m["name"]: m for m in slsa.source_materials(CONFIG)}
    assert found.pop("git") == {"name": "git", "digest": {"gitCommit": "a" * 40},
                                "annotations": {"imageSourcesCommit": "b" * 12, "uncommittedImageSources": True}}
    expected = ["versions.toml", *(f"patches/{patch}" for patch in CONFIG.horovod_patches),
                *(f"keras-patches/{patch}" for patch in CONFIG.keras_patches), "locks/base.txt", "locks/latest/app.txt"]
    assert found == {name: {"name": name, "digest": {"sha256": sha256_file(tmp_path / name)}} for name in expected}


class FakeImages:
    def __init__(self, attrs):
        self.attrs = attrs

    def get(self, name):
        return type("Image", (), {"attrs": self.attrs[name], "id": self.attrs[name]["Id"]})()


def fake_client(monkeypatch, attrs):
    engine = type("Engine", (), {"images": FakeImages(attrs)})()
    monkeypatch.setattr(slsa, "client", lambda: engine)


def test_root_material_of_debootstrap_is_mirror_release_and_date(monkeypatch):
    root = CONFIG.debootstrap_root_image
    fake_client(monkeypatch, {root: {"Id": "sha256:" + "1" * 64, "Created": "2026-11-24T11:00:00Z"}})
    assert slsa.root_material(CONFIG, root) == {
        "name": "root image", "uri": CONFIG.os["apt_mirror"], "digest": {"sha256": "1" * 64},
        "annotations": {"debootstrap": CONFIG.os_release, "variant": "minbase", "created": "2026-11-24T11:00:00Z"}}


def test_root_material_of_a_registry_image_is_its_repository_digest(monkeypatch):
    root = CONFIG.registry_root_image
    repository = root.partition(":")[0]
    fake_client(monkeypatch, {root: {"Id": "sha256:" + "1" * 64, "RepoDigests": [f"{repository}@sha256:{'2' * 64}"]}})
    assert slsa.root_material(CONFIG, root) == {"name": "root image", "uri": f"docker://{repository}@sha256:{'2' * 64}",
                                                "digest": {"sha256": "2" * 64}}


def test_image_statement_is_an_in_toto_statement_with_slsa_provenance(monkeypatch, tmp_path):
    image, parent = CONFIG.image("app"), CONFIG.image("horovod")
    fake_client(monkeypatch, {image: {"Id": "sha256:" + "3" * 64, "Config": {"Labels": {"io.tfhpc.layer": "app"}}},
                              parent: {"Id": "sha256:" + "4" * 64}})
    sbom = REPO_ROOT / "versions.toml"  # any file: its digest is what the byproduct records
    root = {"name": "root image", "uri": "http://mirror", "digest": {"sha256": "5" * 64}}
    statement = slsa.image_statement(CONFIG, image, parent, root, {"A": "1"}, sbom)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    assert statement["subject"] == [{"name": image, "digest": {"sha256": "3" * 64}}]
    definition = statement["predicate"]["buildDefinition"]
    assert definition["externalParameters"] == {"stack": CONFIG.stack, "flavor": CONFIG.flavor, "mpi": CONFIG.mpi,
                                                "layer": "app", "platform": CONFIG.platform}
    assert definition["internalParameters"] == {"buildArgs": {"A": "1"}}
    found = materials(statement)
    assert found["root image"] == root and found[parent] == {"name": parent, "digest": {"sha256": "4" * 64}}
    assert found["versions.toml"]["digest"]["sha256"] == sha256_file(REPO_ROOT / "versions.toml")
    [byproduct] = statement["predicate"]["runDetails"]["byproducts"]
    assert byproduct == {"name": "sbom", "uri": "versions.toml", "mediaType": "application/vnd.cyclonedx+json",
                         "digest": {"sha256": sha256_file(sbom)}}
    assert slsa.encode(statement) == slsa.encode(slsa.image_statement(CONFIG, image, parent, root, {"A": "1"}, sbom))


def test_subject_sha256_reads_the_first_subject_or_gives_empty(tmp_path):
    path = slsa.write_statement(tmp_path / "x.intoto.json", slsa.statement("x", "6" * 64, "urn:t", {}, {}, [], []))
    assert slsa.subject_sha256(path) == "6" * 64
    assert slsa.subject_sha256(tmp_path / "missing.intoto.json") == ""
    (tmp_path / "broken.intoto.json").write_text("{not json")
    assert slsa.subject_sha256(tmp_path / "broken.intoto.json") == ""
