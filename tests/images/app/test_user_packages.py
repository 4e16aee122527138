"""Adding one's own packages, as docs/training.md#adding-your-own-packages shows: a derived image built from
examples/add-packages (pip constrained by the image's own package list) adds the package and replaces none of the
image's; a requirement that would replace one is refused; in a container, a stacked venv on a writable directory
does the same without a build (the SIF's form is tested in tests/sif)."""
import json

import pytest

from support.stack import CONFIG, REPO_ROOT
from tfhpc.common import default_ca_bundle, resolve_ca_bundle
from tfhpc.imagebuild import build_image

EXAMPLE = REPO_ROOT / "examples" / "add-packages"
FREEZE = "python -c \"import json, subprocess, sys; print(json.dumps(sorted(subprocess.run([sys.executable, '-m', " \
         "'pip', 'list', '--format=freeze'], capture_output=True, text=True, check=True).stdout.split())))\""


def packages(docker_client, image, python="python"):
    output = docker_client.containers.run(image, ["sh", "-c", FREEZE.replace("python", python, 1)], entrypoint=[],
                                          remove=True, stderr=False)
    return set(json.loads(output.decode().strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def derived(image, image_layer):
    return build_image(CONFIG, EXAMPLE / "Dockerfile", f"tfhpc-test-derived:{CONFIG.tag}", image,
                       resolve_ca_bundle(default_ca_bundle()), context=EXAMPLE)


def test_derived_image_adds_the_package_and_keeps_the_images(docker_client, image, image_layer, derived):
    before, after = packages(docker_client, image), packages(docker_client, derived)
    added = after - before
    assert [name.split("==")[0].lower() for name in added] == ["tabulate"], added
    assert before <= after  # every package of the image at the version it was built with
    user = docker_client.containers.run(derived, ["id", "-un"], entrypoint=[], remove=True).decode().strip()
    assert user == "tfhpc"
    check = "import tabulate, horovod.tensorflow as hvd, tensorflow as tf; print('ok', tf.__version__)"
    out = docker_client.containers.run(derived, ["python", "-c", check], entrypoint=[], remove=True).decode()
    assert out.strip().endswith(CONFIG.versions["tensorflow"])


def with_pip(docker_client, image, script):
    """`script` run by sh in a container of `image`, pip reaching PyPI (the host's CA bundle mounted for a proxy)."""
    ca = resolve_ca_bundle(default_ca_bundle())
    volumes = {str(ca): {"bind": "/tmp/ca.pem", "mode": "ro"}} if ca else {}
    return docker_client.containers.run(image, ["sh", "-c", script], entrypoint=[], remove=True, stderr=True,
                                        volumes=volumes, environment={"PIP_CERT": "/tmp/ca.pem"} if ca else {}).decode()


def test_a_requirement_that_replaces_an_image_package_is_refused(docker_client, image, image_layer):
    """The constraint step of the example, with a requirement on another numpy: pip stops before installing."""
    out = with_pip(docker_client, image,
                   "pip list --format=freeze > /tmp/image.txt && numpy=$(grep -i '^numpy==' /tmp/image.txt) && "
                   "python -m venv --system-site-packages --without-pip /tmp/venv && "
                   "/tmp/venv/bin/python -m pip install --constraint /tmp/image.txt \"numpy!=${numpy#*==}\"; "
                   "echo status=$?")
    assert "status=1" in out and ("ResolutionImpossible" in out or "conflict" in out.lower()), out[-2000:]


def test_stacked_venv_sees_the_image_and_adds_to_it(docker_client, image, image_layer):
    out = with_pip(docker_client, image,
                   "python -m venv --system-site-packages --without-pip /tmp/venv && "
                   "pip list --format=freeze > /tmp/image.txt && "
                   "/tmp/venv/bin/python -m pip install --quiet --constraint /tmp/image.txt tabulate && "
                   "/tmp/venv/bin/python -c \"import tabulate, horovod.tensorflow, numpy; "
                   "print('RESULT', numpy.__file__)\"")
    assert "RESULT /opt/venv/lib/" in out  # numpy is the image's, not a second copy in the venv
