"""Which CPU this rank runs on, for the doctor: the machine the image's programs are built for (`uname -m`), the
processor /proc/cpuinfo describes, and whether the two disagree, which means the programs are emulated
(binfmt_misc and qemu-user run an image of another architecture, many times slower)."""
import platform
import re

# /proc/cpuinfo of Arm CPUs names them by implementer and part number (Arm's and NVIDIA's technical reference manuals).
ARM_PARTS = {
    (0x41, 0xd0c): "Arm Neoverse N1",
    (0x41, 0xd40): "Arm Neoverse V1",
    (0x41, 0xd49): "Arm Neoverse N2",
    (0x41, 0xd4f): "Arm Neoverse V2 (NVIDIA Grace)",
    (0x46, 0x001): "Fujitsu A64FX",
}
X86 = ("x86_64", "i686")
ARM = ("aarch64", "arm64")


def cpuinfo_fields(text):
    """The first processor's fields of /proc/cpuinfo: {name: value}."""
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return fields


def cpu_family(fields):
    """'x86_64' or 'aarch64' as far as /proc/cpuinfo tells (its fields differ by architecture), else None."""
    if "vendor_id" in fields or "model name" in fields and "flags" in fields:
        return "x86_64"
    if "CPU implementer" in fields or "Features" in fields:
        return "aarch64"
    return None


def cpu_name(fields):
    """A processor's name: x86's model name; an Arm part by implementer and part number."""
    if fields.get("model name"):
        return re.sub(r"\s+", " ", fields["model name"])
    try:
        implementer, part = int(fields["CPU implementer"], 16), int(fields["CPU part"], 16)
    except (KeyError, ValueError):
        return "unknown processor"
    return ARM_PARTS.get((implementer, part), f"Arm CPU implementer {implementer:#x} part {part:#x}")


def describe(machine=None, cpuinfo=None):
    """{"machine", "cpu", "emulated"}: emulated is True when /proc/cpuinfo describes a processor of another family
    than `uname -m` (qemu-user passes the host's /proc/cpuinfo through)."""
    machine = machine or platform.machine()
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as file:
                cpuinfo = file.read()
        except OSError:
            cpuinfo = ""
    fields = cpuinfo_fields(cpuinfo)
    family = cpu_family(fields)
    own = "x86_64" if machine in X86 else "aarch64" if machine in ARM else machine
    return {"machine": machine, "cpu": cpu_name(fields), "emulated": bool(family) and family != own}
