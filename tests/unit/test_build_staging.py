"""`make image` moves the stack's tags only when every layer built; proxies reach the build from the environment;
`make clean-all` names the containers that keep images alive. The docker engine is replaced by a fake here: the
real builds are tested in tests/images (tests/images/test_build_safety.py for a failing build)."""
import re

import pytest

from tfhpc import REPO_ROOT, UserError, build, cache, clean, imagebuild
from tfhpc.manifest import Manifest
from tfhpc.sif import squashfs_compression


class FakeImage:
    def __init__(self, engine, name):
        self.engine, self.name = engine, name

    def tag(self, repository, tag):
        self.engine.tags[f"{repository}:{tag}"] = self.engine.tags[self.name]


class FakeImages:
    def __init__(self, engine):
        self.engine = engine

    def get(self, name):
        assert name in self.engine.tags, name
        return FakeImage(self.engine, name)

    def remove(self, name, noprune=False):
        del self.engine.tags[name]


class FakeEngine:
    def __init__(self, tags):
        self.tags = dict(tags)
        self.images = FakeImages(self)


@pytest.fixture
def stack(monkeypatch):
    config = Manifest().config()
    old = {config.image(layer): f"old-{layer}" for layer in config.layers.chain("app")}
    engine = FakeEngine(old)
    monkeypatch.setattr(build, "client", lambda: engine)
    monkeypatch.setattr(build, "resolve_root", lambda config, source: "root")
    monkeypatch.setattr(build, "resolve_ca_bundle", lambda value: None)
    monkeypatch.setattr(build, "record_build_benchmark", lambda *args: None)
    monkeypatch.setattr(build, "record_layers", lambda *args: [])
    return config, engine, old


def fake_build_layer(engine, fail_at=None):
    parents = []

    def build_layer(config, layer, parent, *args, image, shown_as, **kwargs):
        if layer == fail_at:
            raise UserError(f"building layer '{layer}' failed")
        assert image != shown_as and image.startswith(shown_as + "-tfhpc-build-")  # a staging tag, not the real one
        parents.append(parent)
        engine.tags[image] = f"new-{layer}"
        return image
    return build_layer, parents


def test_failure_half_way_moves_no_tag(stack, monkeypatch):
    config, engine, old = stack
    fake, _ = fake_build_layer(engine, fail_at="tensorflow")
    monkeypatch.setattr(build, "build_layer", fake)
    with pytest.raises(UserError, match="layer 'tensorflow' failed.*no tag of the stack was moved"):
        build.build_stack(config, "app", "auto", None)
    assert engine.tags == old  # the base and mpi layers that did build are not tagged, their staging tags are gone


def test_success_moves_every_tag_and_builds_each_layer_on_the_new_parent(stack, monkeypatch):
    config, engine, old = stack
    fake, parents = fake_build_layer(engine)
    monkeypatch.setattr(build, "build_layer", fake)
    built = build.build_stack(config, "app", "auto", None)
    chain = config.layers.chain("app")
    assert built == [config.image(layer) for layer in chain]
    assert engine.tags == {config.image(layer): f"new-{layer}" for layer in chain}
    assert parents[0] == "root" and all(p.endswith(f"-tfhpc-build-{build.os.getpid()}") for p in parents[1:])


def test_proxy_variables_are_forwarded_by_name_only():
    args = imagebuild.proxy_build_args({"https_proxy": "http://user:secret@proxy:3128", "NO_PROXY": "localhost",
                                   "http_proxy": "", "PATH": "/bin"})
    assert args == ["--build-arg", "https_proxy", "--build-arg", "NO_PROXY"]  # the value stays in the environment
    assert imagebuild.proxy_build_args({}) == []


def test_clean_all_names_the_containers_that_keep_an_image(monkeypatch, tmp_path):
    import docker.errors

    class Container:
        def __init__(self, name, image):
            self.name, self.attrs = name, {"Config": {"Image": image}}

    class Image:
        id = "sha256:kept"
        tags = ["tfhpc-app:latest-cpu-openmpi"]

    class Engine:
        class images:
            list = staticmethod(lambda all=False: [Image()])
            prune = staticmethod(lambda filters: {})

            @staticmethod
            def remove(tag, noprune):
                raise docker.errors.APIError("conflict", response=type("R", (), {"status_code": 409})())

        class containers:
            list = staticmethod(lambda all: [Container("forgotten_run", "tfhpc-app:latest-cpu-openmpi"),
                                             Container("other", "debian:12")])

        class api:
            prune_builds = staticmethod(lambda: {})

    monkeypatch.setattr(clean, "client", Engine)
    monkeypatch.setattr(clean, "remove_test_containers", lambda: 0)
    interrupted = tmp_path / "sif" / ".convert-x"  # an interrupted conversion's scratch directory
    interrupted.mkdir(parents=True)
    machine_cache = tmp_path / "cache"  # never the real one either
    monkeypatch.setenv("TFHPC_CACHE", str(machine_cache))
    record = tmp_path / "record.json"
    record.write_text("{}")
    for image_id in ("sha256:kept", "sha256:removed"):
        cache.store(f"probe-{image_id[7:]}", image_id, {"record.json": record})
    with pytest.raises(UserError, match=r"used by containers \(forgotten_run\): `docker rm` them"):
        clean.clean(remove_images=True, build=tmp_path)  # never the real build/: a conversion may be running
    assert not interrupted.exists()
    assert [path.name for path in machine_cache.iterdir()] == ["probe-kept"]  # the entries of removed images go


def test_clean_removes_what_the_tests_label():
    """`make clean` finds a killed test run's containers by the labels the test fixtures put on them."""
    sources = {"tests/cluster/harness.py": clean.TEST_LABELS[0], "tests/support/registry.py": clean.TEST_LABELS[1],
               "tests/runtimes/runtime_helpers.py": clean.TEST_LABELS[2]}
    for path, label in sources.items():
        assert f'"{label}"' in (REPO_ROOT / path).read_text(), f"{path} does not label its containers {label}"


def test_the_sif_compression_comes_from_versions_toml_and_is_checked():
    from tfhpc.manifest import Manifest
    from tfhpc.sif import squashfs_compression
    manifest = Manifest()
    assert squashfs_compression(manifest) == manifest.data["sif"]["squashfs_compression"] == "zstd"
    manifest.data["sif"]["squashfs_compression"] = "bzip2"
    with pytest.raises(UserError, match=r"squashfs_compression = 'bzip2' is not one of gzip, lz4, lzo, xz, zstd"):
        squashfs_compression(manifest)


@pytest.mark.parametrize("level, expected", [(None, "zstd"), ("", "zstd"), ("1", "zstd -Xcompression-level 1"),
                                             (22, "zstd -Xcompression-level 22")])
def test_a_squashfs_level_is_passed_to_mksquashfs(level, expected):
    assert squashfs_compression(Manifest(), level) == expected


@pytest.mark.parametrize("compression, level, words", [("zstd", "0", "zstd's levels are 1-22"),
                                                       ("zstd", "fast", "zstd's levels are 1-22"),
                                                       ("gzip", "10", "gzip's levels are 1-9"),
                                                       ("lz4", "1", "lz4 takes none")])
def test_a_squashfs_level_the_compressor_does_not_take_is_one_line(compression, level, words):
    manifest = Manifest()
    manifest.data["sif"]["squashfs_compression"] = compression
    with pytest.raises(UserError, match=rf"^SQUASHFS_LEVEL={level}: {re.escape(words)}") as raised:
        squashfs_compression(manifest, level)
    assert "\n" not in str(raised.value)
