"""What a rank actually loaded: the MPI library, the PMIx library and the transport components, read from the
process's own memory map (/proc/self/maps) after MPI_Init. The doctor's probe calls these; the parsing is pure and
tested on the host (tests/unit/test_mpilib_fabric.py).

The MPI library by path is the proof that a host MPI (TFHPC_HOST_MPI) replaced the image's: a library of the same
name under /usr/lib means the swap did not happen, whatever LD_LIBRARY_PATH says, unless a site's MPI hook mounted
the host's library over the image's file there (Sarus, Shifter, `apptainer -B host.so:container-path`, `docker -v`):
/proc/self/mountinfo then lists that path as a mount point and names the file it came from (library_origin).
"""
import ctypes
import os
import re
from pathlib import Path

MPI_LIBRARY = re.compile(r"^lib(mpi|mpich|mpi_abi)\.so(\.\d+)*$")
PMIX_LIBRARY = re.compile(r"^libpmix\.so(\.\d+)*$")
OMPI_COMPONENT = re.compile(r"^mca_(pml|btl|mtl|osc|coll)_(\w+)\.so$")
FABRIC_LIBRARIES = {"libucp.so": "UCX", "libfabric.so": "libfabric (OFI)", "libpsm2.so": "PSM2",
                    "libibverbs.so": "verbs", "libcxi.so": "CXI (Slingshot)"}
FABRIC_PROVIDER = re.compile(r"^lib(\w+)-fi\.so$")


def mapped_files(maps_text):
    """The files mapped into a process, in first-seen order, from the text of /proc/PID/maps."""
    files = {}
    for line in maps_text.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/"):
            files.setdefault(fields[5].strip(), None)
    return list(files)


def _soname_base(name):
    return re.sub(r"(\.\d+)+$", "", name)


def loaded_view(paths):
    """{'mpi': [paths], 'pmix': [paths], 'components': {framework: [names]}, 'fabric': {what: path},
    'providers': [libfabric DSO providers]} from a list of mapped files."""
    view = {"mpi": [], "pmix": [], "components": {}, "fabric": {}, "providers": []}
    for path in paths:
        name = Path(path).name
        if MPI_LIBRARY.match(name):
            view["mpi"].append(path)
        elif PMIX_LIBRARY.match(name):
            view["pmix"].append(path)
        elif (match := OMPI_COMPONENT.match(name)):
            view["components"].setdefault(match.group(1), []).append(match.group(2))
        elif (match := FABRIC_PROVIDER.match(name)):
            view["providers"].append(match.group(1))
        elif _soname_base(name) in FABRIC_LIBRARIES:
            view["fabric"][FABRIC_LIBRARIES[_soname_base(name)]] = path
    return view


# Where the image's own libraries live (the system's, and /opt/venv/lib: the MPI=abi image's libmpi_abi.so.1): a
# library loaded from elsewhere was put first by LD_LIBRARY_PATH (a host MPI).
IMAGE_LIBRARY_DIRS = ("/usr/lib/", "/lib/", "/usr/lib64/", "/lib64/", "/opt/venv/lib/")


def _unescape(field):
    """A path field of /proc/PID/mountinfo: blanks, tabs, newlines and backslashes are octal escapes there."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_points(mountinfo_text):
    """{mount point: (root within its file system, source)} from the text of /proc/PID/mountinfo; for a file
    bind-mounted from the host, the root is the host file's path within its file system."""
    mounts = {}
    for line in mountinfo_text.splitlines():
        fields = line.split()
        if "-" not in fields[6:] or len(fields) < 7:
            continue
        separator = fields.index("-", 6)
        source = fields[separator + 2] if len(fields) > separator + 2 else ""
        mounts[_unescape(fields[4])] = (_unescape(fields[3]), source)
    return mounts


def library_origin(path, mounts, resolved=None):
    """Where the library `path` (as /proc/self/maps names it) comes from: ('mounted', 'root (source)') when the file,
    or the file a link at that path resolves to (`resolved`), is itself a mount point (a host library bound over the
    image's); ('image', path) under the image's library directories; ('elsewhere', path) otherwise (LD_LIBRARY_PATH
    or TFHPC_HOST_MPI put a directory first)."""
    for candidate in dict.fromkeys([path, resolved or path]):
        if candidate in mounts:
            root, source = mounts[candidate]
            return "mounted", f"{root} ({source})" if source else root
    if path.startswith(IMAGE_LIBRARY_DIRS):
        return "image", path
    return "elsewhere", path


def origins(paths, mountinfo_path="/proc/self/mountinfo"):
    """[{'path', 'origin', 'from'}] of each loaded MPI library (library_origin), read in this process."""
    try:
        mounts = mount_points(Path(mountinfo_path).read_text())
    except OSError:
        mounts = {}
    found = []
    for path in paths:
        resolved = os.path.realpath(path) if os.path.exists(path) else path
        origin, source = library_origin(path, mounts, resolved)
        found.append({"path": path, "origin": origin, "from": source})
    return found


def describe_transport(view, environ=os.environ):
    """One line: the transport the MPI library runs on, as far as the loaded files and the settings tell."""
    parts = []
    components = view["components"]
    if components.get("pml"):
        pml = components["pml"]
        text = f"Open MPI pml {','.join(pml)}"
        if "ob1" in pml and components.get("btl"):
            text += f" over btl {','.join(components['btl'])}"
        if components.get("mtl"):
            text += f", mtl {','.join(components['mtl'])}"
        parts.append(text)
    if view["fabric"]:
        parts.append("loaded " + ", ".join(f"{what} ({path})" for what, path in view["fabric"].items()))
    if view["providers"]:
        parts.append(f"libfabric provider libraries {','.join(view['providers'])}")
    settings = [f"{name}={environ[name]}" for name in sorted(environ)
                if re.match(r"^(OMPI_MCA_(pml|btl|mtl)|FI_PROVIDER|UCX_TLS|MPIR_CVAR_CH4_NETMOD|"
                            r"MPIR_CVAR_OFI_USE_PROVIDER|I_MPI_OFI_PROVIDER|I_MPI_FABRICS)$", name)]
    if settings:
        parts.append("set: " + " ".join(settings))
    return "; ".join(parts) or "not discoverable from the loaded libraries (MPI built without loadable components)"


def abi_version(paths):
    """MPI_Abi_get_version() of the first standard-ABI library (libmpi_abi.so.*) among `paths` (loaded already, by
    mpi4py), as "major.minor", or None: which version of the MPI 5.0 ABI the rank's library implements."""
    for path in paths:
        if Path(path).name.startswith("libmpi_abi.so"):
            try:
                function = ctypes.CDLL(path).MPI_Abi_get_version
            except (OSError, AttributeError):
                return None
            major, minor = ctypes.c_int(), ctypes.c_int()
            if function(ctypes.byref(major), ctypes.byref(minor)) == 0:
                return f"{major.value}.{minor.value}"
            return None
    return None


def pmix_version(path):
    """PMIx_Get_version() of the PMIx library at `path` (already loaded by the MPI), or None."""
    try:
        library = ctypes.CDLL(path)
        library.PMIx_Get_version.restype = ctypes.c_char_p
        return library.PMIx_Get_version().decode(errors="replace")
    except (OSError, AttributeError):
        return None


def probe_after_init():
    """Called in a rank after MPI_Init: the loaded view of this process plus the PMIx version."""
    view = loaded_view(mapped_files(Path("/proc/self/maps").read_text()))
    view["mpi"] = [str(Path(p).resolve()) if Path(p).exists() else p for p in view["mpi"]]
    view["pmix_version"] = pmix_version(view["pmix"][0]) if view["pmix"] else None
    view["transport"] = describe_transport(view)
    return view
