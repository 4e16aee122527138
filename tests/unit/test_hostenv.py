"""The image's environment against the host's (tfhpc_runtime.hostenv): host install variables removed, the bind
model's TFHPC_HOST_MPI checked and applied, and the SIF's %environment in step with the module."""
import os
import pwd
import re
import subprocess

import pytest

from tfhpc import REPO_ROOT
from tfhpc_runtime import hostenv


def fake_mpi(root, *sonames, sub="lib"):
    directory = root / sub
    directory.mkdir(parents=True)
    for soname in sonames:
        (directory / soname).write_bytes(b"\x7fELF")
    return directory


# ------------------------------------------------------------------------------------------------------------------ #
# Host install variables


def test_host_install_variables_are_removed_and_recorded():
    environ = {"OPAL_PREFIX": "/opt/hpcx/ompi", "PMIX_INSTALL_PREFIX": "/opt/hpcx/ompi", "OPAL_LIBDIR": "/x",
               "PRTE_PREFIX": "/y", "PYTHONHOME": "/z", "PMIX_NAMESPACE": "job@1", "PMIX_SERVER_TMPDIR": "/tmp/p",
               "OMPI_MCA_btl_tcp_if_include": "eth0", "PATH": "/usr/bin"}
    changes = hostenv.apply(environ)
    assert set(environ) == {"PMIX_NAMESPACE", "PMIX_SERVER_TMPDIR", "OMPI_MCA_btl_tcp_if_include", "PATH",
                            hostenv.REMOVED_VARIABLE}
    assert sorted(environ[hostenv.REMOVED_VARIABLE].split(",")) == ["OPAL_LIBDIR", "OPAL_PREFIX",
                                                                   "PMIX_INSTALL_PREFIX", "PRTE_PREFIX", "PYTHONHOME"]
    assert changes["OPAL_PREFIX"] is None
    assert hostenv.apply(environ) == {}  # idempotent: the SIF's %environment, then the entrypoint


def test_empty_host_install_variables_go_unrecorded():
    environ = {"OPAL_PREFIX": "", "PMIX_LIBDIR": "", "OPAL_LIBDIR": "/x"}  # as the SIF's %environment leaves them
    hostenv.apply(environ)
    assert environ == {hostenv.REMOVED_VARIABLE: "OPAL_LIBDIR"}


def test_keep_variable_keeps_them():
    environ = {"OPAL_PREFIX": "/opt/ompi", hostenv.KEEP_VARIABLE: "1"}
    assert hostenv.apply(environ) == {} and environ["OPAL_PREFIX"] == "/opt/ompi"
    environ = {"OPAL_PREFIX": "/opt/ompi", hostenv.KEEP_VARIABLE: "0"}
    hostenv.apply(environ)
    assert "OPAL_PREFIX" not in environ


def sif_environment():
    definition = (REPO_ROOT / "recipes" / "app.def.in").read_text()
    return definition.split("\n%environment\n", 1)[1].split("\n%", 1)[0]


def test_the_sif_environment_empties_every_host_install_variable():
    exported = re.findall(r"\b([A-Z_]+)=(?=\s|\\|$)", sif_environment())
    assert sorted(exported) == sorted(hostenv.HOST_INSTALL_VARIABLES)
    for name in ("PMIX_NAMESPACE", "PMIX_RANK", "PMIX_SERVER_TMPDIR", "OMPI_COMM_WORLD_SIZE", "PRTE_LAUNCHED"):
        assert name not in hostenv.HOST_INSTALL_VARIABLES


def test_the_sif_environment_runs_under_sh():
    environ = {"PATH": "/usr/bin:/bin", "OPAL_PREFIX": "/host/ompi", "PMIX_RANK": "0"}
    done = subprocess.run(["sh", "-c", sif_environment() + "\nenv"], capture_output=True, text=True, env=environ)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "OPAL_PREFIX=" in lines and "PMIX_RANK=0" in lines and "TFHPC_SIF=1" in lines


# ------------------------------------------------------------------------------------------------------------------ #
# TFHPC_HOST_MPI


def test_mpich_image_gets_the_host_library_directory_first(tmp_path):
    """The MPICH images' mpi4py and Horovod load libmpi.so.12, the name the host library carries: no alias needed."""
    libdir = fake_mpi(tmp_path / "impi", "libmpi.so.12", "libmpi_abi.so")
    environ = {hostenv.HOST_MPI_VARIABLE: str(tmp_path / "impi"), "LD_LIBRARY_PATH": "/.singularity.d/libs",
               "OPAL_PREFIX": "/host/site"}
    changes = hostenv.apply(environ, family="mpich")
    assert environ["LD_LIBRARY_PATH"] == f"{libdir}:/.singularity.d/libs"
    assert environ["OPAL_PREFIX"] == "/host/site"  # host-MPI mode keeps the host's variables
    assert changes[hostenv.LIBDIR_VARIABLE] == str(libdir)
    assert not list(tmp_path.glob("tfhpc-hostmpi-*"))
    again = dict(environ)
    hostenv.apply(again, family="mpich")
    assert again["LD_LIBRARY_PATH"] == environ["LD_LIBRARY_PATH"]  # no duplicates when applied twice


def test_openmpi_image_takes_a_host_open_mpi_and_its_prefix(tmp_path):
    libdir = fake_mpi(tmp_path / "ompi5", "libmpi.so.40")
    environ = {hostenv.HOST_MPI_VARIABLE: str(tmp_path / "ompi5")}
    hostenv.apply(environ, family="openmpi")
    assert environ["LD_LIBRARY_PATH"] == str(libdir)
    assert environ["OPAL_PREFIX"] == str(tmp_path / "ompi5")
    # mpi4py's binary wheel would take the image's /opt/venv/lib/libmpi.so.40 by path: it is given the host's
    assert environ["MPI4PY_LIBMPI"] == str(libdir / "libmpi.so.40")
    assert "MPI4PY_LIBMPI" not in hostenv.apply(environ, family="openmpi")  # applied twice: set once
    chosen = {hostenv.HOST_MPI_VARIABLE: str(tmp_path / "ompi5"), "MPI4PY_LIBMPI": "/mine/libmpi.so.40"}
    hostenv.apply(chosen, family="openmpi")
    assert chosen["MPI4PY_LIBMPI"] == "/mine/libmpi.so.40"  # the caller's own choice is kept


@pytest.mark.parametrize("name, sub", [("impi", "lib"), ("ompi6", "lib/x86_64-linux-gnu")])
def test_abi_image_takes_any_host_library_of_the_standard_abi(tmp_path, name, sub):
    """The MPI=abi image's mpi4py and Horovod load libmpi_abi.so.1 (MPI 5.0 ABI): Intel MPI's lib/ (beside its
    libmpi.so.12), Open MPI 6's multiarch directory; nothing else is set (no OPAL_PREFIX)."""
    libdir = fake_mpi(tmp_path / name, "libmpi.so.12", "libmpi_abi.so.1", sub=sub)
    environ = {hostenv.HOST_MPI_VARIABLE: str(tmp_path / name)}
    changes = hostenv.apply(environ, family="abi")
    assert environ["LD_LIBRARY_PATH"] == str(libdir) and changes[hostenv.LIBDIR_VARIABLE] == str(libdir)
    assert "OPAL_PREFIX" not in environ


@pytest.mark.parametrize("family, present, words", [
    ("mpich", "libmpi.so.40", ["Open MPI", "libmpi.so.40", "MPI=openmpi", "libmpi.so.12"]),
    ("openmpi", "libmpi.so.12", ["MPICH ABI", "MPI=mpich"]),
    ("abi", "libmpi.so.12", ["MPICH ABI", "MPI=mpich", "libmpi_abi.so.1", "standard ABI"]),
    ("abi", "libmpi.so.40", ["Open MPI", "MPI=openmpi", "libmpi_abi.so.1"]),
    ("mpich", "libmpi_abi.so.1", ["standard ABI", "MPI=abi", "libmpi.so.12"]),
    ("abi", "libmpi_abi.so.0", ["libmpi_abi.so.0", "MPICH 5.0.0 or 5.0.1", "libmpi_abi.so.1", "MPICH 5.0 after 5.0.1"]),
    ("abi", "libmpi_abi.so.12", ["libmpi_abi.so.12", "MPICH 4.3", "libmpi_abi.so.1"]),
])
def test_a_library_of_the_other_abi_is_refused_in_one_line(tmp_path, family, present, words):
    fake_mpi(tmp_path / "host", present, sub="lib64")
    with pytest.raises(hostenv.HostMPIError) as error:
        hostenv.prepare({hostenv.HOST_MPI_VARIABLE: str(tmp_path / "host")}, family=family)
    message = str(error.value)
    assert "\n" not in message and all(word in message for word in words), message


@pytest.mark.parametrize("prefix, words", [("relative/mpich", ["absolute"]),
                                           ("/nonexistent/mpich", ["no such directory", "-B /nonexistent/mpich"])])
def test_a_missing_prefix_is_refused_with_the_mount_to_add(prefix, words):
    with pytest.raises(hostenv.HostMPIError) as error:
        hostenv.prepare({hostenv.HOST_MPI_VARIABLE: prefix}, family="mpich")
    assert all(word in str(error.value) for word in words)


def test_a_prefix_without_any_mpi_library_is_refused(tmp_path):
    (tmp_path / "lib").mkdir()
    with pytest.raises(hostenv.HostMPIError, match="has no libmpi.so.12"):
        hostenv.prepare({hostenv.HOST_MPI_VARIABLE: str(tmp_path)}, family="mpich")


def test_image_family_from_its_variable_or_the_library_it_carries(tmp_path):
    fake_mpi(tmp_path, "libmpich.so.12", "libmpi.so.12", sub="usr/lib/x86_64-linux-gnu")
    assert hostenv.image_mpi_family([f"{tmp_path}/usr/lib/*-linux-gnu"], environ={}) == "mpich"
    assert hostenv.image_mpi_family([f"{tmp_path}/nothing"], environ={}) is None
    assert hostenv.image_mpi_family([f"{tmp_path}/nothing"], environ={"TFHPC_MPI": "openmpi"}) == "openmpi"
    assert hostenv.image_mpi_family([f"{tmp_path}/nothing"], environ={"TFHPC_MPI": "abi"}) == "abi"
    fake_mpi(tmp_path / "opt" / "venv", "libmpi_abi.so.1")
    assert hostenv.image_mpi_family([f"{tmp_path}/opt/venv/lib"], environ={}) == "abi"


# ------------------------------------------------------------------------------------------------------------------ #
# TFHPC_HOST_LIBS: host library directories (libfabric, libcxi, PMI) next on the library path


def test_host_libs_follow_the_host_mpi(tmp_path):
    libdir = fake_mpi(tmp_path / "mpich", "libmpi.so.12")
    fabric = fake_mpi(tmp_path / "libfabric", "libfabric.so.1", sub="lib64")
    environ = {hostenv.HOST_MPI_VARIABLE: str(tmp_path / "mpich"), hostenv.HOST_LIBS_VARIABLE: str(fabric),
               "LD_LIBRARY_PATH": "/.singularity.d/libs"}
    hostenv.apply(environ, family="mpich")
    assert environ["LD_LIBRARY_PATH"].split(":") == [str(libdir), str(fabric), "/.singularity.d/libs"]


def test_host_libs_alone_go_first_for_the_images_mpi(tmp_path):
    fabric = fake_mpi(tmp_path / "libfabric", "libfabric.so.1")
    environ = {hostenv.HOST_LIBS_VARIABLE: f"{fabric}:", "LD_LIBRARY_PATH": "/usr/local/lib"}
    hostenv.apply(environ, family="mpich")
    assert environ["LD_LIBRARY_PATH"] == f"{fabric}:/usr/local/lib"


@pytest.mark.parametrize("value", ["relative/lib", "/no/such/lib"])
def test_a_host_libs_directory_that_is_not_there_is_refused(value):
    with pytest.raises(hostenv.HostMPIError) as error:
        hostenv.prepare({hostenv.HOST_LIBS_VARIABLE: value}, family="mpich")
    message = str(error.value)
    assert "\n" not in message and value in message and "-B" in message


def test_srun_pmi2_gives_mpich_the_ofi_network_module():
    slurm = {"SLURM_MPI_TYPE": "pmi2", "PMI_FD": "5"}
    assert hostenv.prepare(slurm)["MPIR_CVAR_CH4_NETMOD"] == "ofi"
    assert "MPIR_CVAR_CH4_NETMOD" not in hostenv.prepare({**slurm, "MPIR_CVAR_CH4_NETMOD": "ucx"}), "caller's choice"
    assert "MPIR_CVAR_CH4_NETMOD" not in hostenv.prepare({"SLURM_MPI_TYPE": "pmix", "PMIX_RANK": "0"})
    assert "MPIR_CVAR_CH4_NETMOD" not in hostenv.prepare({"PMI_FD": "5"}), "hydra's mpiexec reads whole lines"


# ------------------------------------------------------------------------------------------------------------------ #
# HOME where the runtime set none (enroot start without ENROOT_MOUNT_HOME)


def test_a_missing_home_comes_from_passwd_and_a_set_one_stays():
    environ = {"PATH": "/usr/bin"}
    assert hostenv.default_home(environ, home=lambda: "/home/tfhpc") == "/home/tfhpc"
    assert environ == {"PATH": "/usr/bin", "HOME": "/home/tfhpc"}
    environ = {"HOME": "/users/alice"}
    assert hostenv.default_home(environ, home=lambda: "/home/tfhpc") is None and environ == {"HOME": "/users/alice"}
    environ = {}
    assert hostenv.default_home(environ, home=lambda: None) is None and environ == {}  # a uid without passwd entry
    assert hostenv.user_home() == pwd.getpwuid(os.getuid()).pw_dir
