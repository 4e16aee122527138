"""Single-copy (CMA) decided at run time (tfhpc_runtime.singlecopy): the probe on this host, and what is set."""
import os

from tfhpc_runtime import singlecopy


def parent_of(pid):
    """The parent pid of process `pid`, or None once it has ended (another worker's processes come and go)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[1]
    except (FileNotFoundError, ProcessLookupError):
        return None


def test_the_probe_answers_without_leaving_processes():
    before = set(os.listdir("/proc"))
    refused = singlecopy.cma_probe()
    assert refused is None or refused.startswith("process_vm_readv: ")
    leftover = [p for p in set(os.listdir("/proc")) - before if p.isdigit() and parent_of(p) == str(os.getpid())]
    assert leftover == []


def test_refused_cma_switches_every_mpis_path_off_once():
    environ = {}
    changes = singlecopy.apply(environ, outside=lambda: None, probe=lambda: "process_vm_readv: Operation not permitted")
    assert changes == {"TFHPC_SINGLE_COPY": "none: process_vm_readv: Operation not permitted",
                       "MPIR_CVAR_CH4_CMA_ENABLE": "0", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
                       "OMPI_MCA_smsc": "^cma"}
    assert singlecopy.apply(environ, outside=lambda: 1 / 0) == {}   # decided: the children do not probe again


def test_allowed_cma_turns_open_mpi_4s_single_copy_on():
    assert singlecopy.prepare({}, outside=lambda: None, probe=lambda: None) == {
        "TFHPC_SINGLE_COPY": "cma", "OMPI_MCA_btl_vader_single_copy_mechanism": "cma"}


def test_the_callers_setting_wins():
    changes = singlecopy.prepare({"MPIR_CVAR_CH4_CMA_ENABLE": "1", "OMPI_MCA_smsc": "xpmem"},
                                 outside=lambda: None, probe=lambda: "refused")
    assert "MPIR_CVAR_CH4_CMA_ENABLE" not in changes and "OMPI_MCA_smsc" not in changes
    assert changes["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none"
    kept = singlecopy.prepare({"OMPI_MCA_btl_vader_single_copy_mechanism": "emulated"}, outside=lambda: None,
                              probe=lambda: None)
    assert kept == {"TFHPC_SINGLE_COPY": "cma"}


def test_only_mpi_ranks_decide_at_interpreter_start(monkeypatch):
    calls = []
    monkeypatch.setattr(singlecopy, "apply", lambda environ: calls.append(dict(environ)) or {"TFHPC_SINGLE_COPY": "x"})
    assert singlecopy.at_rank_start({"PATH": "/usr/bin"}) == {} and calls == []         # pip, python3 -c, ...
    assert singlecopy.at_rank_start({"PMIX_RANK": "0", "TFHPC_SINGLE_COPY": "cma"}) == {} and calls == []
    assert singlecopy.at_rank_start({"OMPI_COMM_WORLD_SIZE": "2"}) == {"TFHPC_SINGLE_COPY": "x"}


def test_a_failing_decision_never_stops_the_interpreter(monkeypatch):
    monkeypatch.setattr(singlecopy, "apply", lambda environ: 1 / 0)
    assert singlecopy.at_rank_start({"PMI_RANK": "1"}) == {}


def fake_proc(root, own_ns, processes):
    """A /proc tree: processes = {pid: (comm, ppid, user namespace or None when it cannot be read)}."""
    (root / "self" / "ns").mkdir(parents=True)
    (root / "self" / "ns" / "user").symlink_to(own_ns)
    for pid, (comm, ppid, ns) in processes.items():
        (root / str(pid) / "ns").mkdir(parents=True)
        (root / str(pid) / "comm").write_text(comm + "\n")
        (root / str(pid) / "status").write_text(f"Name:\t{comm}\nPPid:\t{ppid}\n")
        if ns:
            (root / str(pid) / "ns" / "user").symlink_to(ns)
    return root


def test_a_launcher_outside_the_containers_namespace_rules_cma_out(tmp_path):
    # mpiexec -n 2 apptainer exec ...: rank <- starter <- hydra_pmi_proxy (another, unreadable user namespace)
    proc = fake_proc(tmp_path, "user:[2]", {10: ("starter", 9, None), 9: ("hydra_pmi_proxy", 8, None),
                                             8: ("mpiexec", 1, None)})
    assert singlecopy.launcher_outside(str(proc), pid=10) == "hydra_pmi_proxy"


def test_a_launcher_in_the_same_namespace_leaves_it_to_the_probe(tmp_path):
    # apptainer exec IMAGE.sif mpirun -np 2 ... (or docker run IMAGE mpirun ...): orted/mpirun beside the ranks
    proc = fake_proc(tmp_path, "user:[2]", {20: ("mpirun", 5, "user:[2]"), 5: ("starter", 1, None)})
    assert singlecopy.launcher_outside(str(proc), pid=20) is None
    assert singlecopy.launcher_outside(str(fake_proc(tmp_path / "b", "user:[2]", {30: ("bash", 1, "user:[2]")})),
                                       pid=30) is None


def test_ranks_of_an_outside_launcher_skip_the_probe_and_ucx_proc_links():
    changes = singlecopy.prepare({}, outside=lambda: "slurmstepd", probe=lambda: 1 / 0)
    assert changes["TFHPC_SINGLE_COPY"].startswith("none: each rank in its own user namespace (slurmstepd")
    assert changes["MPIR_CVAR_CH4_CMA_ENABLE"] == "0" and changes["UCX_POSIX_USE_PROC_LINK"] == "n"


def test_a_wheels_launcher_outside_is_seen_by_its_name(tmp_path):
    # the PyPI Open MPI 4.1 wheel: mpirun runs as orterun_wrapper, outside the rank's user namespace
    proc = fake_proc(tmp_path, "user:[2]", {10: ("starter", 9, None), 9: ("orterun_wrapper", 1, None)})
    assert singlecopy.launcher_outside(str(proc), pid=10) == "orterun_wrapper"
