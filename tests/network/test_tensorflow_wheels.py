"""FLAVOR=gpu ARCH=arm64 is refused (versions.toml [arches.arm64.flavors.gpu] `unavailable`) because TensorFlow's
aarch64 wheels on PyPI are built without CUDA. This reads the build_info of the aarch64 wheel the arm64 CPU flavour
installs, the file of tensorflow==<the stack's pin> whose sha256 its lock holds, and fails when that wheel and the
refusal disagree: a CUDA build appeared (lift the refusal), or the refusal was lifted while the wheel still has none.
Only the wheel's zip directory and one member are read (tests/support/wheels.py), about 2 MB of its 280 MB."""
import pytest

from support.stack import MANIFEST, REPO_ROOT
from support.wheels import UNREACHABLE, build_info, index_files, index_url, matching_wheels, read_member
from tfhpc.lock import lock_dir, locked_packages

ARCH = "arm64"
BUILD_INFO = "tensorflow/python/platform/build_info.py"
# The stacks that have a GPU flavour (a [stacks.<name>.gpu] table): the ones FLAVOR=gpu ARCH=arm64 would build.
GPU_STACKS = [stack for stack in MANIFEST.stacks if MANIFEST.data["stacks"][stack].get("gpu")]


def from_index(what, read, *args):
    """read(*args), or a failure naming `what`, the error and the index (outside the `except`: one message, not the
    chain of the HTTP library's exceptions)."""
    try:
        return read(*args)
    except UNREACHABLE as error:
        problem = f"{type(error).__name__}: {error}"
    pytest.fail(f"cannot read {what} ({problem}): this test needs the package index {index_url()} (PyPI, or "
                "PIP_INDEX_URL's mirror; the host's CA bundle as for `make lock`); offline, deselect it with "
                "`-m 'not network'`", pytrace=False)


@pytest.mark.parametrize("stack", GPU_STACKS)
def test_the_arm64_gpu_refusal_holds_while_the_aarch64_wheel_has_no_cuda(stack):
    cpu = MANIFEST.config(stack, "cpu", arch=ARCH)
    # The arm64 CPU flavour installs the full "tensorflow" wheel, the one tensorflow[and-cuda] adds CUDA wheels to.
    assert cpu.tensorflow_distribution == "tensorflow", "the arm64 CPU flavour no longer installs `tensorflow`"
    version = cpu.versions["tensorflow"]
    lock = lock_dir(cpu) / "tensorflow.txt"
    hashes = locked_packages(lock).get(f"tensorflow=={version}")
    assert hashes, f"{lock.relative_to(REPO_ROOT)} has no tensorflow=={version}: run `make lock ARCH={ARCH}`"
    page, files = from_index("the index's listing of tensorflow", index_files, "tensorflow")
    wheels = matching_wheels(files, "tensorflow", version, cpu.os["python"], cpu.machine, hashes)
    assert len(wheels) == 1, (f"{page} lists {len(wheels)} {cpu.machine} wheels of tensorflow=={version} for Python "
                              f"{cpu.os['python']} with a sha256 of {lock.relative_to(REPO_ROOT)}, not one: run "
                              f"`make lock ARCH={ARCH}`")
    (wheel,) = wheels
    # The file is not hashed here (only its directory and one member are read): the index's sha256 of the file whose
    # URL it lists is the lock's, the one pip --require-hashes accepts in the image.
    assert wheel["hashes"]["sha256"] in hashes
    info = build_info(from_index(f"{BUILD_INFO} of {wheel['url']}", read_member, wheel["url"], BUILD_INFO).decode())
    assert "is_cuda_build" in info, f"{wheel['filename']}: {BUILD_INFO} has no is_cuda_build: {info}"
    refusal = MANIFEST.unavailable("gpu", ARCH)
    if info["is_cuda_build"]:
        assert not refusal, (
            f"{wheel['filename']} is now a CUDA build ({BUILD_INFO}: {info}): lift the refusal: remove `unavailable` "
            f"from versions.toml's [arches.{ARCH}.flavors.gpu], run `make lock ARCH={ARCH}`, build and test "
            f"`make test-images FLAVOR=gpu ARCH={ARCH}`, and say so in docs/arm64.md and docs/gpu.md")
    else:
        assert refusal, (f"FLAVOR=gpu ARCH={ARCH} is no longer refused, but {wheel['filename']} is still built without "
                         f"CUDA ({BUILD_INFO}: {info}): put `unavailable` back in versions.toml's "
                         f"[arches.{ARCH}.flavors.gpu]")
