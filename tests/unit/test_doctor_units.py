"""Pure helpers of the doctor (scripts/doctor.py, helpers from tfhpc_runtime), on the host: the doctor imports no
TensorFlow or Horovod (it probes them in a child process)."""
import importlib.util
import sys

import pytest

from support.doctor import load_doctor
from tfhpc import REPO_ROOT
from tfhpc_runtime import gpu, hostenv


@pytest.mark.parametrize("code, version", [(21903, "2.19.3"), (20907, "2.9.7"), (2708, "2.7.8"), (0, "none"),
                                           (None, "none")])
def test_nccl_version_code_is_printed_as_nccl_does(code, version):
    assert gpu.nccl_version(code) == version


def test_the_doctor_loads_without_a_framework_and_uses_the_package():
    spec = importlib.util.spec_from_file_location("doctor_under_test", REPO_ROOT / "scripts" / "doctor.py")
    doctor = importlib.util.module_from_spec(spec)
    before = set(sys.modules)
    spec.loader.exec_module(doctor)
    assert doctor.nccl_version is gpu.nccl_version
    assert not {"tensorflow", "horovod", "numpy"} & {name.split(".")[0] for name in set(sys.modules) - before}



IMAGE_OMPI = {"paths": ["/usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4"],
              "version": "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022"}


@pytest.mark.parametrize("environ, foreign", [({"OMPI_VERSION": "5.9.1", "PRTE_LAUNCHED": "1"}, True),
                                              ({"OMPI_VERSION": "4.1.4"}, False),
                                              ({"PRTE_LAUNCHED": "1"}, True),
                                              ({}, False)])
def test_a_foreign_open_mpi_launcher_is_recognised(monkeypatch, environ, foreign):
    doctor = load_doctor()
    for name in ("OMPI_VERSION", "PRTE_LAUNCHED", "PMIX_VERSION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert doctor.foreign_open_mpi(IMAGE_OMPI) is foreign


def test_the_hybrid_mismatch_names_both_versions_and_the_fixes(monkeypatch):
    doctor = load_doctor()
    monkeypatch.setenv("OMPI_VERSION", "5.9.1")
    monkeypatch.setenv("PRTE_LAUNCHED", "1")
    monkeypatch.setenv("PMIX_VERSION", "5.9.1rc1")
    monkeypatch.setattr(doctor, "PMIX_LIBRARY_GLOBS", ())  # the image's libpmix, absent here (a host may have one)
    versions, fix = doctor.hybrid_mismatch(IMAGE_OMPI)
    assert versions == "host mpirun: Open MPI 5.9.1 (PRRTE, PMIx 5.9.1rc1); image: Open MPI 4.1.4 (PMIx unknown)"
    assert all(word in fix for word in ("Open MPI 4.1.x", "srun --mpi=pmix", "mpirun -np N", "TFHPC_HOST_MPI",
                                        "mpi4py alone"))


def test_a_host_mpi_that_was_not_loaded_fails_the_check(monkeypatch, tmp_path):
    doctor = load_doctor()
    for name in hostenv.HOST_INSTALL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(hostenv.HOST_MPI_VARIABLE, str(tmp_path))
    report = doctor.Report()
    doctor.check_mpi_library(report, IMAGE_OMPI, {})
    (check,) = report.checks
    assert check["status"] == doctor.FAIL and "the swap did not happen" in check["detail"] and check["fix"]
    swapped = {"paths": [f"{tmp_path}/lib/libmpi.so.40.40.1"], "version": "Open MPI v5.9.1, package: ..."}
    report = doctor.Report()
    doctor.check_mpi_library(report, swapped, {"loaded": {"transport": "Open MPI pml ob1 over btl sm,tcp"}})
    assert [c["status"] for c in report.checks] == [doctor.OK, doctor.INFO]
    assert report.checks[0]["detail"].startswith(f"host MPI from TFHPC_HOST_MPI={tmp_path}: ")


def test_leaked_host_variables_are_flagged_and_removed_ones_reported(monkeypatch):
    doctor = load_doctor()
    monkeypatch.delenv(hostenv.HOST_MPI_VARIABLE, raising=False)
    monkeypatch.setenv("OPAL_PREFIX", "/opt/site/openmpi")
    monkeypatch.setenv(hostenv.REMOVED_VARIABLE, "PMIX_PREFIX")
    report = doctor.Report()
    doctor.check_mpi_library(report, IMAGE_OMPI, {})
    assert [(c["status"], c["name"]) for c in report.checks] == [
        (doctor.INFO, "host variables"), (doctor.WARN, "host variables"), (doctor.OK, "library")]
    assert "unset OPAL_PREFIX" in report.checks[1]["fix"]


@pytest.mark.parametrize("wanted, status", [("cxi", "fail"), ("tcp", "info"), ("^cxi", "info"), ("", "info")])
def test_fabric_check_holds_fi_provider_against_the_providers_found(monkeypatch, wanted, status):
    doctor = load_doctor()
    monkeypatch.setattr(doctor.fabric, "providers", lambda library: {
        "library": "/usr/lib/x86_64-linux-gnu/libfabric.so.1", "version": "1.17", "providers": ["tcp", "shm"],
        "error": None, "source": "fi_getinfo of /usr/lib/x86_64-linux-gnu/libfabric.so.1"})
    monkeypatch.setenv("FI_PROVIDER", wanted)
    report = doctor.Report()
    doctor.check_fabric(report, {})
    (check,) = report.checks
    assert check["status"] == status
    assert "tcp, shm (libfabric 1.17 /usr/lib/x86_64-linux-gnu/libfabric.so.1; from fi_getinfo" in check["detail"]
    assert bool(check["fix"]) is (status == "fail")


def test_the_probe_error_skips_tensorflow_log_lines(monkeypatch):
    doctor = load_doctor()
    stderr = ("I0000 00:00:1795523255.881770 116 port.cc:153] oneDNN custom operations are on ... round-off errors\n"
              "tensorflow.python.framework.errors_impl.NotFoundError: /lib/x86_64-linux-gnu/libmpi_cxx.so.40: "
              "undefined symbol: ompi_mpi_errors_throw_exceptions\n")
    done = doctor.subprocess.CompletedProcess([], 1, stdout="", stderr=stderr)
    monkeypatch.setattr(doctor.subprocess, "run", lambda *a, **k: done)
    probe, error = doctor.run_probe(10)
    assert probe == {} and error.startswith("exit 1: tensorflow.python") and "oneDNN" not in error


def single_copy_check(environ, monkeypatch, parameter_file):
    doctor = load_doctor()
    monkeypatch.setattr(doctor, "OPEN_MPI_PARAMETER_FILE", str(parameter_file))
    report = doctor.Report()
    doctor.check_single_copy(report, environ)
    (check,) = [c for c in report.checks if c["name"] == "single copy"]
    return check


def test_doctor_reports_single_copy_and_how_to_get_it(monkeypatch, tmp_path):
    conf = tmp_path / "openmpi-mca-params.conf"
    conf.write_text("btl = ^openib\n# tfhpc\nbtl_vader_single_copy_mechanism = none\n")
    allowed = single_copy_check({"TFHPC_SINGLE_COPY": "cma", "OMPI_MCA_btl_vader_single_copy_mechanism": "cma"},
                                monkeypatch, conf)
    assert allowed["status"] == "ok" and "Open MPI 4 vader cma" in allowed["detail"]
    refused = single_copy_check({"TFHPC_SINGLE_COPY": "none: process_vm_readv: Operation not permitted"},
                                monkeypatch, conf)
    assert refused["status"] == "info" and "Open MPI 4 vader none" in refused["detail"]
    assert "--cap-add SYS_PTRACE" in refused["fix"]
    forced = single_copy_check({"TFHPC_SINGLE_COPY": "cma"}, monkeypatch, conf)   # the file's none, CMA allowed
    assert forced["status"] == "warn" and "unset" in forced["fix"]


@pytest.mark.parametrize("origins, status, words", [
    ([{"path": "/usr/lib/x86_64-linux-gnu/libmpich.so.12.3.0", "origin": "image", "from": ""}], "ok",
     ["the image's MPI: "]),
    ([{"path": "/usr/lib/x86_64-linux-gnu/libmpi.so.12", "origin": "mounted",
       "from": "/site/lib/libmpi.so.12 (/dev/sda1)"}], "ok",
     ["a host MPI mounted over the image's library: ", "from /site/lib/libmpi.so.12", "MPICH Version:\t9.1"]),
    ([{"path": "/site/lib/libmpi.so.12", "origin": "elsewhere", "from": "/site/lib/libmpi.so.12"}], "ok",
     ["a host MPI, not the image's (first on LD_LIBRARY_PATH): /site/lib/libmpi.so.12"]),
    ([{"path": "/site/lib/libmpi.so.12", "origin": "elsewhere", "from": "/site/lib/libmpi.so.12"},
      {"path": "/usr/lib/x86_64-linux-gnu/libmpich.so.12.3.0", "origin": "image", "from": ""}], "warn",
     ["and the image's /usr/lib/x86_64-linux-gnu/libmpich.so.12.3.0 as well"]),
])
def test_without_tfhpc_host_mpi_the_doctor_names_a_hooks_host_library(monkeypatch, origins, status, words):
    """A site's MPI hook, not TFHPC_HOST_MPI, put a host MPI in the image's place: the doctor says whose MPI it is."""
    doctor = load_doctor()
    monkeypatch.delenv(hostenv.HOST_MPI_VARIABLE, raising=False)
    for name in hostenv.HOST_INSTALL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    report = doctor.Report()
    library = {"paths": [o["path"] for o in origins], "version": "MPICH Version:\t9.1", "origins": origins}
    doctor.check_mpi_library(report, library, {})
    (check,) = report.checks
    assert check["status"] == status and all(word in check["detail"] for word in words), check


def test_keras_names_both_kerases_and_the_patches(tmp_path, monkeypatch):
    doctor = load_doctor()
    (tmp_path / "0001-mwms-first-batch-build.patch").write_text("")
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    report = doctor.Report()
    doctor.check_keras(report, {"keras": "3.99.1", "tf_keras": ["tf_keras", "9.8.7"]}, patch_dir=str(tmp_path))
    doctor.check_keras(report, {}, patch_dir=str(tmp_path))  # no probe (it failed): nothing said
    [check] = report.checks
    assert check["status"] == "info"
    assert check["detail"].startswith("`import keras` is Keras 3.99.1 (patched: 0001-mwms-first-batch-build.patch); "
                                      "tf.keras is tf_keras 9.8.7 (TF_USE_LEGACY_KERAS=1)")


@pytest.mark.parametrize("tf_config, phrase", [
    ("{not json", "is not valid JSON"),
    ('{"cluster": {"worker": ["node1:2222"]}, "task": {"type": "worker", "index": 3}}', "task index 3 is outside"),
    ('{"cluster": {"worker": ["node1"]}, "task": {"type": "worker", "index": 0}}', "host:port"),
])
def test_a_malformed_tf_config_fails_with_a_fix(monkeypatch, tf_config, phrase):
    doctor = load_doctor()
    monkeypatch.setenv("TF_CONFIG", tf_config)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    report = doctor.Report()
    doctor.check_tf_config(report, {"slurm_step": False})
    (entry,) = [c for c in report.checks if c["name"] == "TF_CONFIG"]
    assert entry["status"] == doctor.FAIL and phrase in entry["detail"] and entry["fix"], entry
