"""Horovod Elastic: the checks of --elastic, the data position carried across a change in the number of ranks, and
the hosts of a Slurm allocation for `horovodrun --host-discovery-script` (tfhpc-slurm-hosts).

Imports neither numpy nor TensorFlow: the discovery script runs once a second in horovodrun's driver, and bad input
is reported before any framework starts.
"""
import argparse
import json
import os
import re
import shutil
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .errors import fail

ELASTIC_COMMAND = ("horovodrun --min-np 2 --max-np 4 --host-discovery-script tfhpc-slurm-hosts "
                   "[--blacklist-cooldown-range 30 300] COMMAND --elastic")
# sinfo's compact states (%t) of a node that cannot run a rank; a trailing "*" (not responding) also drops a node.
UNUSABLE_STATES = ("down", "drain", "drng", "fail", "failg", "maint", "boot", "powered_down", "pow_dn", "npc",
                   "futr", "inval", "unk")


# ---------------------------------------------------------------------------------------------------------------- #
# --elastic

def check_elastic_args(args, environ=os.environ):
    """--elastic needs horovodrun's elastic mode (it sets HOROVOD_ELASTIC=1 for every worker); one line otherwise.
    What it cannot be combined with is refused here too, before TensorFlow starts."""
    if getattr(args, "commit_steps", 1) < 1:
        fail(f"--commit-steps must be at least 1, got {args.commit_steps}")
    if not getattr(args, "elastic", False):
        return
    if environ.get("HOROVOD_ELASTIC") != "1":
        fail(f"--elastic needs horovodrun's elastic mode (HOROVOD_ELASTIC=1 is not set): start it as "
             f"`{ELASTIC_COMMAND}`, or drop --elastic")
    if args.global_batch_size is not None:
        fail("--global-batch-size cannot be kept when --elastic changes the number of ranks: give --batch-size "
             "per rank instead")
    if getattr(args, "different_init_per_rank", False):
        fail("--different-init-per-rank has no effect with --elastic (every reset broadcasts rank 0's state): "
             "drop one of them")
    if args.resume and args.checkpoint_dir:
        record = Path(args.checkpoint_dir) / "latest.json"
        try:
            written = json.loads(record.read_text())
            epoch, step = int(written.get("epoch", 0)), int(written.get("step", 0))
        except (OSError, ValueError, AttributeError):
            epoch, step = 0, 0  # no checkpoint (start fresh) or an unreadable one (Checkpoints.latest names it)
        if epoch >= args.epochs:  # refused here: with --elastic, ranks may join before rank 0 could say it
            fail(f"the checkpoint in {args.checkpoint_dir} has already done {epoch} epoch(s): raise --epochs above "
                 f"{epoch} to train further")
        if step:
            fail(f"{record} is a mid-epoch checkpoint ({step} step(s) into an epoch), which holds only for the "
                 f"number of ranks that wrote it and --elastic does not keep that number: finish the epoch "
                 f"without --elastic (--resume auto with those ranks), then resume with --elastic")


def resume_step(samples_done, global_batch, steps):
    """The step at which to continue an epoch of which samples_done samples are trained, with the current global
    batch and steps per epoch: a reset that changed the number of ranks continues after as many samples (rounded down
    to whole steps of the new batch), not after the same step number; at least one step of the epoch is left (with a
    fixed --steps-per-epoch, fewer ranks make shorter epochs), so that the epoch ends as every epoch does."""
    return min(samples_done // global_batch, steps - 1)


# ---------------------------------------------------------------------------------------------------------------- #
# Hosts of a Slurm allocation (tfhpc-slurm-hosts)

def expand_hostlist(text):
    """Slurm's host-list syntax: 'node[01-03,7],gpu5' -> ['node01', 'node02', 'node03', 'node7', 'gpu5']
    (what `scontrol show hostnames` prints, for nodes without scontrol, e.g. inside a container)."""
    hosts = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", text):
        match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", item)
        if not match:
            hosts.append(item)
            continue
        prefix, ranges, suffix = match.groups()
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            if not first.isdigit() or (last and not last.isdigit()):
                raise ValueError(f"{text!r} is not a Slurm host list ({part!r} is not a number or a range)")
            for number in range(int(first), int(last or first) + 1):
                hosts.append(f"{prefix}{number:0{len(first)}d}{suffix}")
    return hosts


def expand_counts(text):
    """Slurm's per-node counts: '2(x3),1' -> [2, 2, 2, 1] (SLURM_TASKS_PER_NODE, SLURM_JOB_CPUS_PER_NODE)."""
    counts = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise ValueError(f"{text!r} is not a Slurm count list like '2(x3),1'")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def allocation(environ, scontrol=None):
    """[(host, slots)] of the job: hosts from SLURM_JOB_NODELIST (through `scontrol show hostnames` when scontrol is
    given), slots = ranks per host from SLURM_NTASKS_PER_NODE, else SLURM_TASKS_PER_NODE, else 1."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        fail("not inside a Slurm allocation (SLURM_JOB_NODELIST is unset): run it in a job (sbatch/salloc), or give "
             "horovodrun --hosts/-H instead of --host-discovery-script")
    try:
        if scontrol:
            hosts = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True,
                                   check=True, timeout=30).stdout.split()
        else:
            hosts = expand_hostlist(nodelist)
        if environ.get("SLURM_NTASKS_PER_NODE", "").isdigit():
            slots = [int(environ["SLURM_NTASKS_PER_NODE"])] * len(hosts)
        elif environ.get("SLURM_TASKS_PER_NODE"):
            slots = expand_counts(environ["SLURM_TASKS_PER_NODE"])
        else:
            slots = [1] * len(hosts)
    except (ValueError, subprocess.SubprocessError) as error:
        fail(f"cannot read the allocation's hosts ({str(error).strip()}): check SLURM_JOB_NODELIST and "
             "SLURM_TASKS_PER_NODE")
    if len(slots) != len(hosts):
        fail(f"SLURM_TASKS_PER_NODE={environ.get('SLURM_TASKS_PER_NODE')!r} gives {len(slots)} count(s) for "
             f"{len(hosts)} host(s): set SLURM_NTASKS_PER_NODE (sbatch --ntasks-per-node)")
    return list(zip(hosts, slots))


def unusable_in_sinfo(sinfo_output):
    """Hosts whose state in `sinfo -h -N -o '%N %t'` output is down, drained, failing or not responding ('*')."""
    unusable = set()
    for line in sinfo_output.splitlines():
        fields = line.split()
        if len(fields) == 2:
            host, state = fields
            if state.endswith("*") or state.rstrip("~#!%$@^-").lower() in UNUSABLE_STATES:
                unusable.add(host)
    return unusable


def reachable(host, port, timeout):
    """True when host accepts a TCP connection on port within timeout seconds (horovodrun starts ranks by ssh)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def usable_hosts(hosts, sinfo_output=None, port=22, timeout=1.0):
    """The [(host, slots)] of hosts that sinfo does not report unusable and that answer on port (0: no check),
    checked in parallel so that one dead host costs at most timeout seconds."""
    unusable = unusable_in_sinfo(sinfo_output) if sinfo_output else set()
    candidates = [(host, slots) for host, slots in hosts if host not in unusable]
    if not port or not candidates:
        return candidates
    with ThreadPoolExecutor(len(candidates)) as pool:
        answers = list(pool.map(lambda item: reachable(item[0], port, timeout), candidates))
    return [item for item, answered in zip(candidates, answers) if answered]


def discover(environ=os.environ, port=22, timeout=1.0):
    """The lines `host:slots` of the allocation's usable hosts, as horovodrun's discovery script prints them."""
    scontrol, sinfo = shutil.which("scontrol"), shutil.which("sinfo")
    hosts = allocation(environ, scontrol)
    sinfo_output = None
    if sinfo:
        result = subprocess.run([sinfo, "-h", "-N", "-n", ",".join(h for h, _ in hosts), "-o", "%N %t"],
                                capture_output=True, text=True, timeout=30)
        sinfo_output = result.stdout if result.returncode == 0 else None
    return [f"{host}:{slots}" for host, slots in usable_hosts(hosts, sinfo_output, port, timeout)]


# ---------------------------------------------------------------------------------------------------------------- #
# Flags and progress of the elastic entrypoints

def add_elastic_args(parser):
    parser.add_argument("--elastic", action="store_true",
                        help="Horovod Elastic: carry on with the ranks that are left when a host fails and take in "
                             f"hosts that join; needs `{ELASTIC_COMMAND}`")
    parser.add_argument("--commit-steps", type=int, default=1, metavar="N",
                        help="with --elastic: keep a copy of the state in memory every N steps (and at each epoch's "
                             "end); a failure repeats at most the steps since the last copy")
    return parser


class Timeline:
    """Per rank, with --elastic: when each step ended and with how many ranks, and when resets happened, for the
    RESULT line (the pause when a host is lost and the throughput before and after are computed from it)."""

    def __init__(self, clock):
        self.clock = clock
        self.steps = []  # [time, ranks] per step
        self.resets = []  # time of each reset

    def step(self, ranks):
        self.steps.append([round(self.clock(), 3), ranks])

    def reset(self):
        self.resets.append(round(self.clock(), 3))

    def result(self):
        return {"step_times": self.steps, "resets": self.resets,
                "sizes": sorted({ranks for _, ranks in self.steps})}


def run_training(train, progress, timeline, elastic=None):
    """train(state) -> (state, what train returned). progress: the state's attributes (epoch, samples done, metrics).
    Without Horovod Elastic the state is a plain namespace. With elastic = (state class, hvd.elastic.run, model,
    optimizer) it is Horovod's state object holding the model, the optimizer and progress, rolled back to the last
    commit and broadcast from rank 0 whenever the hosts change, and run calls train again after every reset."""
    if elastic is None:
        state = argparse.Namespace(**progress)
        return state, train(state)
    state_class, run, model, optimizer = elastic
    state = state_class(model, optimizer, **progress)
    state.register_reset_callbacks([timeline.reset])
    return state, run(train)(state)
