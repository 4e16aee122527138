"""Checks of the base layer, run on every image of the stack."""
import re

from support.stack import CONFIG


def test_os_release_is_pinned(host, image_layer):
    os_release = host.file("/etc/os-release").content_string
    assert f'VERSION_CODENAME={CONFIG.os_release}' in os_release
    assert f'VERSION_ID="{CONFIG.os["version_id"]}"' in os_release


def test_python_is_pinned_and_from_the_venv(host, image_layer):
    assert host.check_output("command -v python") == "/opt/venv/bin/python"
    assert re.fullmatch(rf"Python {re.escape(CONFIG.os['python'])}\.\d+", host.check_output("python --version"))


def test_system_python_sees_the_venv(host, image_layer):
    # what ranks get when a launcher puts /usr/bin first in PATH (mpirun started by absolute path)
    paths = host.check_output("/usr/bin/python3 -c 'import sys; print(chr(10).join(sys.path))'").splitlines()
    assert f"/opt/venv/lib/python{CONFIG.os['python']}/site-packages" in paths


def test_runs_as_unprivileged_user(host, image_layer):
    assert host.user().name == "tfhpc"
    assert host.user().uid == 1000
    assert host.run("touch /opt/venv/bin/intruder").rc != 0, "the runtime user must not modify the venv"


def test_no_compiler_or_build_tools(host, image_layer):
    for tool in ("gcc", "g++", "cc", "c++", "cmake", "make"):
        assert not host.exists(tool), f"{tool} belongs in a builder stage, not in {image_layer}"
    assert not host.file(f"/usr/include/python{CONFIG.os['python']}/Python.h").exists


def test_no_package_lists_or_pip_cache(root_host, image_layer):
    assert root_host.check_output("find /var/lib/apt/lists -type f ! -name lock | wc -l") == "0"
    # The BuildKit cache mount leaves its empty mount point behind; no cached file may be in a layer.
    assert root_host.check_output("find /root/.cache -type f 2>/dev/null | wc -l") == "0"
