"""What the runtime tests share: the unprivileged user, the labels, the scratch directory and the smoke test's command
(its values are checked by support.collectives)."""
import os
import resource
from pathlib import Path

from support.collectives import DTYPES, SIZES
from support.stack import REPO_ROOT

# Every container (docker, podman) a runtime test starts carries this label, valued "<pid of pytest>:<purpose>", so
# that the leftovers of a killed run can be found (and are removed by the next run, conftest.py).
LABEL = "io.tfhpc.test-runtime"
SESSION = str(os.getpid())
WORK_ROOT = REPO_ROOT / "build" / "runtimes"  # session-<pid>/ below it: the tests' scratch, removed at the end
USER_UID = 1000  # the image's user tfhpc; the tests run the runtimes as this uid when they run as root

SMOKE = ["mpirun", "-np", "2", "tfhpc-smoke-collectives", "--sizes", ",".join(map(str, SIZES)),
         "--dtypes", ",".join(DTYPES)]


def label(purpose):
    return {LABEL: f"{SESSION}:{purpose}"}


def as_user(argv):
    """argv as run by the unprivileged uid 1000 (setpriv, no supplementary groups) when the tests run as root; as
    is otherwise (the caller is unprivileged already)."""
    if os.geteuid() != 0:
        return list(argv)
    return ["setpriv", f"--reuid={USER_UID}", f"--regid={USER_UID}", "--clear-groups", *argv]


def user_environment():
    """A minimal environment for the unprivileged user: nothing of the test runner's leaks into the container."""
    return {"USER": "tfhpc" if os.geteuid() == 0 else os.environ.get("USER", "user"), "HOME": "/tmp",
            "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def expected_uid():
    return USER_UID if os.geteuid() == 0 else os.getuid()


def run_in(container, command, user="tfhpc", timeout=600):
    """(exit status, stdout+stderr) of a bash command in the docker container `container`."""
    result = container.exec_run(["timeout", str(timeout), "bash", "-c", command], user=user)
    return result.exit_code, result.output.decode(errors="replace")


def podman_runroot(store):
    """The store's run directory: under /tmp, since podman refuses a runroot path of more than 50 characters and the
    checkout (where `store` lies, in build/runtimes/session-<pid>/) may be anywhere."""
    return Path("/tmp") / f"tfhpc-podman-{store.parent.name.removeprefix('session-')}"


def podman_base(store):
    """Rootful podman on a private store (never the host's /var/lib/containers), cgroupfs and file events (no
    systemd needed)."""
    return ["podman", "--root", str(store / "root"), "--runroot", str(podman_runroot(store)),
            "--storage-driver", "overlay", "--cgroup-manager", "cgroupfs", "--events-backend", "file"]


def podman_run_args():
    """`podman run` options: no network (one node), the test label, and the caller's own resource limits: rootful
    podman asks for more open files (2^20) than this host lets even root have without CAP_SYS_RESOURCE, and at most
    as many processes as the kernel's pid_max (measured: a higher nproc fails in runc's setrlimit)."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    nproc = [pid_max if limit == resource.RLIM_INFINITY else min(limit, pid_max)
             for limit in resource.getrlimit(resource.RLIMIT_NPROC)]
    options = ["--rm", "--network", "none", "--ulimit", f"nofile={nofile[0]}:{nofile[1]}",
               "--ulimit", f"nproc={nproc[0]}:{nproc[1]}"]
    for key, value in label("podman").items():
        options += ["--label", f"{key}={value}"]
    return options
