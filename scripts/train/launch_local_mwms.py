#!/usr/bin/env python3
"""Start N MultiWorkerMirroredStrategy workers on this machine: picks N free localhost ports, gives each worker its
TF_CONFIG (all workers listed, its own index; worker 0 is the chief) and its share of the cores (OMP_NUM_THREADS),
prefixes every output line with the worker's index, and stops the others when one fails (they would wait for it in
the next collective forever), naming the worker that failed and how it ended (not for status 99, every worker's stop after a signal:
tfhpc_runtime/preemption.py). Its exit status is that worker's (128 + N for a worker killed by signal N, as a shell
gives), 124 after --timeout.

    python launch_local_mwms.py -n 2 python mwms_keras_fit.py --epochs 2
    python launch_local_mwms.py -n 2 tfhpc-train-mwms-fit --epochs 2      # in the app image

Everything from the worker command on belongs to the workers, as with mpirun and horovodrun: the launcher's own
options come before it, and a `--` before the command is accepted but not needed.

For several nodes, set TF_CONFIG on each node yourself (see mwms_keras_fit.py --help) or use srun.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from tfhpc_runtime.cli import Parser
from tfhpc_runtime.cluster import free_ports
from tfhpc_runtime.errors import PREFIX, fail
from tfhpc_runtime.preemption import SAVED_AND_STOPPED


def parse_args(argv=None):
    """The launcher's options, then the worker command with all its options, which the launcher never reads."""
    parser = Parser(__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--workers", type=int, default=2, help="number of worker processes")
    parser.add_argument("--host", default="localhost", help="address the workers listen on")
    parser.add_argument("--timeout", type=float, default=0, help="stop all workers after this many seconds (0 = never)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND",
                        help="the worker command and its options, e.g. tfhpc-train-mwms-fit --epochs 2")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:  # the form that was once needed; Python versions differ in whether they drop it
        args.command = args.command[1:]
    if not args.command:
        parser.error("give the worker command, e.g. tfhpc-train-mwms-fit --epochs 2")
    return args


def main():
    args = parse_args()
    if args.workers < 1:
        fail(f"--workers must be at least 1, got {args.workers}")
    if "TF_CONFIG" in os.environ:
        fail("TF_CONFIG is already set: unset it, the launcher writes one per worker")
    if not shutil.which(args.command[0]):  # checked before any worker starts: none is left waiting for a peer
        fail(f"no such command: {args.command[0]} (give a program on PATH or a path, e.g. "
             f"tfhpc-train-mwms-fit or python mwms_keras_fit.py)")

    addresses = [f"{args.host}:{port}" for port in free_ports(args.workers)]
    cores = len(os.sched_getaffinity(0))
    processes, pumps = [], []
    for index in range(args.workers):
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": {"worker": addresses},
                                                     "task": {"type": "worker", "index": index}}))
        env.setdefault("OMP_NUM_THREADS", str(max(1, cores // args.workers)))
        try:
            process = subprocess.Popen(args.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, bufsize=1)
        except OSError as error:  # e.g. not executable: stop the workers already started, they would wait forever
            stop(processes)
            fail(f"cannot start {args.command[0]}: {error.strerror}")
        processes.append(process)
        for stream, sink in ((process.stdout, sys.stdout), (process.stderr, sys.stderr)):
            pump = threading.Thread(target=forward, args=(stream, sink, f"[worker {index}] "), daemon=True)
            pump.start()
            pumps.append(pump)

    deadline = time.time() + args.timeout if args.timeout else None
    status = 0
    try:
        while any(p.poll() is None for p in processes):
            failed = [(index, p.returncode) for index, p in enumerate(processes) if p.poll() not in (None, 0)]
            if failed or (deadline and time.time() > deadline):
                if failed:  # the first seen to fail (the lowest index of those seen at once): the others wait for it
                    index, code = failed[0]
                    status = exit_status(code)
                    if code != SAVED_AND_STOPPED:  # a signal's stop: every worker saved and exits 99 with it
                        why = f" (its lines above, prefixed [worker {index}], say why)" if code > 0 else ""
                        print(f"{PREFIX}: error: worker {index} {ended(code)}: stopping the other workers{why}",
                              file=sys.stderr, flush=True)
                else:
                    status = 124
                    print(f"{PREFIX}: error: workers still running after --timeout {args.timeout:g} s: "
                          f"stopped them", file=sys.stderr, flush=True)
                stop(processes)
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        stop(processes)
        status = 130
    for pump in pumps:
        pump.join(timeout=5)
    codes = [p.wait() for p in processes]
    return status or next((exit_status(c) for c in codes if c), 0)


def ended(code):
    """How a worker with Popen's return code `code` (non-zero) ended, in words."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "an unknown signal"
        return f"was killed by signal {-code} ({name})"
    return f"exited with status {code}"


def exit_status(code):
    """The launcher's exit status for a worker's return code: a shell's 128 + N for a worker killed by signal N."""
    return 128 - code if code < 0 else code


def forward(stream, sink, prefix):
    for line in stream:
        sink.write(prefix + line)
        sink.flush()


def stop(processes):
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


if __name__ == "__main__":
    sys.exit(main())
