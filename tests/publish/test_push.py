"""`make push` against a real registry on 127.0.0.1: one-line errors that push nothing, a failed push that leaves no
moving tag and no record, then the full publication pulled back the way a site does: the image runs its 2-rank
smoke test with exact values, the SIF (oras) verifies with the site's key and has the published sha256, and the SBOMs
and signed provenance statements beside it (oras) are the built ones and verify with that key."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.attestations import materials, schema_errors
from support.collectives import check_collectives
from support.registry import MANIFEST_TYPES, free_port
from support.stack import CONFIG, MANIFEST, REPO_ROOT
from tfhpc import UserError, publish, slsa
from tfhpc.apptainer import Apptainer
from tfhpc.common import sha256_file
from tfhpc.manifest import IMAGE_PREFIX
from tfhpc.sbom import file_name, sbom_path
from tfhpc.sif import sif_path

LEAF = MANIFEST.layers.leaf
REPOSITORIES = {f"{IMAGE_PREFIX}-{layer}" for layer in MANIFEST.layers.names}
SIF_REPOSITORY = f"{IMAGE_PREFIX}-{LEAF}{publish.SIF_REPOSITORY_SUFFIX}"
TAGS = [publish.version_tag(CONFIG), *publish.moving_tags(MANIFEST, CONFIG)]
ATTESTATION_SUFFIXES = ["", "-sbom", "-provenance"]  # the SIF's repository: the SIF, the SBOMs, the provenance
ARCH_TAG = f"{TAGS[0]}-{CONFIG.arch}"  # this architecture's images; every tag of TAGS is an index over such tags


@pytest.fixture
def record(tmp_path, monkeypatch):
    """build/published.json of these tests goes to a temporary file, not over a real publication's record."""
    path = tmp_path / "published.json"
    monkeypatch.setattr(publish, "PUBLISHED_JSON", path)
    return path


def aliases(docker_client, registry):
    return [tag for image in docker_client.images.list() for tag in image.tags if tag.startswith(registry.address)]


def test_unreachable_registry_is_one_line_and_pushes_nothing(record):
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    done = subprocess.run([sys.executable, "-m", "tfhpc", "push", "--registry", address], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tfhpc: error: registry {address} unreachable"), done.stderr
    assert "start it, or fix REGISTRY" in lines[0] and lines[0].endswith("nothing was pushed")


def test_missing_image_is_one_line_and_pushes_nothing(registry, record):
    unbuilt = dataclasses.replace(CONFIG, mpi="never-built")  # its locks exist (per stack x flavour), no image does
    with pytest.raises(UserError) as error:
        publish.push(MANIFEST, unbuilt, registry.address)
    message = str(error.value)
    assert message == (f"{unbuilt.image(MANIFEST.layers.names[0])} is not built: run `make image` (same "
                       "STACK/FLAVOR/MPI) first; nothing was pushed")
    assert registry.catalog() == set() and not record.exists()


def test_missing_sbom_is_one_line_and_pushes_nothing(registry, record, monkeypatch, tmp_path):
    monkeypatch.setattr(publish, "sbom_path", lambda image: tmp_path / "none.cdx.json")
    with pytest.raises(UserError) as error:
        publish.push(MANIFEST, CONFIG, registry.address)
    first = CONFIG.image(MANIFEST.layers.names[0])
    assert str(error.value).startswith(f"{first}'s SBOM or provenance ({tmp_path / 'none.cdx.json'}, build/provenance/")
    assert str(error.value).endswith("is missing or of another build: run `make image` (same STACK/FLAVOR/MPI) first; "
                                     "nothing was pushed")
    assert registry.catalog() == set() and not record.exists()


def test_failed_push_leaves_no_moving_tag_and_no_record(registry, record, monkeypatch, docker_client):
    """The registry refuses the third image: what went up keeps only its versioned tag, no SIF, no moving tag, no
    record, and no registry-named tag is left on the local images."""
    real_push = publish._docker_push
    failing = f"{IMAGE_PREFIX}-{MANIFEST.layers.names[2]}:"

    def push_or_fail(reference):
        if failing in reference:
            raise UserError(f"pushing {reference} failed (simulated): moving tags were not updated")
        return real_push(reference)

    monkeypatch.setattr(publish, "_docker_push", push_or_fail)
    with pytest.raises(UserError, match="simulated"):
        publish.push(MANIFEST, CONFIG, registry.address)
    pushed = {f"{IMAGE_PREFIX}-{layer}" for layer in MANIFEST.layers.names[:2]}
    assert registry.catalog() == pushed
    for repository in pushed:
        assert registry.tags(repository) == {ARCH_TAG}  # no index, no moving tag
    assert not record.exists() and aliases(docker_client, registry) == []


def test_failure_while_moving_tags_names_the_tags_already_moved(registry, record, monkeypatch, docker_client):
    """The moving tags' phase fails at the third image's index: the error lists exactly the moving tags that went
    up, so a site knows what changed; no record is written."""
    if len(TAGS) < 2:
        pytest.fail("versions.toml gives this configuration no moving tag: the test needs one")
    real_put = publish.IndexWriter.put
    failing = f"{IMAGE_PREFIX}-{MANIFEST.layers.names[2]}"

    def put_or_fail(writer, repository, tag, entries):
        if repository.endswith(failing) and tag == TAGS[1]:
            raise UserError(f"writing the index {repository}:{tag} failed (simulated); moving tags were not updated")
        return real_put(writer, repository, tag, entries)

    monkeypatch.setattr(publish.IndexWriter, "put", put_or_fail)
    with pytest.raises(UserError) as failed:
        publish.push(MANIFEST, CONFIG, registry.address)
    moved = [f"{registry.address}/{IMAGE_PREFIX}-{layer}:{TAGS[1]}" for layer in MANIFEST.layers.names[:2]]
    assert f"moving tags already updated: {', '.join(moved)}; run `make push` again" in str(failed.value)
    for layer in MANIFEST.layers.names[:2]:
        assert TAGS[1] in registry.tags(f"{IMAGE_PREFIX}-{layer}")
    assert TAGS[1] not in registry.tags(f"{IMAGE_PREFIX}-{MANIFEST.layers.names[2]}")
    assert not record.exists() and aliases(docker_client, registry) == []


@pytest.fixture(scope="module")
def published(registry, keys, tmp_path_factory):
    """The full publication, signed with the site's key (the `make push SIGN_KEY=...` path)."""
    path = tmp_path_factory.mktemp("published") / "published.json"
    original, publish.PUBLISHED_JSON = publish.PUBLISHED_JSON, path
    try:
        result = publish.push(MANIFEST, CONFIG, registry.address, keys / "site.pem")
    finally:
        publish.PUBLISHED_JSON = original
    assert json.loads(path.read_text()) == result
    return result


def test_every_image_and_the_sif_carry_every_tag(published, registry, docker_client):
    arches = [platform.split("/")[1] for platform in published["platforms"]]
    assert CONFIG.arch in arches and published["tags"] == TAGS and published["scheme"] == "http"
    assert registry.catalog() == REPOSITORIES | {SIF_REPOSITORY}
    for repository in REPOSITORIES:
        assert registry.tags(repository) == set(TAGS) | {f"{TAGS[0]}-{arch}" for arch in arches}, repository
    assert registry.tags(SIF_REPOSITORY) == set(TAGS) | {f"{tag}-{arch}{kind}" for tag in TAGS for arch in arches
                                                         for kind in ATTESTATION_SUFFIXES}
    for repository in REPOSITORIES | {SIF_REPOSITORY}:
        digests = {registry.digest(repository, tag) for tag in TAGS}
        assert len(digests) == 1, f"{repository}: the moving tags point elsewhere than the versioned tag"
    for arch in arches:
        for suffix in ATTESTATION_SUFFIXES:
            digests = {registry.digest(SIF_REPOSITORY, f"{tag}-{arch}{suffix}") for tag in TAGS}
            assert len(digests) == 1, f"{SIF_REPOSITORY} {arch}{suffix}: the moving tags point elsewhere"
    for layer in MANIFEST.layers.names:
        reference = f"{registry.address}/{IMAGE_PREFIX}-{layer}:{ARCH_TAG}"
        assert published["images"][reference]["digest"] == registry.digest(f"{IMAGE_PREFIX}-{layer}", ARCH_TAG)
        assert published["images"][reference]["image_id"] == docker_client.images.get(CONFIG.image(layer)).id
    assert published["sif"][CONFIG.arch]["references"] == [
        f"oras://{registry.address}/{SIF_REPOSITORY}:{tag}-{CONFIG.arch}" for tag in TAGS]
    assert aliases(docker_client, registry) == []  # the push's handles are gone: pulls below really pull


def test_each_tag_is_an_index_naming_every_architecture_by_digest_and_platform(published, registry):
    arches = [platform.split("/")[1] for platform in published["platforms"]]
    for repository, arch_tags in [(f"{IMAGE_PREFIX}-{layer}", {arch: f"{TAGS[0]}-{arch}" for arch in arches})
                                  for layer in MANIFEST.layers.names] + [
                                     (SIF_REPOSITORY, {arch: f"{TAGS[0]}-{arch}" for arch in arches})]:
        answer = registry.get(f"{repository}/manifests/{TAGS[-1]}", headers={"Accept": MANIFEST_TYPES})
        assert answer.headers["Content-Type"] == "application/vnd.oci.image.index.v1+json", repository
        listed = answer.json()["manifests"]
        assert [entry["platform"]["architecture"] for entry in listed] == arches, repository  # the default first
        for entry in listed:
            assert entry["platform"]["os"] == "linux"
            assert entry["digest"] == registry.digest(repository, arch_tags[entry["platform"]["architecture"]])
        assert published["indexes"][f"{registry.address}/{repository}:{TAGS[0]}"]["manifests"] == [
            entry["digest"] for entry in listed]


def test_pulled_image_is_the_built_one_and_passes_the_smoke_test(published, registry, docker_client):
    reference = f"{registry.address}/{IMAGE_PREFIX}-{LEAF}:{TAGS[0]}"
    pulled = docker_client.images.pull(reference)
    try:
        assert pulled.id == docker_client.images.get(CONFIG.image(LEAF)).id
        assert pulled.labels["io.tfhpc.tensorflow.version"] == CONFIG.versions["tensorflow"]
        output = docker_client.containers.run(
            reference, ["horovodrun", "-np", "2", "tfhpc-smoke-collectives", "--sizes", "1,4096",
                        "--dtypes", "float32,int32"], entrypoint=[], remove=True, stdout=True, stderr=True).decode()
    finally:
        docker_client.images.remove(reference, noprune=True)
    check_collectives(output)


def test_pulled_sif_verifies_with_the_site_key_and_has_the_published_sha256(published, registry, keys,
                                                                            tmp_path):
    workdir = tmp_path / "pull"
    workdir.mkdir()
    workdir.chmod(0o777)  # the helper's unprivileged user writes the pulled SIFs here
    for name in ("site.pub", "other.pub"):
        (workdir / name).write_bytes((keys / name).read_bytes())
    sif = published["sif"][CONFIG.arch]
    first, moving = sif["references"][0], sif["references"][-1]
    # What a site runs (docs/publishing.md): pull over oras, then verify with the key it was given. The index tag
    # (no architecture) gives Apptainer 1.4 the amd64 entry, whatever the host (apptainer/apptainer#3345).
    runtime = Apptainer.for_config(MANIFEST, CONFIG, build=False)
    runtime.run(["apptainer", "pull", "--no-https", "pulled.sif", first], workdir, capture=True)
    runtime.run(["apptainer", "pull", "--no-https", "moving.sif", moving], workdir, capture=True)
    runtime.run(["apptainer", "pull", "--no-https", "index.sif", first.removesuffix(f"-{CONFIG.arch}")], workdir,
                capture=True)
    runtime.verify(workdir / "pulled.sif", workdir / "site.pub", workdir)
    assert sha256_file(workdir / "pulled.sif") == sha256_file(workdir / "moving.sif") == sif["sha256"]
    assert sha256_file(workdir / "index.sif") == published["sif"]["amd64"]["sha256"]
    with pytest.raises(UserError, match="apptainer verify failed"):
        runtime.verify(workdir / "pulled.sif", workdir / "other.pub", workdir)
    # The signature was added to a copy: the SIF of `make sif` is unchanged and still the one images.json records.
    local = sif_path(CONFIG, LEAF)
    recorded = json.loads((REPO_ROOT / "build" / "images.json").read_text())["images"][f"sif:{local.name}"]
    assert sha256_file(local) == recorded["sha256"] != sif["sha256"]
    assert sif["signed"] is True
    assert (REPO_ROOT / sif["public_key"]).read_bytes() == (keys / "site.pub").read_bytes()


def pull_artifact(reference, directory):
    """What a site runs: oras pull (here oras-py, the library `make push` uses) into `directory`."""
    import oras.client
    directory.mkdir()
    client = oras.client.OrasClient(insecure=True)
    client.session.trust_env = False  # the registry is on 127.0.0.1
    return {Path(path).name: Path(path) for path in client.pull(target=reference.removeprefix("oras://"),
                                                                outdir=str(directory))}


def test_pulled_sboms_are_the_built_ones_and_valid(published, registry, tmp_path):
    sboms = published["sif"][CONFIG.arch]["sbom"]
    for index, reference in enumerate(sboms["references"]):
        pulled = pull_artifact(reference, tmp_path / str(index))
        assert {name: sha256_file(path) for name, path in pulled.items()} == sboms["files"]
        assert sorted(pulled) == sorted(sbom_path(CONFIG.image(layer)).name for layer in MANIFEST.layers.names)
        for layer in MANIFEST.layers.names:
            path = pulled[sbom_path(CONFIG.image(layer)).name]
            assert path.read_bytes() == sbom_path(CONFIG.image(layer)).read_bytes()
            assert schema_errors(path.read_text()) is None


def test_pulled_provenance_verifies_with_the_site_key_and_names_what_was_published(published, registry, keys,
                                                                                   docker_client, tmp_path):
    public, other = (keys / "site.pub").read_bytes(), (keys / "other.pub").read_bytes()
    sif_statement = f"{sif_path(CONFIG, LEAF).name}.intoto.json"
    provenance = published["sif"][CONFIG.arch]["provenance"]
    for index, reference in enumerate(provenance["references"]):
        pulled = pull_artifact(reference, tmp_path / str(index))
        assert {name: sha256_file(path) for name, path in pulled.items()} == provenance["files"]
        statements = sorted(name for name in pulled if name.endswith(".intoto.json"))
        assert statements == sorted([*(f"{file_name(CONFIG.image(layer))}.intoto.json"
                                       for layer in MANIFEST.layers.names), sif_statement])
        for name in statements:
            data, signature = pulled[name].read_bytes(), pulled[f"{name}.sig"].read_bytes()
            assert slsa.verify(data, signature, public) and not slsa.verify(data, signature, other)
            assert not slsa.verify(data.replace(b"sha256", b"sha512", 1), signature, public)
            # docs/publishing.md's command for sites without Python
            done = subprocess.run(["openssl", "dgst", "-sha256", "-verify", str(keys / "site.pub"), "-signature",
                                   str(pulled[f"{name}.sig"]), str(pulled[name])], capture_output=True, text=True)
            assert done.returncode == 0 and done.stdout.strip() == "Verified OK", done.stderr
        for layer in MANIFEST.layers.names:
            image = CONFIG.image(layer)
            statement = json.loads(pulled[f"{file_name(image)}.intoto.json"].read_text())
            image_id = docker_client.images.get(image).id
            assert statement["subject"] == [{"name": image, "digest": {"sha256": image_id.removeprefix("sha256:")}}]
        statement = json.loads(pulled[sif_statement].read_text())
        assert statement["subject"] == [{"name": sif_path(CONFIG, LEAF).name,
                                         "digest": {"sha256": published["sif"][CONFIG.arch]["sha256"]}}]
        assert materials(statement)[CONFIG.image(LEAF)]["digest"]["sha256"] == docker_client.images.get(
            CONFIG.image(LEAF)).id[7:]


def test_ci_build_layer_needs_its_parent_loaded():
    """The pipelines' per-layer job stops in one line when the parent job's images were not loaded (no build)."""
    from tfhpc.cilayer import build_one_layer
    unbuilt = dataclasses.replace(CONFIG, mpi="never-built")  # its locks exist (per stack x flavour), no image does
    layer = MANIFEST.layers.names[1]
    parent = MANIFEST.layers.get(layer).parent
    with pytest.raises(UserError) as error:
        build_one_layer(MANIFEST, unbuilt, layer, "auto", "none")
    assert str(error.value) == (f"{unbuilt.image(parent)} is not loaded: load the '{parent}' job's artifact first "
                                f"(or run `make image LAYER={layer}`)")
