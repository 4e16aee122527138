"""Multi-node test harness: N containers on their own docker network, each a node with its own hostname and address,
ssh between them with a key pair made per run, optionally munge + Slurm (slurmctld on one node, slurmd on the rest).

    with Cluster.start(image, ["node1", "node2"]) as cluster:
        cluster.run("node1", "mpirun -H node1,node2 -np 2 hostname")

Nodes are always removed, also when a test fails; `Cluster.report()` gives every node's log and says which nodes are
not running (a killed node). Node images are test infrastructure (tests/cluster/nodes/), built on the app image (image
nodes) or on the SIF builder image (Slurm nodes, which run the SIF with apptainer); no key is ever stored in them.
"""
from __future__ import annotations

import io
import secrets
import tarfile
import tempfile
import time
from pathlib import Path

from support import oversubscription
from tfhpc.apptainer import HELPER_HOST_CONFIG
from tfhpc.imagebuild import build_image
from tfhpc.common import REPO_ROOT, UserError
from tfhpc.dockerhost import client
from tfhpc.manifest import Config, Manifest

# Every container and network of a test cluster carries this label: `make clean` removes the ones a killed test run
# left behind by it (tfhpc/clean.py), without importing this harness.
LABEL = "io.tfhpc.test-cluster"

NODES_DIR = REPO_ROOT / "tests" / "cluster" / "nodes"
USER = "tfhpc"
HOME = f"/home/{USER}"
SSH_CONFIG = "Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
CRED_EXPIRE = 15  # seconds (slurm_conf); Slurm's minimum is 5
LOG_FILES = ("/var/log/sshd.log", "/var/log/slurm/slurmctld.log", "/var/log/slurm/slurmd.log")


def image_node_image(config: Config, ca_bundle: Path | None) -> str:
    """The app image plus an ssh server (tests/cluster/nodes/image-node.Dockerfile)."""
    name = f"tfhpc-test-node:{config.tag}"
    return build_image(config, NODES_DIR / "image-node.Dockerfile", name, config.image("app"), ca_bundle)


def slurm_node_image(manifest: Manifest, config: Config, ca_bundle: Path | None, helper: str) -> str:
    """The SIF builder image plus Slurm, munge and an ssh server (tests/cluster/nodes/slurm-node.Dockerfile)."""
    missing = [key for key in ("slurm_package_version", "slurm_pmix_package") if not config.os.get(key)]
    if missing:
        raise UserError(f"{manifest.path}: [os.{config.os_release}] has no {' or '.join(missing)}, which the Slurm "
                        "tests need: add them (Debian's slurmd version and the PMIx runtime package)")
    version = config.os["slurm_package_version"]
    name = f"tfhpc-test-slurm-node:{version.replace('+', '_')}"
    return build_image(config, NODES_DIR / "slurm-node.Dockerfile", name, helper, ca_bundle,
                       extra_args={"SLURM_PACKAGE_VERSION": version, "PMIX_PACKAGE": config.os["slurm_pmix_package"]})


def slurm_conf(controller: str, nodes: list[str], cpus: int) -> str:
    """A minimal Slurm configuration for containers: no cgroups (linuxproc tracking, no task binding), munge auth,
    short timeouts so that a dead node ends its job within a minute. cred_expire: a job requeued after its step was
    killed waits this long before it may start again (Slurm's default 120 s; the step credential's lifetime, which
    only has to outlast a step launch here: no prolog, no user environment to load)."""
    return "\n".join([
        "ClusterName=tfhpc-test", f"SlurmctldHost={controller}", "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=cred_expire={CRED_EXPIRE}",
        "MpiDefault=none", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "JobCompType=jobcomp/none", "SlurmUser=root",
        "StateSaveLocation=/var/lib/slurm/slurmctld", "SlurmdSpoolDir=/var/lib/slurm/slurmd",
        "SlurmctldPidFile=/run/slurmctld.pid", "SlurmdPidFile=/run/slurmd.pid", "ReturnToService=2",
        "SchedulerType=sched/backfill", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "SlurmdTimeout=20", "SlurmctldTimeout=20", "InactiveLimit=0", "KillWait=5", "MessageTimeout=10",
        "MinJobAge=600", "KillOnBadExit=1",
        f"NodeName={','.join(nodes)} CPUs={cpus} State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""])


def _tar(files: dict[str, tuple[bytes, int]], uid: int = 1000) -> bytes:
    """A tar archive of path -> (content, mode), owned by uid, for put_archive."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path, (content, mode) in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.uid, info.gid = len(content), mode, uid, uid
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


class Cluster:
    def __init__(self, name: str, network, nodes: dict, workdir: Path):
        self.name = name
        self.network = network
        self.nodes = nodes  # hostname -> container
        self.workdir = workdir

    @classmethod
    def start(cls, image: str, hostnames: list[str], services: dict[str, list[str]] | None = None,
              volumes: dict[str, str] | None = None, apptainer: bool = False, slurm: str | None = None,
              cpus: int = 2, timeout: float = 90) -> "Cluster":
        """Start one container per hostname. services: hostname -> start-node services (default: sshd).
        slurm: the controller's hostname (its slurm.conf lists the other nodes); apptainer: FUSE and user namespaces
        for `apptainer exec` (the SIF builder's settings)."""
        api = client().api
        name = f"tfhpc-cluster-{secrets.token_hex(4)}"
        workdir = Path(tempfile.mkdtemp(prefix=f"{name}-"))
        workdir.chmod(0o755)
        network = client().networks.create(name, driver="bridge", labels={LABEL: name})
        cluster = cls(name, network, {}, workdir)
        try:
            binds = dict(volumes or {})
            if slurm:
                (workdir / "slurm").mkdir()
                (workdir / "slurm" / "slurm.conf").write_text(
                    slurm_conf(slurm, [h for h in hostnames if h != slurm], cpus))
                (workdir / "munge.key").write_bytes(secrets.token_bytes(1024))
                binds[str(workdir / "slurm")] = "/etc/slurm:ro"
                binds[str(workdir / "munge.key")] = "/run/cluster/munge.key:ro"
            for hostname in hostnames:
                host_config = api.create_host_config(
                    binds=[f"{src}:{dst}" for src, dst in binds.items()],
                    **(HELPER_HOST_CONFIG if apptainer else {}))
                if apptainer:
                    host_config["MaskedPaths"], host_config["ReadonlyPaths"] = [], []
                command = ["start-node", *(services or {}).get(hostname, ["sshd"])]
                created = api.create_container(
                    image, command, hostname=hostname, name=f"{name}-{hostname}", user="root",
                    host_config=host_config, labels={LABEL: name}, environment=oversubscription.ENVIRONMENT,
                    networking_config=api.create_networking_config(
                        {name: api.create_endpoint_config(aliases=[hostname])}))
                api.start(created["Id"])
                cluster.nodes[hostname] = client().containers.get(created["Id"])
            cluster._wait_up(timeout)
            cluster._setup_ssh()
            if apptainer:
                for container in cluster.nodes.values():
                    container.exec_run(["chmod", "0666", "/dev/fuse"], user="root")
            return cluster
        except BaseException:
            print(cluster.report())
            cluster.stop()
            raise

    def _wait_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting = set(self.nodes)
        while waiting and time.monotonic() < deadline:
            for hostname in sorted(waiting):
                container = self.nodes[hostname]
                container.reload()
                if container.status != "running":
                    raise UserError(f"cluster node {hostname} stopped while starting: {self._tail(container)}")
                if f"node {hostname} up" in container.logs().decode(errors="replace"):
                    waiting.discard(hostname)
            time.sleep(0.5)
        if waiting:
            raise UserError(f"cluster node(s) {', '.join(sorted(waiting))} not up within {timeout:.0f} s")

    def _setup_ssh(self) -> None:
        """One key pair for this run (made in the first node), authorised on every node for the user."""
        first = next(iter(self.nodes.values()))
        rc, out = first.exec_run(["sh", "-c", "ssh-keygen -q -t ed25519 -N '' -C tfhpc-test -f /tmp/key "
                                  "&& cat /tmp/key && echo ===== && cat /tmp/key.pub && rm -f /tmp/key /tmp/key.pub"])
        if rc != 0:
            raise UserError(f"ssh-keygen failed in {first.name}: {out.decode(errors='replace')}")
        private, _, public = out.decode().partition("=====\n")
        files = {".ssh/id_ed25519": (private.encode(), 0o600), ".ssh/id_ed25519.pub": (public.encode(), 0o644),
                 ".ssh/authorized_keys": (public.encode(), 0o600), ".ssh/config": (SSH_CONFIG.encode(), 0o600)}
        for container in self.nodes.values():
            container.exec_run(["install", "-d", "-o", USER, "-g", USER, "-m", "0700", f"{HOME}/.ssh"], user="root")
            container.put_archive(HOME, _tar(files))

    def run(self, hostname: str, command: str, user: str = USER, timeout: int = 600,
            environment: dict | None = None) -> tuple[int, str]:
        """Run a shell command on a node as `user`; returns (exit status, stdout+stderr). The command is killed after
        `timeout` seconds (exit status 124), so a hung collective fails the test instead of hanging it."""
        if hostname not in self.nodes:
            raise UserError(f"unknown cluster node '{hostname}': this cluster has {', '.join(self.nodes)}")
        wrapped = ["timeout", "--kill-after=10", str(timeout), "bash", "-c", command]
        rc, out = self.nodes[hostname].exec_run(wrapped, user=user, environment=environment or {},
                                                workdir=HOME if user == USER else "/")
        return rc, out.decode(errors="replace")

    def run_all(self, command_per_node: dict[str, str], timeout: int = 600,
                environment: dict | None = None) -> dict[str, tuple[int, str]]:
        """Start a command on several nodes at once (e.g. one MWMS worker each) and wait for all of them."""
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(len(command_per_node)) as pool:
            futures = {host: pool.submit(self.run, host, command, USER, timeout, environment)
                       for host, command in command_per_node.items()}
            return {host: future.result() for host, future in futures.items()}

    def address(self, hostname: str) -> str:
        self.nodes[hostname].reload()
        return self.nodes[hostname].attrs["NetworkSettings"]["Networks"][self.name]["IPAddress"]

    def dead(self) -> list[str]:
        dead = []
        for hostname, container in self.nodes.items():
            try:
                container.reload()
                if container.status != "running":
                    dead.append(hostname)
            except Exception:  # noqa: BLE001 - removed counts as dead
                dead.append(hostname)
        return dead

    @staticmethod
    def _tail(container, lines: int = 20) -> str:
        return " | ".join(container.logs(tail=lines).decode(errors="replace").splitlines())

    def report(self) -> str:
        """Every node's state and logs (container output and daemon logs), for a failing test's output."""
        parts = [f"cluster {self.name}: " + (f"node(s) not running: {', '.join(self.dead())}" if self.dead()
                                             else "all nodes running")]
        for hostname, container in self.nodes.items():
            parts.append(f"----- {hostname} ({container.status}) -----")
            try:
                parts.append(container.logs(tail=50).decode(errors="replace"))
                if container.status == "running":
                    rc, out = container.exec_run(["sh", "-c", " ".join(
                        f"[ -s {f} ] && echo '## {f}' && tail -n 30 {f};" for f in LOG_FILES) + " true"])
                    parts.append(out.decode(errors="replace"))
            except Exception as error:  # noqa: BLE001 - a report must not fail
                parts.append(f"(no logs: {error})")
        return "\n".join(parts)

    def stop(self) -> None:
        for container in self.nodes.values():
            try:
                container.remove(force=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        try:
            self.network.remove()
        except Exception:  # noqa: BLE001
            pass
        import shutil
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

