"""ARCH: the default architecture keeps every name it had; another one gets its own tags, locks, root image and
platform, and is built under emulation set up and checked by the build itself (tfhpc/emulation.py, docs/arm64.md).
No docker and no binfmt_misc needed: the handler directory and the commands are replaced by fakes."""
import subprocess
from pathlib import Path

import pytest

from tfhpc import UserError, build, imagebuild, rootimage
from tfhpc.emulation import ensure_emulation, handler_problem, needs_emulation, parse_handler
from tfhpc.lock import header, lock_configurations, lock_specs
from tfhpc.manifest import Manifest

# /proc/sys/fs/binfmt_misc/qemu-aarch64 as Debian 12's qemu-user-static registers it (measured)
DEBIAN_HANDLER = """enabled
interpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P
flags: PF
offset 0
magic 7f454c460201010000000000000000000200b700
mask ffffffffffffff00fffffffffffffffffeffffff
"""


@pytest.fixture(scope="module")
def arm64():
    return Manifest().config(arch="arm64")


def test_the_default_architecture_keeps_its_names(manifest):
    config = manifest.config()
    assert manifest.data["default_arch"] == "amd64" and config.arch == "amd64"
    assert config.tag == "latest-cpu-openmpi" and config.image("app") == "tfhpc-app:latest-cpu-openmpi"
    assert config.locks == "locks/latest-cpu" and config.debootstrap_root_image == f"tfhpc-root:debian-{config.os_release}"
    assert (config.platform, config.machine, config.python_platform) == ("linux/amd64", "x86_64",
                                                                          f"x86_64-{config.os['manylinux']}")
    assert config.tensorflow_package == "tensorflow-cpu"
    assert manifest.config(arch="amd64") == config
    assert not any("platform" in key for key in config.labels("app"))  # same labels, same image ids as before


def test_another_architecture_gets_its_own_names(arm64):
    assert arm64.tag == "latest-cpu-openmpi-arm64"
    assert arm64.image("horovod") == "tfhpc-horovod:latest-cpu-openmpi-arm64"
    assert arm64.locks == "locks/latest-cpu-arm64"
    assert arm64.debootstrap_root_image == f"tfhpc-root:debian-{arm64.os_release}-arm64"
    assert (arm64.platform, arm64.machine, arm64.python_platform) == ("linux/arm64", "aarch64",
                                                                       f"aarch64-{arm64.os['manylinux']}")
    assert arm64.labels("base")["io.tfhpc.platform"] == "linux/arm64"
    assert arm64.labels("app")["org.opencontainers.image.version"] == arm64.tag


def test_an_architecture_overrides_a_flavours_wheel_only_where_it_differs(manifest, arm64):
    # tensorflow-cpu has no aarch64 wheel: the CPU flavour installs "tensorflow" there; nothing else changes
    assert arm64.tensorflow_package == "tensorflow"
    amd64_args, arm64_args = manifest.config().build_args(), arm64.build_args()
    assert {k for k in amd64_args if amd64_args[k] != arm64_args[k]} == {"TENSORFLOW_PACKAGE", "LOCKS"}
    # the GPU flavour is not built for arm64 (versions.toml: TensorFlow's aarch64 wheels have no CUDA;
    # tests/unit/test_unavailable_flavours.py)
    with pytest.raises(UserError, match="FLAVOR=gpu ARCH=arm64 is not built"):
        manifest.config(flavor="gpu", arch="arm64")


def test_an_unknown_architecture_lists_the_valid_ones(manifest):
    with pytest.raises(UserError, match="unknown ARCH 'riscv64': valid values are amd64, arm64"):
        manifest.config(arch="riscv64")


def test_every_build_names_the_platform(monkeypatch, manifest, arm64, tmp_path):
    calls = []

    class Cli:
        def run(self, args):
            calls.append(args)
            with open(args[args.index("--iidfile") + 1], "w") as iid:
                iid.write("sha256:0")
            return 0

    class Image:
        def tag(self, repository, tag):
            pass

    class Client:
        class images:
            get = staticmethod(lambda image_id: Image())

    monkeypatch.setattr(imagebuild, "build_cli", lambda: Cli())
    monkeypatch.setattr(imagebuild, "client", lambda: Client())
    for config in (manifest.config(), arm64):
        imagebuild.build_image(config, tmp_path / "Dockerfile", config.image("base"), "root", None)
    (amd64_args, arm64_args) = calls
    assert amd64_args[amd64_args.index("--platform") + 1] == "linux/amd64"
    assert arm64_args[arm64_args.index("--platform") + 1] == "linux/arm64"


def test_the_stack_build_sets_up_emulation_before_any_layer(monkeypatch, arm64):
    order = []
    monkeypatch.setattr(build, "check_locks", lambda config: None)
    monkeypatch.setattr(build, "client", lambda: None)
    monkeypatch.setattr(build, "ensure_emulation", lambda config: order.append(("emulation", config.arch)))

    def resolve_root(config, source):
        order.append(("root", source))
        raise UserError("stop here")
    monkeypatch.setattr(build, "resolve_root", resolve_root)
    with pytest.raises(UserError, match="stop here"):
        build.build_stack(arm64, "app", "auto", "none")
    assert order == [("emulation", "arm64"), ("root", "auto")]


# --- the emulation check


class Binfmt:
    """A fake /proc/sys/fs/binfmt_misc and the commands ensure_emulation runs."""

    def __init__(self, tmp_path, mounted=True, handler=None, installed=True, mountable=True):
        self.dir = tmp_path / "binfmt_misc"
        self.dir.mkdir()
        self.handler, self.installed, self.mountable = handler, installed, mountable
        self.commands = []
        if mounted:
            self.mount()

    def mount(self):
        (self.dir / "status").write_text("enabled\n")

    def run(self, command, **kwargs):
        self.commands.append(command[0])
        if command[0] == "mount":
            if not self.mountable:
                return subprocess.CompletedProcess(command, 32, "", "mount: permission denied")
            self.mount()
        elif command[0] == "update-binfmts" and self.installed:
            (self.dir / "qemu-aarch64").write_text(self.handler or DEBIAN_HANDLER)
        return subprocess.CompletedProcess(command, 0, "", "")

    def which(self, name):
        return f"/usr/bin/{name}" if self.installed else None

    def ensure(self, config, host="x86_64"):
        return ensure_emulation(config, binfmt_dir=self.dir, host=host, run=self.run, which=self.which)


def test_a_native_build_needs_no_emulation(tmp_path, arm64, manifest):
    fake = Binfmt(tmp_path, mounted=False, installed=False)
    assert not needs_emulation(manifest.config(), host="x86_64") and needs_emulation(arm64, host="x86_64")
    assert fake.ensure(manifest.config()) is False
    assert fake.ensure(arm64, host="aarch64") is False
    assert fake.commands == []


def test_emulation_mounts_binfmt_misc_and_enables_the_handler(tmp_path, arm64, capsys):
    fake = Binfmt(tmp_path, mounted=False)
    assert fake.ensure(arm64) is True
    assert fake.commands == ["mount", "update-binfmts"]
    said = capsys.readouterr().err
    assert "linux/arm64 on this x86_64 host: emulated by /usr/libexec/qemu-binfmt/aarch64-binfmt-P" in said


def test_a_registered_handler_is_used_as_it_is(tmp_path, arm64):
    fake = Binfmt(tmp_path)
    (fake.dir / "qemu-aarch64").write_text(DEBIAN_HANDLER)
    assert fake.ensure(arm64) is True and fake.commands == []


def test_missing_qemu_is_one_line_naming_the_package_and_the_command(tmp_path, arm64):
    with pytest.raises(UserError) as error:
        Binfmt(tmp_path, installed=False).ensure(arm64)
    message = str(error.value)
    assert "\n" not in message
    assert "qemu-user-static is not installed" in message
    assert "apt-get install qemu-user-static binfmt-support" in message


def test_binfmt_misc_that_cannot_be_mounted_says_how(tmp_path, arm64):
    with pytest.raises(UserError, match=r"cannot be mounted \(mount: permission denied\).*mount -t binfmt_misc"):
        Binfmt(tmp_path, mounted=False, mountable=False).ensure(arm64)


@pytest.mark.parametrize("handler, problem", [
    (DEBIAN_HANDLER.replace("enabled", "disabled"), "is disabled"),
    (DEBIAN_HANDLER.replace("flags: PF", "flags: P"), "lacks the F flag"),
])
def test_an_unusable_handler_is_refused(tmp_path, arm64, handler, problem):
    fake = Binfmt(tmp_path)
    (fake.dir / "qemu-aarch64").write_text(handler)
    with pytest.raises(UserError, match=problem):
        fake.ensure(arm64)


def test_handler_parsing():
    entry = parse_handler(DEBIAN_HANDLER)
    assert entry == {"enabled": "1", "interpreter": "/usr/libexec/qemu-binfmt/aarch64-binfmt-P", "flags": "PF"}
    assert handler_problem(entry) == ""
    assert parse_handler("")["enabled"] == "0"


# --- the root image and the locks of another architecture


def test_another_architectures_root_comes_from_debootstrap_never_from_the_registry(monkeypatch, arm64):
    made = []
    monkeypatch.setattr(rootimage, "debootstrap_root", lambda config: made.append(config.arch) or "root-arm64")
    monkeypatch.setattr(rootimage, "_pull", lambda name: pytest.fail(f"pulled {name}"))
    assert rootimage.resolve_root(arm64, "auto") == "root-arm64" and made == ["arm64"]
    with pytest.raises(UserError, match="BASE_SOURCE=registry is not supported for ARCH=arm64"):
        rootimage.resolve_root(arm64, "registry")


def test_debootstrap_of_another_architecture_names_it_and_builds_the_root_for_its_platform(monkeypatch, tmp_path,
                                                                                          arm64):
    commands, imported = [], []

    def run(command, **kwargs):
        commands.append(command)
        (Path(command[-2]) / "etc").mkdir(parents=True)
        return subprocess.CompletedProcess(command, 0, "", "")
    monkeypatch.setattr(rootimage, "_local_image", lambda name: None)
    monkeypatch.setattr(rootimage.shutil, "which", lambda name: f"/usr/sbin/{name}")
    monkeypatch.setattr(rootimage.os, "geteuid", lambda: 0)
    monkeypatch.setattr(rootimage.subprocess, "run", run)
    monkeypatch.setattr(rootimage, "ROOTFS_WORKDIR", tmp_path)
    monkeypatch.setattr(rootimage, "import_foreign_root",
                        lambda config, archive, name: imported.append((archive.name, name, archive.is_file())))
    root = f"tfhpc-root:debian-{arm64.os_release}-arm64"
    assert rootimage.debootstrap_root(arm64) == root
    (command,) = commands
    assert command[:4] == ["debootstrap", "--variant=minbase", "--arch=arm64", arm64.os_release]
    assert imported == [("rootfs.tar", root, True)]


def test_every_architecture_is_locked_for_its_machine(manifest):
    configs = lock_configurations(manifest)
    assert {(c.arch, c.python_platform) for c in configs} == {
        ("amd64", "x86_64-manylinux_2_36"), ("amd64", "x86_64-manylinux_2_40"),
        ("arm64", "aarch64-manylinux_2_36"), ("arm64", "aarch64-manylinux_2_40")}
    assert [c.locks for c in lock_configurations(manifest, ["arm64"])] == [
        "locks/conservative-cpu-arm64", "locks/latest-cpu-arm64"]
    arm64 = manifest.config(arch="arm64")
    assert header(arm64, lock_specs(arm64)[0]).splitlines()[1].startswith("# latest stack, cpu flavour, arm64: ")
    assert "amd64" not in header(manifest.config(), lock_specs(manifest.config())[0])
