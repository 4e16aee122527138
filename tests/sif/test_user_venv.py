"""Adding one's own packages to the SIF, as docs/training.md#adding-your-own-packages shows: a stacked venv in a
directory of the user's (here $HOME, which apptainer binds), pip constrained by the SIF's own package list: the package
is added, TensorFlow, Horovod and numpy stay the SIF's, and a script run with the venv's python trains on 2 ranks."""
import io
import tarfile

import pytest

from support.results import results
from tfhpc.common import default_ca_bundle, resolve_ca_bundle


@pytest.fixture(scope="module")
def ca_in_helper(apptainer_container):
    """The host's CA bundle at /tmp/host-ca.pem in the helper, for pip behind a TLS-intercepting proxy (or None)."""
    ca = resolve_ca_bundle(default_ca_bundle())
    if ca is None:
        return None
    data = ca.read_bytes()
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        member = tarfile.TarInfo("host-ca.pem")
        member.size, member.mode = len(data), 0o644
        tar.addfile(member, io.BytesIO(data))
    apptainer_container.put_archive("/tmp", archive.getvalue())
    return "/tmp/host-ca.pem"


@pytest.fixture(scope="module")
def venv(user_host, in_sif, ca_in_helper):
    env = f"--env PIP_CERT={ca_in_helper} " if ca_in_helper else ""
    user_host.check_output(f"rm -rf ~/venvs/mine && apptainer exec {in_sif} python -m venv --system-site-packages "
                           "--without-pip ~/venvs/mine")
    out = user_host.check_output(
        f"apptainer exec {env}{in_sif} sh -c 'pip list --format=freeze > /tmp/sif-packages.txt && "
        "~/venvs/mine/bin/python -m pip install --quiet --constraint /tmp/sif-packages.txt tabulate && "
        "~/venvs/mine/bin/python -m pip list --format=freeze'")
    return set(out.split()), set(user_host.check_output("cat /tmp/sif-packages.txt").split())


def test_the_venv_adds_the_package_and_keeps_the_sifs(venv):
    listed, sif_packages = venv
    assert [name.split("==")[0].lower() for name in listed - sif_packages] == ["tabulate"]
    assert sif_packages <= listed


def test_a_script_run_with_the_venvs_python_trains_on_two_ranks(user_host, in_sif, venv):
    script = ("import json, numpy, tabulate, horovod.tensorflow as hvd, tensorflow as tf; hvd.init(); "
              "s = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum).numpy()[0]; "
              "print('RESULT ' + json.dumps({'rank': hvd.rank(), 'size': hvd.size(), 'sum': float(s), "
              "'numpy': numpy.__file__}))")
    user_host.check_output(f"printf '%s\\n' \"{script}\" > ~/venvs/job.py")
    out = user_host.check_output(f"apptainer exec {in_sif} mpirun -np 2 ~/venvs/mine/bin/python ~/venvs/job.py")
    reports = results(out, 2)
    assert [(r["size"], r["sum"]) for r in reports] == [(2, 3.0), (2, 3.0)]
    assert all(r["numpy"].startswith("/opt/venv/lib/") for r in reports)  # the SIF's numpy, not a copy
