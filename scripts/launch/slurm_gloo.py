#!/usr/bin/env python3
"""Horovod over Gloo under srun, without MPI and without horovodrun: for sites where the host's PMI/PMIx and the
image's MPI do not match, or where ssh between nodes is not allowed.

    srun --mpi=none apptainer exec image.sif tfhpc-slurm-gloo tfhpc-train-hvd-fit --epochs 3

Every task of the step runs this. Task 0 starts Horovod's Gloo rendezvous server (the one horovodrun starts) on its
node, at a port derived from the job id; every task then runs COMMAND with the environment horovodrun's Gloo launcher
would give it (rank, size, local and cross ranks from Slurm, the rendezvous address, the network interface that
reaches it). The exit status is COMMAND's; task 0 keeps the rendezvous server up until its COMMAND ends.
"""
import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tfhpc_runtime.cli import Parser
from tfhpc_runtime.cluster import ipv4_address, slurm_port_base, slurm_step
from tfhpc_runtime.errors import fail

RENDEZVOUS_OFFSET = 31  # the last port of the job's block (MWMS workers use the first ones)


def interface_towards(address):
    """Name of the local interface whose IPv4 address the kernel uses to reach `address`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((address, 9))
        local = probe.getsockname()[0]
    for path in sorted(Path("/sys/class/net").iterdir()):
        if ipv4_address(path.name) == local:
            return path.name
    fail(f"no interface holds {local}, the address that reaches the rendezvous at {address}")


def wait_for(address, port, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    fail(f"the Gloo rendezvous at {address}:{port} (task 0) did not answer within {timeout} s: "
         "check that task 0 started and that the nodes reach each other on that port", everyone=True)


def main():
    parser = Parser(description=__doc__)
    parser.add_argument("--port", type=int, default=None,
                        help="rendezvous port (default: the last port of the job's block, from SLURM_JOB_ID)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds to wait for the rendezvous (default: 120)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command every task runs")
    args = parser.parse_args()
    if not args.command:
        fail("no command given: tfhpc-slurm-gloo COMMAND [ARGS...], e.g. tfhpc-smoke-collectives")
    hosts, tasks, rank, host = slurm_step("srun --mpi=none apptainer exec image.sif tfhpc-slurm-gloo COMMAND")
    job = os.environ.get("SLURM_JOB_ID", "0")
    port = args.port or slurm_port_base(int(job) if job.isdigit() else 0) + RENDEZVOUS_OFFSET
    address = socket.gethostbyname(hosts[0])

    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
    plan = get_host_assignments(parse_hosts(",".join(f"{h}:{n}" for h, n in zip(hosts, tasks))), sum(tasks))
    server = None
    if rank == 0:  # Gloo: the rendezvous server horovodrun would start, at a port every task can compute.
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer, RendezvousServer
        from horovod.runner.util.threads import in_thread
        # RendezvousServer.start() listens on a free port of its choosing, which the other tasks could not know:
        # the same steps on the job's port instead (horovod/runner/http/http_server.py of the pinned Horovod).
        server = RendezvousServer()
        try:
            server._httpd = RendezvousHTTPServer(("", port), RendezvousHandler, 0)
        except OSError as error:
            fail(f"cannot listen on port {port} for the Gloo rendezvous ({error.strerror}): pass --port")
        server._listen_thread = in_thread(target=server._httpd.serve_forever)
        server.init(plan)
    else:
        wait_for(address, port, args.timeout)
    nic = interface_towards(address)
    gloo = {**create_run_env_vars(address, [nic], port), **create_slot_env_vars(plan[rank])}
    environment = {**os.environ, **{key: str(value) for key, value in gloo.items()}, "PYTHONUNBUFFERED": "1"}
    if plan[rank].hostname != host:
        fail(f"Slurm placed task {rank} on {host}, the Gloo plan on {plan[rank].hostname}: use the "
             "default block distribution (srun -m block)")
    status = subprocess.call(args.command, env=environment)
    if server is not None:
        server.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
