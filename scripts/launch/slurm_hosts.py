#!/usr/bin/env python3
"""The hosts of this Slurm allocation that can take ranks, one `host:slots` line each: the discovery script of
Horovod Elastic.

    horovodrun --min-np 2 --max-np 4 --host-discovery-script tfhpc-slurm-hosts tfhpc-train-hvd-fit --elastic

horovodrun runs it about once a second. Hosts come from SLURM_JOB_NODELIST (`scontrol show hostnames` where scontrol
is installed), slots from SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE. A host is left out when sinfo (where
installed) reports it down, drained, failing or not responding, or when it does not accept a connection on the ssh
port within --timeout seconds (horovodrun starts the ranks with ssh). Outside an allocation: one line, status 2.
"""
import sys

from tfhpc_runtime.cli import Parser
from tfhpc_runtime.elastic import discover


def main():
    parser = Parser(__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=22,
                        help="TCP port a usable host must answer on (horovodrun's ssh); 0 = no check")
    parser.add_argument("--timeout", type=float, default=1.0, help="seconds to wait for each host's answer")
    args = parser.parse_args()
    for line in discover(port=args.port, timeout=args.timeout):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
