"""The image's environment against the host's: what a runtime lets in from the host (Apptainer, Charliecloud and
enroot pass the caller's environment), and the bind model, a host MPI library used in place of the image's.

The jobs below, one entry point (`prepare`; `default_home` for item 5), applied by tfhpc-entrypoint before any
command of the image: every tfhpc-NAME command, `docker run IMAGE ...`, `apptainer run IMAGE.sif ...` and the SIF's
apps.

1. Host install variables (OPAL_PREFIX and the other install-directory overrides of Open MPI, PMIx and PRRTE, and
   PYTHONHOME) describe the host's installation. Let in, they point the image's Open MPI at a directory that does not
   exist in the container, and its opal_init fails (measured: Open MPI 5's mpirun passes its own OPAL_PREFIX to the
   ranks). They are removed, and their names recorded in TFHPC_HOST_ENV_REMOVED; TFHPC_KEEP_HOST_ENV=1 keeps them.
   The SIF also empties them in %environment, for commands that `apptainer exec` starts directly: Apptainer
   (1.4) hides host variables from %environment and adds them afterwards unless the image set them, so that is
   an unconditional `export NAME=` of each (recipes/app.def.in; a unit test holds the list to this one), which
   `apptainer exec --env NAME=value` overrides.
2. TFHPC_HOST_MPI=<prefix> (a directory the runtime mounts into the container) puts that MPI's library first on
   LD_LIBRARY_PATH, after checking that it has the image's ABI: MPICH images need `libmpi.so.12` (the MPICH ABI:
   MPICH, Intel MPI, Cray MPICH, MVAPICH), Open MPI images `libmpi.so.40`, the MPI=abi images `libmpi_abi.so.1`
   (the MPI 5.0 standard ABI: MPICH 5.0 after 5.0.1, Intel MPI >= 2021.19, Open MPI >= 6.0; an earlier soname of it,
   MPICH 4.3's libmpi_abi.so.12 or 5.0.0/5.0.1's libmpi_abi.so.0, is refused by name). The images' mpi4py and
   Horovod load their MPI by that name (containers/mpi/Dockerfile: mpi-relink, mpi-abi-relink), so the host's
   directory first is all it takes, as with a site's own MPI hook. In that mode host install variables are kept (they are the host MPI's), and
   OPAL_PREFIX defaults to the prefix for an Open MPI. A prefix that is missing or of the wrong ABI is one line
   (HostMPIError) and a non-zero exit, never the image's MPI kept silently.
3. TFHPC_HOST_LIBS=<dir>[:<dir>...]: host library directories put next on LD_LIBRARY_PATH (after the host MPI's, if
   any): what the host MPI needs from elsewhere (libfabric, libcxi, PMI), or, alone, a host libfabric in place of the
   image's for the image's own MPI (the model of the CSCS Container Engine's CXI hook). Each must exist.
4. Under `srun --mpi=pmi2` (SLURM_MPI_TYPE=pmi2, a PMI_FD) MPICH's network module is OFI unless the caller chose
   (MPIR_CVAR_CH4_NETMOD): Slurm's pmi2 plugin reads a PMI-1 request with one read of at most 1024 bytes
   (src/plugins/mpi/pmi2/pmi1.c, handle_pmi1_cmd: "TODO: read until newline"), and MPICH's UCX module publishes
   worker addresses in longer `put` requests, which it misparses ("mpi/pmi2: value not properly terminated in client
   request"; also https://github.com/ufs-community/ufs-weather-model/issues/1732); MPI_Init then waits until the
   time limit. Measured with PyPI's MPICH 5 (UCX and OFI built in) starting Horovod on 2 Slurm 22.05 nodes: 3 of 4
   starts hung with UCX, 5 of 5 started with OFI. Its PMI-2 wire protocol (MPIR_CVAR_PMI_VERSION=2) failed in
   MPIR_pmi_init. MPI libraries without that variable (Intel MPI, Cray MPICH, Open MPI) ignore it.
5. No HOME (`enroot start` without ENROOT_MOUNT_HOME passes /etc/environment's variables only): the user's home from
   the image's passwd. Open MPI 5's mpirun stops without one ("Unable to get the user home directory", measured).
"""
import glob
import os
import pwd
from pathlib import Path


KEEP_VARIABLE = "TFHPC_KEEP_HOST_ENV"
HOST_MPI_VARIABLE = "TFHPC_HOST_MPI"
HOST_LIBS_VARIABLE = "TFHPC_HOST_LIBS"
NETMOD_VARIABLE = "MPIR_CVAR_CH4_NETMOD"
REMOVED_VARIABLE = "TFHPC_HOST_ENV_REMOVED"     # what was removed, for the doctor
LIBDIR_VARIABLE = "TFHPC_HOST_MPI_LIBDIR"       # the host library directory put first, for the doctor
MPI4PY_LIBRARY_VARIABLE = "MPI4PY_LIBMPI"       # the MPI library mpi4py's binary wheel loads (mpi4py/_mpiabi.py)

# Install-directory overrides read by Open MPI (opal installdirs "env" component), OpenPMIx (pinstalldirs; its prefix is
# PMIX_INSTALL_PREFIX, PMIX_PREFIX in old releases and as Open MPI 5's launcher passes it on) and PRRTE
# (prteinstalldirs): the prefix and the directories searched at run time (programs, components, help and parameter
# files). Not PMIx's run-time variables (PMIX_NAMESPACE, PMIX_SERVER_TMPDIR, ...): the launcher sets those.
_INSTALL_DIRS = ("PREFIX", "EXEC_PREFIX", "BINDIR", "LIBDIR", "DATADIR", "SYSCONFDIR", "PKGDATADIR", "PKGLIBDIR")
HOST_INSTALL_VARIABLES = (*(f"{family}_{name}" for family in ("OPAL", "PMIX", "PRTE") for name in _INSTALL_DIRS),
                          "PMIX_INSTALL_PREFIX", "PYTHONHOME")

# The MPI library sonames of the ABI families, which the images' bindings (mpi4py, Horovod) also load; "abi" is the
# MPI 5.0 standard ABI of the MPI=abi images.
ABI_SONAMES = {"abi": "libmpi_abi.so.1", "mpich": "libmpi.so.12", "openmpi": "libmpi.so.40"}
FAMILY_NAMES = {"abi": "the MPI 5.0 standard ABI (MPICH 5.0 after 5.0.1, Intel MPI >= 2021.19, Open MPI >= 6.0)",
                "mpich": "the MPICH ABI (MPICH, Intel MPI, Cray MPICH, MVAPICH)", "openmpi": "Open MPI (4.x, 5.x)"}
# Standard-ABI libraries under sonames that came before the MPI 5.0 ABI's libmpi_abi.so.1 (pmodels/mpich#7337,
# #7928): the same header, another name, which this image's mpi4py and Horovod do not load.
EARLIER_ABI_SONAMES = {"libmpi_abi.so.0": "MPICH 5.0.0 or 5.0.1", "libmpi_abi.so.12": "MPICH 4.3"}
LIBRARY_SUBDIRS = ("lib", "lib64", "lib/release", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu")
# Where the images carry their MPI library: the system's directories, and the MPI=abi image's wheel (/opt/venv/lib).
SYSTEM_LIBRARY_GLOBS = ("/usr/lib/*-linux-gnu", "/usr/lib64", "/usr/lib", "/lib/*-linux-gnu", "/opt/venv/lib")


class HostMPIError(Exception):
    """TFHPC_HOST_MPI cannot be honoured; the message (one line) names the problem and the fix."""


def image_mpi_family(system_dirs=SYSTEM_LIBRARY_GLOBS, environ=os.environ):
    """'abi', 'mpich' or 'openmpi': which MPI the image's bindings link (TFHPC_MPI, which the mpi layer sets, else
    the library the image carries), or None."""
    if environ.get("TFHPC_MPI") in ABI_SONAMES:
        return environ["TFHPC_MPI"]
    for family in ("abi", "mpich", "openmpi"):
        for pattern in system_dirs:
            if any(Path(d, ABI_SONAMES[family]).exists() for d in glob.glob(pattern)):
                return family
    return None


def check_prefix(prefix):
    """HostMPIError unless `prefix` is an absolute path to a directory (as mounted in the container)."""
    variable = f"{HOST_MPI_VARIABLE}={prefix}"
    if not Path(prefix).is_absolute():
        raise HostMPIError(f"{variable} is not an absolute path: give the MPI installation's prefix as mounted in the "
                           "container (e.g. /opt/cray/pe/mpich/8.1.28/ofi/gnu/12.3)")
    if not Path(prefix).is_dir():
        raise HostMPIError(f"{variable}: no such directory in the container: mount the host MPI at that path "
                           f"(apptainer exec -B {prefix} ..., docker run -v {prefix}:{prefix}:ro ...)")


def host_library_dir(prefix, family):
    """The directory under `prefix` holding the MPI library of `family`'s ABI; HostMPIError when there is none,
    naming what is there instead (another ABI's library, or nothing)."""
    check_prefix(prefix)
    root = Path(prefix)
    variable = f"{HOST_MPI_VARIABLE}={prefix}"
    wanted = ABI_SONAMES[family]
    found_other = earlier = None
    for sub in LIBRARY_SUBDIRS:
        directory = root / sub
        if (directory / wanted).exists():
            return directory
        for other, soname in ABI_SONAMES.items():
            if other != family and found_other is None and (directory / soname).exists():
                found_other = (other, directory / soname)
        for soname in EARLIER_ABI_SONAMES:
            if family == "abi" and earlier is None and (directory / soname).exists():
                earlier = directory / soname
    if earlier:
        raise HostMPIError(f"{variable} has {earlier}, the standard ABI under the soname of "
                           f"{EARLIER_ABI_SONAMES[earlier.name]}, but this image's mpi4py and Horovod load {wanted}, "
                           f"the MPI 5.0 ABI's: use an MPI that ships {wanted} (MPICH 5.0 after 5.0.1, Intel MPI >= "
                           "2021.19, Open MPI >= 6.0)")
    if found_other:
        other, path = found_other
        raise HostMPIError(f"{variable} has {path}, {FAMILY_NAMES[other]}, but this image's MPI is "
                           f"{FAMILY_NAMES[family]}, library {wanted}: use the {other} image (MPI={other}), or a "
                           f"host MPI of this image's family")
    raise HostMPIError(f"{variable} has no {wanted} in {', '.join(LIBRARY_SUBDIRS)}: give the prefix (the directory "
                       f"above lib/) of an MPI of {FAMILY_NAMES[family]}")


def _prepend_path(value, *entries):
    parts = [p for p in (value or "").split(":") if p]
    new = [str(e) for e in entries]
    return ":".join(new + [p for p in parts if p not in new])


def user_home():
    """The home directory of this process's user in the image's passwd, or None."""
    try:
        return pwd.getpwuid(os.getuid()).pw_dir or None
    except KeyError:
        return None


def default_home(environ=None, home=user_home):
    """Item 5 of the module's docstring: HOME from passwd where the runtime set none; returns what it set, or None."""
    environ = os.environ if environ is None else environ
    if environ.get("HOME"):
        return None
    found = home()
    if found:
        environ["HOME"] = found
    return found


def prepare(environ, family=None):
    """The changes to make to `environ` (a mapping) before a command of the image runs: {name: value or None for
    unset}. Raises HostMPIError for a TFHPC_HOST_MPI that cannot be honoured."""
    changes = {}
    prefix = environ.get(HOST_MPI_VARIABLE, "")
    keep = environ.get(KEEP_VARIABLE, "") not in ("", "0") or bool(prefix)
    if not keep:
        # Empty ones go too, unrecorded: the SIF's %environment leaves them so, and they mean nothing.
        changes.update({name: None for name in HOST_INSTALL_VARIABLES if name in environ})
        removed = [name for name in HOST_INSTALL_VARIABLES if environ.get(name)]
        if removed:
            earlier = [n for n in environ.get(REMOVED_VARIABLE, "").split(",") if n]
            changes[REMOVED_VARIABLE] = ",".join(dict.fromkeys(earlier + removed))
    if environ.get("SLURM_MPI_TYPE") == "pmi2" and environ.get("PMI_FD") and NETMOD_VARIABLE not in environ:
        changes[NETMOD_VARIABLE] = "ofi"
    host_libs = [d for d in environ.get(HOST_LIBS_VARIABLE, "").split(":") if d]
    for directory in host_libs:
        if not Path(directory).is_absolute() or not Path(directory).is_dir():
            raise HostMPIError(f"{HOST_LIBS_VARIABLE}: {directory} is not a directory in the container: mount it "
                               f"(apptainer exec -B {directory} ..., docker run -v {directory}:{directory}:ro ...)")
    if not prefix:
        if host_libs:
            changes["LD_LIBRARY_PATH"] = _prepend_path(environ.get("LD_LIBRARY_PATH"), *host_libs)
        return changes
    check_prefix(prefix)
    family = family or image_mpi_family()
    if family is None:
        raise HostMPIError(f"{HOST_MPI_VARIABLE} is set, but this image carries none of "
                           f"{', '.join(ABI_SONAMES.values())}: it has no MPI to replace")
    library_dir = host_library_dir(prefix, family)
    if family == "openmpi" and not environ.get("OPAL_PREFIX"):
        changes["OPAL_PREFIX"] = prefix   # a relocated Open MPI (a wheel, a moved tree) finds its files by it
    changes["LD_LIBRARY_PATH"] = _prepend_path(environ.get("LD_LIBRARY_PATH"), library_dir, *host_libs)
    changes[LIBDIR_VARIABLE] = str(library_dir)
    if MPI4PY_LIBRARY_VARIABLE not in environ:
        # mpi4py's binary wheel looks for its MPI library in the venv's lib/ before the loader's search: there it finds
        # the image's Open MPI (PyPI's wheel in /opt/venv) by path, whatever LD_LIBRARY_PATH says, while Horovod loads
        # libmpi.so.40 by name, the host's: two MPI libraries in one rank. Named, the host library is mpi4py's too.
        changes[MPI4PY_LIBRARY_VARIABLE] = str(library_dir / ABI_SONAMES[family])
    return changes


def apply(environ=None, **options):
    """prepare() applied to `environ` (default: os.environ), in place; returns the changes."""
    environ = os.environ if environ is None else environ
    changes = prepare(environ, **options)
    for name, value in changes.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    return changes
