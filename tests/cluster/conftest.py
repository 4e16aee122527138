"""Multi-node tests: containers as nodes on their own docker network (tests/cluster/harness.py).

`image_cluster`: 2 nodes of the app image (+ sshd): mpirun/horovodrun across nodes, MWMS with TF_CONFIG.
`slurm_cluster`: slurmctld + 2 slurmd nodes that run the SIF with apptainer, as a site does; jobs are the shipped
Slurm scripts (scripts/slurm/). build/sif is /sif, the site MPIs (tests/support/site_mpi.py) are /opt/site-mpi and the app
image as a Charliecloud directory image is /ch/app on every node. Clusters are removed after the module, also when a test fails; a failing test's
output ends with every node's log (the `cluster_report` hook below).
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest


from harness import Cluster, image_node_image, slurm_node_image
from support.ch_images import directory_image
from support.markers import mark_directory
from support.site_mpi import MOUNT, SITE_MPI_DIR, install_site_mpi
from support.stack import CONFIG, MANIFEST, REPO_ROOT
from tfhpc.apptainer import build_helper_image
from tfhpc.common import resolve_ca_bundle
from tfhpc.sif import SIF_DIR, sif_path

CA_BUNDLE = resolve_ca_bundle(os.environ.get("CA_BUNDLE") or os.environ.get("PIP_CERT") or
                              ("/etc/ssl/certs/ca-certificates.crt"
                               if Path("/etc/ssl/certs/ca-certificates.crt").is_file() else None))
NODES = ["node1", "node2"]
CLUSTERS = []


def pytest_collection_modifyitems(items):
    mark_directory(items, __file__, pytest.mark.cluster)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for cluster in CLUSTERS:
            report.sections.append((f"cluster {cluster.name}", cluster.report()))


def started(cluster):
    CLUSTERS.append(cluster)
    return cluster


@pytest.fixture(scope="module")
def image_cluster():
    image = image_node_image(CONFIG, CA_BUNDLE)
    cluster = started(Cluster.start(image, NODES))
    try:
        yield cluster
    finally:
        CLUSTERS.remove(cluster)
        cluster.stop()


@pytest.fixture(scope="module")
def sif():
    path = sif_path(CONFIG, MANIFEST.layers.leaf)
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make sif` first")
    return f"/sif/{path.name}"


@pytest.fixture(scope="module")
def ch_directory_image(tmp_path_factory):
    """The app image as a Charliecloud directory image (tests/support/ch_images.py, as tests/runtimes makes it), for
    `srun ... ch-run` on the Slurm nodes."""
    from tfhpc.dockerhost import client
    work = tmp_path_factory.mktemp("charliecloud")
    target = directory_image(client(), client().images.get(CONFIG.image(MANIFEST.layers.leaf)), work, work / "app")
    work.chmod(0o755)
    yield target
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm_cluster(sif, ch_directory_image, tmp_path_factory):
    helper = build_helper_image(MANIFEST, CONFIG, os.environ.get("BASE_SOURCE") or "auto", CA_BUNDLE)
    image = slurm_node_image(MANIFEST, CONFIG, CA_BUNDLE, helper)
    services = {"ctl": ["munged", "slurmctld", "sshd"], **{n: ["munged", "slurmd", "sshd"] for n in NODES}}
    shared = tmp_path_factory.mktemp("slurm-jobs")  # job output, on every node as on a shared file system
    shared.chmod(0o777)
    install_site_mpi("mpich")  # the host MPI of the bind-model job (test_slurm.py)
    volumes = {str(SIF_DIR): "/sif:ro", str(REPO_ROOT / "scripts" / "slurm"): "/jobs/scripts:ro",
               str(shared): "/jobs/out", str(SITE_MPI_DIR): f"{MOUNT}:ro", str(ch_directory_image): "/ch/app:ro"}
    cluster = started(Cluster.start(image, ["ctl", *NODES], services=services, volumes=volumes, apptainer=True,
                                    slurm="ctl"))
    try:
        rc, out = cluster.run("ctl", "for i in $(seq 60); do sinfo -h -o '%T %D' | grep -q '^idle 2' && exit 0; "
                                     "sleep 1; done; sinfo; exit 1", timeout=90)
        assert rc == 0, f"Slurm nodes did not become idle:\n{out}"
        yield cluster
    finally:
        CLUSTERS.remove(cluster)
        cluster.stop()
