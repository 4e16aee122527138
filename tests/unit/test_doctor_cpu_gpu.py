"""The doctor's architecture and GPU compute-capability checks (tfhpc_runtime.cpuarch, tfhpc_runtime.gpu), on the host
with /proc/cpuinfo texts and nvidia-smi outputs as the machines print them: an x86 node, a GH200 node (Grace), an
arm64 image emulated on an x86 host, and the GPUs of the source documents' sites against TensorFlow's kernel list."""
import subprocess

import pytest

from support.doctor import load_doctor
from tfhpc_runtime import cpuarch, gpu

X86_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model name\t: Intel(R) Xeon(R)   Platinum 8480+
flags\t\t: fpu vme de pse avx512f

processor\t: 1
vendor_id\t: GenuineIntel
"""
GRACE_CPUINFO = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics sve2
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd4f
CPU revision\t: 0
"""
# TensorFlow 2.21's GPU wheel: tf.sysconfig.get_build_info()["cuda_compute_capabilities"]
TF_KERNELS = ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"]



@pytest.mark.parametrize("machine, cpuinfo, cpu, emulated", [
    ("x86_64", X86_CPUINFO, "Intel(R) Xeon(R) Platinum 8480+", False),
    ("aarch64", GRACE_CPUINFO, "Arm Neoverse V2 (NVIDIA Grace)", False),
    ("aarch64", X86_CPUINFO, "Intel(R) Xeon(R) Platinum 8480+", True),   # qemu-user passes the host's cpuinfo through
    ("x86_64", GRACE_CPUINFO, "Arm Neoverse V2 (NVIDIA Grace)", True),
    ("aarch64", "", "unknown processor", False),                          # nothing to compare: not called emulated
])
def test_the_processor_and_emulation_are_named(machine, cpuinfo, cpu, emulated):
    assert cpuarch.describe(machine, cpuinfo) == {"machine": machine, "cpu": cpu, "emulated": emulated}


def test_an_unknown_arm_part_is_named_by_its_numbers():
    text = GRACE_CPUINFO.replace("0xd4f", "0xabc")
    assert cpuarch.describe("aarch64", text)["cpu"] == "Arm CPU implementer 0x41 part 0xabc"


def test_emulation_is_a_warning_with_the_fix_and_native_is_ok():
    doctor = load_doctor()
    report = doctor.Report()
    doctor.check_architecture(report, cpuarch.describe("aarch64", X86_CPUINFO))
    doctor.check_architecture(report, cpuarch.describe("aarch64", GRACE_CPUINFO))
    emulated, native = report.checks
    assert emulated["status"] == "warn" and "emulated" in emulated["detail"] and "docs/arm64.md" in emulated["fix"]
    assert native["status"] == "ok" and native["detail"] == "aarch64, native: Arm Neoverse V2 (NVIDIA Grace)"


@pytest.mark.parametrize("capability, supported, how", [
    ("9.0", True, "PTX for compute_90"),      # H100, GH200: the wheel's PTX, compiled by the driver
    ("8.9", True, "kernels for sm_89"),       # L40S
    ("8.6", True, "kernels for sm_80"),       # A40: sm_80 cubins run on 8.x
    ("7.0", True, "kernels for sm_70"),       # V100
    ("10.0", True, "PTX for compute_90"),     # B200
    ("5.2", False, "do not run on compute capability 5.2"),
])
def test_compute_capability_against_tensorflows_kernels(capability, supported, how):
    ok, text = gpu.capability_support(capability, TF_KERNELS)
    assert ok is supported and how in text, text


def test_no_kernel_list_supports_nothing():
    assert gpu.capability_support("9.0", None) == (False, "TensorFlow's kernels (none) do not run on compute "
                                                          "capability 9.0")


def test_nvidia_smi_capabilities_are_read(monkeypatch):
    monkeypatch.setattr(gpu.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    seen = []

    def run(command, **kwargs):
        seen.append(command)
        return subprocess.CompletedProcess(command, 0, "NVIDIA GH200 480GB, 9.0\nNVIDIA GH200 480GB, 9.0\n", "")
    assert gpu.device_compute_capabilities(run) == [("NVIDIA GH200 480GB", "9.0")] * 2
    assert seen == [["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"]]
    monkeypatch.setattr(gpu.shutil, "which", lambda name: None)
    assert gpu.device_compute_capabilities(run) == []


def test_an_unsupported_gpu_fails_with_the_fix():
    doctor = load_doctor()
    report = doctor.Report()
    doctor.check_capabilities(report, [("NVIDIA GH200 480GB", "9.0"), ("Tesla M60", "5.2")], TF_KERNELS)
    grace, old = report.checks
    assert (grace["name"], grace["status"]) == ("compute capability 0", "ok") and "compute_90" in grace["detail"]
    assert old["status"] == "fail" and "Tesla M60" in old["detail"] and old["fix"]
    assert report.facts["gpu_capabilities"] == [("NVIDIA GH200 480GB", "9.0"), ("Tesla M60", "5.2")]
