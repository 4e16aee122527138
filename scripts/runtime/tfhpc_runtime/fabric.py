"""The libfabric providers a rank can use, for the doctor: `fi_info -l` when the image or the host put it on PATH,
else libfabric itself asked through fi_getinfo(FI_PROV_ATTR_ONLY) (what `fi_info -l` does), else the provider
libraries found in libfabric's provider directories. Each way says which one answered.

Runs libfabric in a child process with a time limit: a provider that probes absent hardware must not hang the
doctor.
"""
import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

TIMEOUT = 30
FI_PROV_ATTR_ONLY = 1 << 54

# Runs in the child: argv[1] is the libfabric library to load. Prints one provider name per line.
GETINFO = r"""
import ctypes, sys
class FabricAttr(ctypes.Structure):
    _fields_ = [("fabric", ctypes.c_void_p), ("name", ctypes.c_char_p), ("prov_name", ctypes.c_char_p),
                ("prov_version", ctypes.c_uint32), ("api_version", ctypes.c_uint32)]
class Info(ctypes.Structure):
    pass
Info._fields_ = [("next", ctypes.POINTER(Info)), ("caps", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                 ("addr_format", ctypes.c_uint32), ("src_addrlen", ctypes.c_size_t),
                 ("dest_addrlen", ctypes.c_size_t), ("src_addr", ctypes.c_void_p), ("dest_addr", ctypes.c_void_p),
                 ("handle", ctypes.c_void_p), ("tx_attr", ctypes.c_void_p), ("rx_attr", ctypes.c_void_p),
                 ("ep_attr", ctypes.c_void_p), ("domain_attr", ctypes.c_void_p),
                 ("fabric_attr", ctypes.POINTER(FabricAttr))]
lib = ctypes.CDLL(sys.argv[1])
lib.fi_version.restype = ctypes.c_uint32
lib.fi_getinfo.argtypes = [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_void_p,
                           ctypes.POINTER(ctypes.POINTER(Info))]
version = lib.fi_version()
print(f"version {version >> 16}.{version & 0xffff}")
head = ctypes.POINTER(Info)()
status = lib.fi_getinfo(version, None, None, %d, None, ctypes.byref(head))
if status != 0:
    sys.exit(f"fi_getinfo returned {status}")
node = head
while node:
    attr = node.contents.fabric_attr
    if attr and attr.contents.prov_name:
        print("provider " + attr.contents.prov_name.decode())
    node = node.contents.next
lib.fi_freeinfo(head)
""" % FI_PROV_ATTR_ONLY


def parse_fi_info_list(text):
    """Provider names from `fi_info -l` output (a 'name:' line per provider, its version indented below)."""
    names = []
    for line in text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            names.append(line.rstrip()[:-1].strip())
    return list(dict.fromkeys(names))


def parse_getinfo(text):
    """(libfabric version, [providers]) from the GETINFO child's output."""
    version, names = None, []
    for line in text.splitlines():
        kind, _, value = line.partition(" ")
        if kind == "version":
            version = value
        elif kind == "provider":
            names.append(value)
    return version, list(dict.fromkeys(names))


def provider_dirs(library_path, environ=os.environ):
    """Where libfabric looks for provider libraries: FI_PROVIDER_PATH, then `libfabric/` beside the library."""
    dirs = [d for d in environ.get("FI_PROVIDER_PATH", "").split(":") if d]
    if library_path:
        dirs.append(str(Path(library_path).parent / "libfabric"))
    return dirs


def scan_provider_dirs(dirs):
    """Provider names from the lib<name>-fi.so files of `dirs`."""
    names = []
    for directory in dirs:
        for path in sorted(glob.glob(os.path.join(directory, "lib*-fi.so"))):
            names.append(Path(path).name[3:-len("-fi.so")])
    return list(dict.fromkeys(names))


def find_libfabric(candidates=()):
    """The libfabric library to ask: the one the MPI loaded (candidates), else the system's."""
    for path in candidates:
        if path and Path(path).exists():
            return path
    for pattern in ("/usr/lib/*-linux-gnu/libfabric.so.1", "/usr/lib64/libfabric.so.1", "/usr/lib/libfabric.so.1"):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def providers(libfabric=None, environ=os.environ, timeout=TIMEOUT):
    """{'source': how, 'providers': [...], 'library': path or None, 'version': str or None, 'error': str or None}."""
    fi_info = shutil.which("fi_info", path=environ.get("PATH"))
    result = {"library": libfabric, "version": None, "providers": [], "error": None}
    if fi_info:
        try:
            done = subprocess.run([fi_info, "-l"], capture_output=True, text=True, timeout=timeout)
            result.update(source=f"{fi_info} -l", providers=parse_fi_info_list(done.stdout))
            if done.returncode == 0:
                return result
            result["error"] = f"fi_info -l exit {done.returncode}"
        except subprocess.TimeoutExpired:
            result["error"] = f"fi_info -l gave no answer within {timeout} s"
    if libfabric:
        try:
            done = subprocess.run([sys.executable, "-c", GETINFO, libfabric], capture_output=True, text=True,
                                  timeout=timeout)
            if done.returncode == 0:
                version, names = parse_getinfo(done.stdout)
                result.update(source=f"fi_getinfo of {libfabric}", version=version, providers=names, error=None)
                return result
            result["error"] = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        except subprocess.TimeoutExpired:
            result["error"] = f"fi_getinfo gave no answer within {timeout} s"
    dirs = provider_dirs(libfabric, environ)
    result.update(source=f"provider libraries in {':'.join(dirs) or '(no directory)'}",
                  providers=scan_provider_dirs(dirs))
    return result
