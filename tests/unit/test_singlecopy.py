"""Single-copy (CMA) decided at run time (tfhpc_runtime.singlecopy): the probe on this host, and what is set."""
from tfhpc_runtime import singlecopy


def test_the_probe_answers_without_leaving_processes():
    import os
    before = set(os.listdir("/proc"))
    refused = singlecopy.cma_probe()
    assert refused is None or refused.startswith("process_vm_readv: ")
    leftover = [p for p in set(os.listdir("/proc")) - before if p.isdigit()
                and open(f"/proc/{p}/stat").read().split()[3] == str(os.getpid())]
    assert leftover == []


def test_refused_cma_switches_mpichs_path_off_once():
    environ = {}
    changes = singlecopy.apply(environ, probe=lambda: "process_vm_readv: Operation not permitted")
    assert changes == {"TFHPC_SINGLE_COPY": "none: process_vm_readv: Operation not permitted",
                       "MPIR_CVAR_CH4_CMA_ENABLE": "0"}
    assert singlecopy.apply(environ, probe=lambda: 1 / 0) == {}   # decided: the children do not probe again


def test_allowed_cma_changes_nothing_but_the_record():
    assert singlecopy.prepare({}, probe=lambda: None) == {"TFHPC_SINGLE_COPY": "cma"}


def test_the_callers_setting_wins():
    changes = singlecopy.prepare({"MPIR_CVAR_CH4_CMA_ENABLE": "1"}, probe=lambda: "refused")
    assert "MPIR_CVAR_CH4_CMA_ENABLE" not in changes
