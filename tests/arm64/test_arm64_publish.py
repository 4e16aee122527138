"""One tag for both architectures: `make push` of this checkout's amd64 and arm64 builds to a registry on 127.0.0.1,
then each platform pulled back the way its nodes pull it: docker by platform from the index, Apptainer from the SIF
tags (1.4 takes the index's amd64 entry whatever the host, so an arm64 node names `<tag>-arm64`)."""

import pytest

from support.stack import CONFIG, LEAF, MANIFEST
from tfhpc import publish
from tfhpc.apptainer import Apptainer
from tfhpc.common import sha256_file
from tfhpc.manifest import IMAGE_PREFIX
from tfhpc.sif import sif_path

ARCHES = sorted(MANIFEST.arches, key=lambda arch: arch != MANIFEST.data["default_arch"])
CONFIGS = {arch: MANIFEST.config(CONFIG.stack, CONFIG.flavor, CONFIG.mpi, arch) for arch in ARCHES}


@pytest.fixture(scope="module")
def published(registry, tmp_path_factory):
    for arch, config in CONFIGS.items():
        if not sif_path(config, LEAF).is_file():
            pytest.fail(f"{sif_path(config, LEAF).name} is missing: run `make sif ARCH={arch}` first")
    original, publish.PUBLISHED_JSON = publish.PUBLISHED_JSON, tmp_path_factory.mktemp("published") / "published.json"
    try:
        return publish.push(MANIFEST, CONFIG, registry.address)
    finally:
        publish.PUBLISHED_JSON = original


def test_every_architecture_is_published_under_one_tag(published, registry):
    assert published["platforms"] == [CONFIGS[arch].platform for arch in ARCHES]
    index = registry.get(f"{IMAGE_PREFIX}-{LEAF}/manifests/{published['tags'][0]}",
                         headers={"Accept": "application/vnd.oci.image.index.v1+json"}).json()
    assert [entry["platform"]["architecture"] for entry in index["manifests"]] == ARCHES


@pytest.mark.parametrize("arch", ARCHES)
def test_docker_pull_of_the_moving_tag_gives_each_platform_its_own_image(published, registry, docker_client, arch):
    repository, tag = f"{registry.address}/{IMAGE_PREFIX}-{LEAF}", published["tags"][-1]
    pulled = docker_client.images.pull(repository, tag=tag, platform=CONFIGS[arch].platform)
    try:
        assert pulled.id == docker_client.images.get(CONFIGS[arch].image(LEAF)).id
        assert pulled.attrs["Architecture"] == arch
    finally:
        docker_client.images.remove(f"{repository}:{tag}", noprune=True)


def test_apptainer_pulls_each_sif_by_its_tag_and_the_index_gives_amd64(published, registry, tmp_path):
    workdir = tmp_path / "pull"
    workdir.mkdir()
    workdir.chmod(0o777)  # the helper's unprivileged user writes the pulled SIFs here
    runtime = Apptainer.for_config(MANIFEST, CONFIG, build=False)
    for arch in ARCHES:
        reference = published["sif"][arch]["references"][-1]
        assert reference.endswith(f":{published['tags'][-1]}-{arch}")
        runtime.run(["apptainer", "pull", "--no-https", f"{arch}.sif", reference], workdir, capture=True)
        assert sha256_file(workdir / f"{arch}.sif") == published["sif"][arch]["sha256"] == sha256_file(
            sif_path(CONFIGS[arch], LEAF))
        header = runtime.run(["apptainer", "sif", "header", f"{arch}.sif"], workdir, capture=True)
        assert f"Primary Architecture: {arch}" in header, header
    index = f"oras://{registry.address}/{IMAGE_PREFIX}-{LEAF}{publish.SIF_REPOSITORY_SUFFIX}:{published['tags'][0]}"
    runtime.run(["apptainer", "pull", "--no-https", "index.sif", index], workdir, capture=True)
    assert sha256_file(workdir / "index.sif") == published["sif"]["amd64"]["sha256"]
