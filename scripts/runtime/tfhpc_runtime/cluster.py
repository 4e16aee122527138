"""MultiWorkerMirroredStrategy cluster set-up, decided before TensorFlow starts: TF_CONFIG validation, the Slurm
step (SlurmClusterResolver with a port base per job), HTTP proxies removed, the strategy and its collective. Also the
network facts the launchers and the doctor share (free ports, an interface's IPv4 address).

The set-up follows the IDRIS Jean Zay guide (SlurmClusterResolver, NCCL, strategy first, HTTP proxies unset), the
Lablup course (TF_CONFIG with all nodes as workers, memory growth) and the CSCS Piz Daint course (TF_CONFIG for
collective all-reduce).
"""
import fcntl
import json
import os
import socket
import struct

from .errors import fail
from .gpu import detect_gpus_per_node

PROXY_VARIABLES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy", "GRPC_PROXY",
                   "all_proxy", "ALL_PROXY")
TF_CONFIG_EXAMPLE = '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}'


def validate_tf_config(text):
    """The parsed TF_CONFIG, or a one-line error saying what to fix (from every worker: each has its own)."""
    config, problem = tf_config_problem(text)
    if problem:
        fail(f"TF_CONFIG {problem[0]}: {problem[1]}", everyone=True)
    return config


def tf_config_problem(text):
    """(parsed TF_CONFIG, None), or (None, (what is wrong, how to fix it)); shared with the doctor."""
    fix = f"set TF_CONFIG like {TF_CONFIG_EXAMPLE} (index = this worker's position in the list)"
    try:
        config = json.loads(text)
    except ValueError as error:
        return None, (f"is not valid JSON ({error})", fix)
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        return None, ("has no \"cluster\" object", fix)
    cluster = config["cluster"]
    unknown = set(cluster) - {"chief", "worker", "evaluator"}
    if unknown:
        return None, (f"cluster has job(s) {sorted(unknown)} that MultiWorkerMirroredStrategy does not use",
                      f"list all workers under \"worker\" (and at most one \"chief\"); {fix}")
    workers = [*cluster.get("chief", []), *cluster.get("worker", [])]
    if not workers or not all(isinstance(w, str) and _host_port(w) for w in workers):
        return None, (f"cluster must list workers as \"host:port\" strings, got {json.dumps(cluster)}", fix)
    if len(set(workers)) != len(workers):
        return None, (f"lists an address twice ({json.dumps(cluster)})", "give every worker its own host:port")
    task = config.get("task")
    if not isinstance(task, dict) or task.get("type") not in cluster or not isinstance(task.get("index"), int):
        return None, (f"task must be {{\"type\": one of {sorted(cluster)}, \"index\": integer}}, got "
                      f"{json.dumps(task)}", fix)
    listed = len(cluster[task["type"]])
    if not 0 <= task["index"] < listed:
        return None, (f"task index {task['index']} is outside the {listed} {task['type']}(s) listed",
                      f"use 0..{listed - 1}")
    return config, None


def _host_port(address):
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def slurm_port_base(job_id, low=10000, high=20000, stride=32):
    """First port of this job's workers on a node. Ports low..high-1 are cut into blocks of `stride` (one port per
    task on the node); the job id picks the block, so two jobs sharing a node get different ports unless their ids
    are equal modulo the number of blocks. The IDRIS Jean Zay guide's range: ports 10000-20000."""
    blocks = (high - low) // stride
    return low + (job_id % blocks) * stride


def slurm_max_tasks_per_node():
    """Largest number of tasks on one node of the step: SLURM_STEP_TASKS_PER_NODE looks like '2(x3),1'."""
    try:
        return max(int(t.split("(")[0]) for t in os.environ["SLURM_STEP_TASKS_PER_NODE"].split(","))
    except ValueError:
        fail(f"SLURM_STEP_TASKS_PER_NODE={os.environ['SLURM_STEP_TASKS_PER_NODE']!r} is not a Slurm task list "
             f"such as '2(x3),1': start the workers with srun")


def plan_cluster(args):
    """Decide, before TensorFlow starts, where the cluster comes from: 'tf_config', 'slurm' or 'local'."""
    source = args.cluster
    if source == "auto":
        if "TF_CONFIG" in os.environ:
            source = "tf_config"
        elif int(os.environ.get("SLURM_STEP_NUM_TASKS", "1") or 1) > 1:
            source = "slurm"
        else:
            source = "local"
    plan = {"source": source}
    if source == "tf_config":
        if "TF_CONFIG" not in os.environ:
            fail(f"--cluster tf_config but TF_CONFIG is not set: set it like {TF_CONFIG_EXAMPLE}", everyone=True)
        config = validate_tf_config(os.environ["TF_CONFIG"])
        cluster, task = config["cluster"], config["task"]
        addresses = [*cluster.get("chief", []), *cluster.get("worker", [])]
        plan["workers"] = len(addresses)
        own_host = cluster[task["type"]][task["index"]].rpartition(":")[0]
        plan["local_workers"] = sum(a.rpartition(":")[0] == own_host for a in addresses)
    elif source == "slurm":
        missing = [v for v in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST",
                               "SLURM_STEP_TASKS_PER_NODE") if v not in os.environ]
        if missing:
            fail(f"--cluster slurm needs {', '.join(missing)} from srun: start one task per worker with srun "
                 f"(not sbatch alone), or use --cluster tf_config")
        plan["local_workers"] = slurm_max_tasks_per_node()
        if plan["local_workers"] > 32 and args.port_base is None:
            fail(f"{plan['local_workers']} tasks on one node need more than the 32 ports a job is given: "
                 f"set --port-base yourself")
        if args.port_base is None:
            job = os.environ.get("SLURM_JOB_ID", "0")
            args.port_base = slurm_port_base(int(job) if job.isdigit() else 0)
        plan["workers"] = int(os.environ["SLURM_STEP_NUM_TASKS"])
        plan["port_base"] = args.port_base
        plan["gpus_per_node"] = detect_gpus_per_node() if args.gpus_per_node < 0 else args.gpus_per_node
    else:
        plan["workers"] = 1
    plan.setdefault("local_workers", 1)
    if args.collective == "nccl" and (plan.get("gpus_per_node", None) == 0 or
                                      (source != "slurm" and detect_gpus_per_node() == 0)):
        fail("--collective nccl needs GPUs and this node has none: use --collective ring (or auto)")
    return plan


def slurm_step(launcher):
    """(hosts in order, tasks per host, rank, this host) from the srun step's environment; a one-line error naming
    `launcher` (how to start it under srun) outside a step."""
    missing = [v for v in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE",
                           "SLURM_NODEID", "SLURM_LOCALID") if v not in os.environ]
    if missing:
        fail(f"not inside an srun step ({', '.join(missing)} unset): start it as `{launcher}`")
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import (  # Slurm's host-list syntax
        expand_hostlist, expand_tasks_per_node)
    hosts = expand_hostlist(os.environ["SLURM_STEP_NODELIST"])
    tasks = expand_tasks_per_node(os.environ["SLURM_STEP_TASKS_PER_NODE"])
    return hosts, tasks, int(os.environ["SLURM_PROCID"]), hosts[int(os.environ["SLURM_NODEID"])]


def slurm_tf_config(hosts, tasks, rank, host, local_id, port_base):
    """TF_CONFIG (a dict) of the srun step's task `rank`: every task a worker, in rank order, the tasks of a node on
    consecutive ports from `port_base` (the addresses SlurmClusterResolver gives them). None when Slurm did not
    place the tasks in blocks (rank order = node order), which the list assumes."""
    workers = [f"{name}:{port_base + index}" for name, count in zip(hosts, tasks) for index in range(count)]
    expected = sum(tasks[:hosts.index(host)]) + local_id
    if expected != rank:
        return None
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}


def remove_proxies(keep=False):
    """gRPC (MultiWorkerMirroredStrategy's transport) would send worker-to-worker traffic through an HTTP proxy set
    in the environment; remove them before the strategy starts. Returns what was removed."""
    if keep:
        return []
    removed = [name for name in PROXY_VARIABLES if name in os.environ]
    for name in removed:
        del os.environ[name]
    return removed


def add_mwms_args(parser):
    parser.add_argument("--cluster", default="auto", choices=("auto", "tf_config", "slurm", "local"),
                        help="where the workers are listed: auto = TF_CONFIG if set, else the Slurm step (srun with "
                             "2+ tasks), else this process alone")
    parser.add_argument("--port-base", type=int, default=None,
                        help="Slurm: first port of the workers on a node (default: derived from SLURM_JOB_ID in "
                             "10000-19999, so two jobs on one node do not collide)")
    parser.add_argument("--gpus-per-node", type=int, default=-1,
                        help="Slurm: GPUs per node to share among its tasks (-1 = SLURM_GPUS_ON_NODE, "
                             "CUDA_VISIBLE_DEVICES or nvidia-smi; 0 = CPU only)")
    parser.add_argument("--collective", default="auto", choices=("auto", "ring", "nccl"),
                        help="all-reduce implementation: ring (gRPC, CPU and GPU), nccl (GPUs; the IDRIS guide's "
                             "advice), auto (TensorFlow picks)")
    parser.add_argument("--auto-shard", default="data", choices=("auto", "data", "file", "off"),
                        help="tf.data auto-shard policy: data = every worker reads everything and keeps its part "
                             "(in-memory data), file = by input file (TFRecords), off = the dataset is already "
                             "sharded per worker")
    parser.add_argument("--keep-proxy", action="store_true",
                        help="keep http(s)_proxy in the environment (by default removed: gRPC would use them)")
    parser.add_argument("--no-memory-growth", dest="memory_growth", action="store_false",
                        help="let TensorFlow take all GPU memory at start (default: grow as needed, as in the Lablup "
                             "course)")
    return parser


def make_strategy(tf, args, plan):
    """MWMS: the strategy, created before any other TensorFlow operation."""
    if args.memory_growth:
        for gpu in tf.config.list_physical_devices("GPU"):  # MWMS: before the runtime starts.
            tf.config.experimental.set_memory_growth(gpu, True)
    resolvers = tf.distribute.cluster_resolver
    if plan["source"] == "tf_config":
        resolver = resolvers.TFConfigClusterResolver()
    elif plan["source"] == "slurm":
        gpus = plan["gpus_per_node"]
        if gpus > 0:
            resolver = resolvers.SlurmClusterResolver(port_base=plan["port_base"], gpus_per_node=gpus)
        else:
            # TensorFlow's resolver cannot describe CPU-only nodes (it steps through GPUs with a step of 0): take
            # its host list and ports with one dummy GPU per task and hand them on without accelerators.
            # No upstream issue found (slurm_cluster_resolver.py as of TF 2.21, last reworked in tensorflow#36159);
            # drop when SlurmClusterResolver(gpus_per_node=0) works.
            slurm = resolvers.SlurmClusterResolver(port_base=plan["port_base"], gpus_per_node=plan["local_workers"],
                                                   gpus_per_task=1, auto_set_gpu=False)
            spec = slurm.cluster_spec()
            resolver = resolvers.SimpleClusterResolver(spec, task_type=slurm.task_type, task_id=slurm.task_id,
                                                       num_accelerators={}, rpc_layer="grpc")
    else:
        resolver = None
    implementation = {"auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
                      "ring": tf.distribute.experimental.CommunicationImplementation.RING,
                      "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL}[args.collective]
    options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
    if resolver is None:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)
    resolver = strategy.cluster_resolver
    task_type, task_id = resolver.task_type, resolver.task_id
    spec = resolver.cluster_spec().as_dict()
    workers = [*spec.get("chief", []), *spec.get("worker", [])]
    # The chief is "chief" if the cluster has one, else worker 0 (all nodes as workers).
    is_chief = task_type is None or task_type == "chief" or (task_type == "worker" and task_id == 0
                                                            and "chief" not in spec)
    rank = (0 if task_type in (None, "chief") else task_id + len(spec.get("chief", [])))
    return strategy, {"rank": rank, "workers": max(len(workers), 1), "is_chief": is_chief,
                      "addresses": workers}


def free_ports(count):
    """Ports free right now on this host (for local multi-worker runs)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("localhost", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def ipv4_address(name):
    """IPv4 address of the network interface `name` (SIOCGIFADDR), or None when it has none."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None


def sum_over_workers(tf, strategy):
    """preemption.StopOnSignal's agree under MultiWorkerMirroredStrategy: the sum of a number over every replica of
    every worker, one all-reduce in a tf.function (traced once)."""

    @tf.function
    def total(flag):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(tf.identity, args=(flag,)), axis=None)

    return lambda flag: float(total(tf.constant(flag, tf.float32)))
