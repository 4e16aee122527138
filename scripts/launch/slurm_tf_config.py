#!/usr/bin/env python3
"""A MultiWorkerMirroredStrategy script that reads TF_CONFIG (TensorFlow's multi-worker tutorial, your own script),
under srun: every task of the step becomes one worker.

    srun apptainer exec image.sif tfhpc-slurm-tf-config python train.py ARGS

Every task runs this. It writes TF_CONFIG from the Slurm step (every task a worker, in rank order; the ports
SlurmClusterResolver and tfhpc-train-mwms-fit --cluster slurm use, derived from the job id, so two jobs on one node
differ), removes HTTP proxies from the environment (gRPC between workers would go through them) and replaces itself
with COMMAND, which gets the task's signals and gives the exit status.
"""
import argparse
import json
import os
import sys

from tfhpc_runtime.cli import Parser
from tfhpc_runtime.cluster import remove_proxies, slurm_port_base, slurm_step, slurm_tf_config
from tfhpc_runtime.errors import fail

LAUNCH = "srun apptainer exec image.sif tfhpc-slurm-tf-config python train.py"


def main():
    parser = Parser(description=__doc__)
    parser.add_argument("--port-base", type=int, default=None,
                        help="first port of the workers on a node (default: derived from SLURM_JOB_ID in "
                             "10000-19999, as tfhpc-train-mwms-fit --cluster slurm)")
    parser.add_argument("--keep-proxy", action="store_true",
                        help="keep http(s)_proxy in the environment (by default removed: gRPC would use them)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command every task runs")
    args = parser.parse_args()
    if not args.command:
        fail(f"no command given: {LAUNCH}")
    if "TF_CONFIG" in os.environ:
        fail("TF_CONFIG is already set: run the command without tfhpc-slurm-tf-config, or unset TF_CONFIG",
             everyone=True)
    hosts, tasks, rank, host = slurm_step(LAUNCH)
    job = os.environ.get("SLURM_JOB_ID", "0")
    port_base = args.port_base or slurm_port_base(int(job) if job.isdigit() else 0)
    config = slurm_tf_config(hosts, tasks, rank, host, int(os.environ["SLURM_LOCALID"]), port_base)
    if config is None:
        fail(f"Slurm placed task {rank} on {host} out of node order: use the default block distribution "
             "(srun -m block)", everyone=True)
    os.environ["TF_CONFIG"] = json.dumps(config)
    remove_proxies(args.keep_proxy)
    try:
        os.execvp(args.command[0], args.command)
    except OSError as error:
        fail(f"cannot run {args.command[0]}: {error.strerror}", everyone=True)


if __name__ == "__main__":
    sys.exit(main())
