"""What a rank loaded (tfhpc_runtime.mpilib: MPI, PMIx and transport libraries from /proc/self/maps) and the libfabric
providers it can use (tfhpc_runtime.fabric), parsed on the host; the doctor reports both."""
from tfhpc_runtime import fabric, mpilib

MAPS = """\
7f0000000000-7f0000001000 r--p 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4
7f0000001000-7f0000002000 r-xp 00001000 08:01 1 /usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4
7f0000003000-7f0000004000 r--p 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so.2.9.2
7f0000005000-7f0000006000 r--p 00000000 08:01 3 /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/mca_pml_ob1.so
7f0000007000-7f0000008000 r--p 00000000 08:01 4 /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/mca_btl_vader.so
7f0000009000-7f000000a000 r--p 00000000 08:01 5 /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/mca_btl_tcp.so
7f000000b000-7f000000c000 r--p 00000000 08:01 6 /usr/lib/x86_64-linux-gnu/libfabric.so.1.18.0
7f000000d000-7f000000e000 rw-p 00000000 00:00 0 [heap]
7f000000f000-7f0000010000 rw-p 00000000 00:00 0
7f0000011000-7f0000012000 r--p 00000000 08:01 7 /usr/lib/x86_64-linux-gnu/libmpi_cxx.so.40.30.1
"""


def test_loaded_view_names_the_mpi_library_and_the_transport():
    view = mpilib.loaded_view(mpilib.mapped_files(MAPS))
    assert view["mpi"] == ["/usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4"]
    assert view["pmix"] == ["/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so.2.9.2"]
    assert view["components"] == {"pml": ["ob1"], "btl": ["vader", "tcp"]}
    text = mpilib.describe_transport(view, environ={"OMPI_MCA_pml": "ob1", "HOME": "/x"})
    assert text.startswith("Open MPI pml ob1 over btl vader,tcp; loaded libfabric (OFI) (")
    assert text.endswith("set: OMPI_MCA_pml=ob1")


def test_loaded_view_of_a_swapped_mpich_abi_library():
    maps = ("1-2 r--p 0 0:0 1 /opt/venv-impi/lib/libmpi.so.12.0.0\n"
            "3-4 r--p 0 0:0 2 /opt/venv-impi/lib/libfabric/libtcp-fi.so\n")
    view = mpilib.loaded_view(mpilib.mapped_files(maps))
    assert view["mpi"] == ["/opt/venv-impi/lib/libmpi.so.12.0.0"] and view["providers"] == ["tcp"]
    assert "libfabric provider libraries tcp" in mpilib.describe_transport(view, environ={})


# A host MPICH-ABI library bound over the image's libmpi.so.12 by a site's MPI hook (docker -v, apptainer -B): the
# mount point in the container, the host file as the root of the mount.
MOUNTINFO = """\
600 500 0:50 / / rw,relatime - overlay overlay rw,lowerdir=/var/lib/docker/l1
601 600 8:1 /w/site\\040mpi/mpich-9.1/lib/libmpi.so.12 /usr/lib/x86_64-linux-gnu/libmpi.so.12 ro,relatime - ext4 /dev/sda1 rw
602 600 8:1 /work/site-mpi /opt/site-mpi ro,relatime - ext4 /dev/sda1 rw
603 600 0:51 / /proc rw,nosuid - proc proc rw
"""


def test_a_library_mounted_over_the_images_is_named_by_its_host_file():
    mounts = mpilib.mount_points(MOUNTINFO)
    assert mounts["/usr/lib/x86_64-linux-gnu/libmpi.so.12"] == (
        "/w/site mpi/mpich-9.1/lib/libmpi.so.12", "/dev/sda1")
    origin = mpilib.library_origin("/usr/lib/x86_64-linux-gnu/libmpi.so.12", mounts)
    assert origin == ("mounted", "/w/site mpi/mpich-9.1/lib/libmpi.so.12 (/dev/sda1)")
    # maps names the link's target when the mount went over the file a link resolves to
    assert mpilib.library_origin("/usr/lib/x86_64-linux-gnu/libmpich.so.12.3.0", mounts,
                                 "/usr/lib/x86_64-linux-gnu/libmpi.so.12")[0] == "mounted"


def test_the_images_library_and_one_from_ld_library_path_are_told_apart():
    mounts = mpilib.mount_points(MOUNTINFO)
    assert mpilib.library_origin("/usr/lib/x86_64-linux-gnu/libmpich.so.12.3.0", mounts) == (
        "image", "/usr/lib/x86_64-linux-gnu/libmpich.so.12.3.0")
    assert mpilib.library_origin("/opt/site-mpi/mpich-9.1/lib/libmpi.so.12", mounts)[0] == "elsewhere"
    # the MPI=abi image's own library is the wheel's, in the venv
    assert mpilib.library_origin("/opt/venv/lib/libmpi_abi.so.1", mounts)[0] == "image"
    assert mpilib.library_origin("/opt/site-mpi/impi-rt-9/lib/libmpi_abi.so.1", mounts)[0] == "elsewhere"
    assert mpilib.loaded_view(["/opt/venv/lib/libmpi_abi.so.1"])["mpi"] == ["/opt/venv/lib/libmpi_abi.so.1"]


def test_origins_reads_this_process_mounts(tmp_path):
    (tmp_path / "mountinfo").write_text(MOUNTINFO)
    found = mpilib.origins(["/usr/lib/x86_64-linux-gnu/libmpi.so.12"], tmp_path / "mountinfo")
    assert found == [{"path": "/usr/lib/x86_64-linux-gnu/libmpi.so.12", "origin": "mounted",
                      "from": "/w/site mpi/mpich-9.1/lib/libmpi.so.12 (/dev/sda1)"}]
    assert mpilib.origins(["/x/libmpi.so.12"], tmp_path / "missing")[0]["origin"] == "elsewhere"


# ------------------------------------------------------------------------------------------------------------------ #
# libfabric providers


def test_fi_info_list_output_is_parsed():
    text = "psm2:\n    version: 117.0\ntcp:\n    version: 117.0\nofi_rxm:\n    version: 117.0\ntcp:\n"
    assert fabric.parse_fi_info_list(text) == ["psm2", "tcp", "ofi_rxm"]


def test_getinfo_output_is_parsed():
    assert fabric.parse_getinfo("version 1.17\nprovider tcp\nprovider shm\nprovider tcp\n") == ("1.17",
                                                                                               ["tcp", "shm"])


def test_provider_directories_are_scanned(tmp_path):
    providers = tmp_path / "lib" / "libfabric"
    providers.mkdir(parents=True)
    for name in ("libcxi-fi.so", "libefa-fi.so", "README"):
        (providers / name).write_text("")
    dirs = fabric.provider_dirs(str(tmp_path / "lib" / "libfabric.so.1"), environ={"FI_PROVIDER_PATH": "/none"})
    assert dirs == ["/none", str(providers)]
    assert fabric.scan_provider_dirs(dirs) == ["cxi", "efa"]
    result = fabric.providers(str(tmp_path / "lib" / "libfabric.so.1"), environ={"PATH": str(tmp_path)})
    assert result["providers"] == ["cxi", "efa"] and result["source"].startswith("provider libraries in")


def test_abi_version_only_for_a_standard_abi_library():
    """MPI_Abi_get_version is asked of libmpi_abi.so.* only (an MPICH-ABI library may export it too); a library that
    cannot be opened gives None, never an error in the doctor's probe. Its value is checked on the images
    (tests/sites/test_abi_host_mpi.py)."""
    assert mpilib.abi_version(["/usr/lib/x86_64-linux-gnu/libmpi.so.12"]) is None
    assert mpilib.abi_version(["/nonexistent/lib/libmpi_abi.so.1"]) is None
