"""Shared pieces of the tfhpc training entrypoints: argument parsing with one-line errors, data sets that need no
download, learning-rate scaling, rank-0-only atomic output, checkpoints, and cluster set-up for
MultiWorkerMirroredStrategy (TF_CONFIG validation, Slurm port base, proxy removal).

Nothing here imports TensorFlow at module level: bad input is reported in well under a second, before any framework
starts and before anything is written.

Data sets (--dataset), all 28x28x1 images with 10 classes, stored as uint8 and scaled to [0, 1] in the tf.data map:
  glyphs         built in, generated: digits 0-9 drawn as seven-segment strokes with random slant, rotation, scale,
                 shift, stroke width, jittered stroke ends, a stray stroke and pixel noise. Deterministic (the same
                 images on every rank and every run), learnable, no download; not a real-world data set.
  digits         real handwritten digits, shipped in the image: the UCI "optdigits" set as scikit-learn bundles it
                 (1797 8x8 images, 43 writers; CC BY 4.0), taken from the scikit-learn wheel at build time (scikit-learn
                 itself is not installed). Upscaled 3x to 24x24 and padded to 28x28; a fixed split of 1437 training
                 and 360 test images. The convergence tests' real data set.
  synthetic      a random prototype per class plus noise: learns in a few steps, for plumbing tests.
  mnist          Keras' mnist.npz in --data-dir (arrays x_train, y_train, x_test, y_test).
  fashion_mnist  fashion_mnist.npz (same arrays) or Keras' four IDX files in --data-dir.
"""
import argparse
import gzip
import json
import math
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PREFIX = "tfhpc"
FAIL_WAIT_SECONDS = 10  # see fail()
DIGITS_FILE = Path(os.environ.get("TFHPC_DATA", "/opt/tfhpc/data")) / "digits.csv.gz"
DIGITS_TRAIN = 1437  # scikit-learn's digits: 1797 samples, 80 % for training
IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
KERAS_DATASETS_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/"
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
FASHION_IDX_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                     "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
LR_SCALING = ("linear", "sqrt", "none")
UMASK = os.umask(0o022)
os.umask(UMASK)
PROXY_VARIABLES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "grpc_proxy", "GRPC_PROXY",
                   "all_proxy", "ALL_PROXY")


# ---------------------------------------------------------------------------------------------------------------- #
# Errors and output

def launch_rank():
    """This process's rank as the launcher announced it (mpirun, horovodrun, srun, TF_CONFIG), read before any
    framework starts, so that only one rank prints an error."""
    for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    try:
        return int(json.loads(os.environ.get("TF_CONFIG", "{}"))["task"]["index"])
    except (ValueError, KeyError, TypeError):
        return 0


def launch_size():
    """The number of ranks the launcher started, from its environment (1 when started without one)."""
    for name in ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 1


def fail(message, code=2, everyone=False):
    """Stop with one line on stderr, printed by rank 0 only (the other ranks exit with the same status) unless the
    problem is this process's own (everyone=True)."""
    if everyone or launch_rank() == 0:
        print(f"{PREFIX}: error: {message}", file=sys.stderr, flush=True)
    else:
        # The silent ranks leave last: a launcher kills the job at the first non-zero exit, and Open MPI 5's mpirun
        # then lost rank 0's line when another rank exited first (measured: in 1 of 2 GPU-image test runs). Rank 0's
        # exit ends the job, so the wait costs nothing unless rank 0 never gets here. No upstream report found for
        # Open MPI 5.0.7 (searched 2026-11); drop when test_bad_input_* in tests/images/app passes on the GPU image
        # (Open MPI 5) with FAIL_WAIT_SECONDS = 0 over repeated runs.
        time.sleep(FAIL_WAIT_SECONDS)
    sys.exit(code)


class Parser(argparse.ArgumentParser):
    """argparse with defaults in --help and usage errors on a single line."""

    def __init__(self, description, **kwargs):
        super().__init__(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter, **kwargs)

    def error(self, message):
        fail(f"{self.prog}: {message} (see {self.prog} --help)")


def report(result):
    """One machine-readable line per rank; the tests and users' scripts parse it."""
    print("RESULT " + json.dumps(result, sort_keys=True), flush=True)


def log(enabled, *parts):
    if enabled:
        print(*parts, flush=True)


# ---------------------------------------------------------------------------------------------------------------- #
# Arguments every training entrypoint shares

def add_training_args(parser, epochs=3, batch_size=32, lr=0.01, model="cnn"):
    parser.add_argument("--dataset", default="glyphs", choices=("glyphs", "digits", "synthetic", "mnist", "fashion_mnist"),
                        help="glyphs and synthetic are generated in memory; digits (real, 1797 images) ships in the "
                             "image; mnist and fashion_mnist are read from --data-dir (nothing is downloaded)")
    parser.add_argument("--data-dir", default=None,
                        help="directory with mnist.npz or fashion_mnist.npz (Keras layout) for --dataset "
                             "mnist|fashion_mnist")
    parser.add_argument("--train-samples", type=int, default=6000, help="training samples used (0 = all)")
    parser.add_argument("--test-samples", type=int, default=1000, help="test samples used (0 = all)")
    parser.add_argument("--model", default=model, choices=("mlp", "cnn"),
                        help="mlp: Flatten-Dense(128)-Dense(10); cnn: Conv(32)-MaxPool-Dense(64)-Dense(10)")
    parser.add_argument("--epochs", type=int, default=epochs, help="total epochs (with --resume: including those done)")
    parser.add_argument("--batch-size", type=int, default=batch_size, help="per replica (per rank/worker)")
    parser.add_argument("--global-batch-size", type=int, default=None,
                        help="instead of --batch-size: the batch of one step over all replicas; must divide evenly")
    parser.add_argument("--steps-per-epoch", type=int, default=None,
                        help="default: train samples // global batch (the epoch is split across ranks)")
    parser.add_argument("--lr", type=float, default=lr, help="learning rate of a single worker, before --lr-scaling")
    parser.add_argument("--lr-scaling", default="linear", choices=LR_SCALING,
                        help="multiply --lr by the number of replicas (linear, Goyal et al.), by its square root "
                             "(sqrt, Krizhevsky) or not at all (none)")
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"))
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--shuffle-buffer", type=int, default=-1,
                        help="shuffle buffer in samples: -1 = the whole (shard of the) data set, 0 = no shuffling")
    parser.add_argument("--cache-dir", default=None,
                        help="cache the prepared data set in files here (e.g. node-local SSD or ramdisk), one per "
                             "rank; default: in memory")
    parser.add_argument("--seed", type=int, default=1234,
                        help="global seed: initial weights and shuffling order, identical on every rank")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="write a checkpoint after every epoch (rank 0 / chief only, atomically)")
    parser.add_argument("--keep-checkpoints", type=int, default=2, help="checkpoints kept in --checkpoint-dir")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint in --checkpoint-dir (start fresh if there is none)")
    parser.add_argument("--log-dir", default=None, help="TensorBoard logs (rank 0 / chief only)")
    parser.add_argument("--export-dir", default=None,
                        help="write the trained model here as a SavedModel (rank 0 / chief, atomically)")
    parser.add_argument("--weights-out", default=None,
                        help="write the final weights to this .npz (rank 0 / chief only, atomically)")
    parser.add_argument("--intra-threads", type=int, default=default_threads(),
                        help="TensorFlow intra-op threads per rank; default from OMP_NUM_THREADS or "
                             "SLURM_CPUS_PER_TASK (seed 001), else (0) the cores divided by the ranks on the node")
    parser.add_argument("--verbose", type=int, default=2, choices=(0, 1, 2), help="Keras verbosity on rank 0")
    return parser


def default_threads():
    for name in ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def check_training_args(args):
    """Everything that can be checked before TensorFlow starts; one line and a non-zero exit otherwise."""
    for name in ("epochs", "batch_size", "keep_checkpoints"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.global_batch_size is not None and args.global_batch_size < 1:
        fail(f"--global-batch-size must be at least 1, got {args.global_batch_size}")
    if args.steps_per_epoch is not None and args.steps_per_epoch < 1:
        fail(f"--steps-per-epoch must be at least 1, got {args.steps_per_epoch}")
    if args.lr <= 0:
        fail(f"--lr must be positive, got {args.lr}")
    if args.resume and not args.checkpoint_dir:
        fail("--resume needs --checkpoint-dir (the directory of an earlier run's checkpoints)")
    check_data_args(args)
    for flag in ("checkpoint_dir", "log_dir", "weights_out", "cache_dir"):
        path = getattr(args, flag, None)
        if path:
            parent = Path(path).resolve().parent if flag == "weights_out" else Path(path).resolve()
            existing = next(p for p in (parent, *parent.parents) if p.exists())
            if not os.access(existing, os.W_OK):
                fail(f"--{flag.replace('_', '-')} {path}: {existing} is not writable; choose a writable path "
                     f"(e.g. a bind-mounted directory)")


def per_replica_batch(args, replicas):
    """--batch-size is per replica; --global-batch-size must split evenly over the replicas."""
    if args.global_batch_size is None:
        return args.batch_size
    if args.global_batch_size % replicas:
        fail(f"--global-batch-size {args.global_batch_size} does not divide by {replicas} replicas: use a multiple "
             f"of {replicas} (e.g. {replicas * max(1, args.global_batch_size // replicas)}) or give --batch-size "
             f"per replica")
    return args.global_batch_size // replicas


def steps_per_epoch(args, train_samples, global_batch):
    steps = args.steps_per_epoch or train_samples // global_batch
    if steps < 1 or steps * global_batch > train_samples:
        fail(f"{steps} step(s) of a global batch of {global_batch} need {max(steps, 1) * global_batch} training "
             f"samples but there are {train_samples}: lower --batch-size or --steps-per-epoch, or raise "
             f"--train-samples")
    return steps


def scaled_lr(lr, replicas, scaling):
    """The learning rate for `replicas` workers whose gradients are averaged (seed 001/002/003)."""
    if scaling == "linear":
        return lr * replicas
    if scaling == "sqrt":
        return lr * math.sqrt(replicas)
    if scaling == "none":
        return lr
    fail(f"--lr-scaling {scaling!r} is unknown: choose one of {', '.join(LR_SCALING)}")


# ---------------------------------------------------------------------------------------------------------------- #
# Data

def check_data_args(args):
    if args.dataset == "digits" and not DIGITS_FILE.is_file():
        fail(f"--dataset digits reads {DIGITS_FILE}, which is missing: use the app image (it ships the file) or set "
             f"TFHPC_DATA to a directory holding scikit-learn's digits.csv.gz")
    if args.dataset in ("glyphs", "synthetic", "digits"):
        if args.data_dir:
            fail(f"--data-dir is read only by --dataset mnist|fashion_mnist, not by --dataset {args.dataset}: "
                 f"drop --data-dir or choose --dataset mnist")
        return
    expected = f"{args.dataset}.npz (arrays {', '.join(NPZ_KEYS)})"
    if args.dataset == "fashion_mnist":
        expected += f" or the four Keras files {', '.join(FASHION_IDX_FILES)}"
    hint = (f"copy {expected} from {KERAS_DATASETS_URL} into it on a machine with network access (nothing is "
            f"downloaded at run time), or use --dataset glyphs (built in)")
    if not args.data_dir:
        fail(f"--dataset {args.dataset} needs --data-dir: {hint}")
    directory = Path(args.data_dir)
    if not directory.is_dir():
        fail(f"--data-dir {directory} does not exist or is not a directory: {hint}")
    if dataset_files(args.dataset, directory) is None:
        fail(f"--data-dir {directory} holds no {expected}: {hint}")


def dataset_files(name, directory):
    npz = directory / f"{name}.npz"
    if npz.is_file():
        return [npz]
    if name == "fashion_mnist" and all((directory / f).is_file() for f in FASHION_IDX_FILES):
        return [directory / f for f in FASHION_IDX_FILES]
    return None


def load_data(args):
    """(x_train, y_train), (x_test, y_test): uint8 images (N, 28, 28, 1) and int32 labels, identical on every rank
    (each rank then reads its own shard)."""
    if args.dataset == "glyphs":
        x_train, y_train = glyphs(args.train_samples or 60000, seed=20240)
        x_test, y_test = glyphs(args.test_samples or 10000, seed=20241)
    elif args.dataset == "synthetic":
        x_train, y_train, x_test, y_test = synthetic(args.train_samples or 60000, args.test_samples or 10000)
    elif args.dataset == "digits":
        x_train, y_train, x_test, y_test = digits()  # small: --train-samples/--test-samples do not cut it
    else:
        x_train, y_train, x_test, y_test = read_keras_files(args.dataset, Path(args.data_dir))
        if args.train_samples:
            x_train, y_train = x_train[:args.train_samples], y_train[:args.train_samples]
        if args.test_samples:
            x_test, y_test = x_test[:args.test_samples], y_test[:args.test_samples]
    shape = (-1, *IMAGE_SHAPE)
    return ((x_train.reshape(shape), y_train.astype(np.int32)), (x_test.reshape(shape), y_test.astype(np.int32)))


def read_keras_files(name, directory):
    files = dataset_files(name, directory)
    try:
        if files[0].suffix == ".npz":
            with np.load(files[0]) as data:
                missing = [key for key in NPZ_KEYS if key not in data.files]
                if missing:
                    fail(f"{files[0]} lacks the arrays {', '.join(missing)}: it must hold {', '.join(NPZ_KEYS)} as "
                         f"Keras' {name}.npz does")
                return tuple(data[key] for key in NPZ_KEYS)
        arrays = []
        for path in files:  # IDX: magic, dimensions, then the raw bytes
            with gzip.open(path, "rb") as handle:
                raw = handle.read()
            arrays.append(np.frombuffer(raw, np.uint8, offset=16 if "images" in path.name else 8))
        return arrays[0].reshape(-1, 28, 28), arrays[1], arrays[2].reshape(-1, 28, 28), arrays[3]
    except (OSError, ValueError) as error:
        fail(f"cannot read {files[0]}: {error}; replace it with an intact copy from {KERAS_DATASETS_URL}")


def digits(path=None):
    """scikit-learn's digits (64 pixels with values 0..16, then the label, per CSV row) as 28x28 uint8 images: each
    pixel becomes a 3x3 block, the 24x24 image is centred with a 2-pixel border; a fixed shuffle (seed 0) splits it."""
    path = path or DIGITS_FILE
    try:
        with gzip.open(path, "rt") as handle:
            table = np.loadtxt(handle, delimiter=",", dtype=np.float64)
    except (OSError, ValueError) as error:
        fail(f"cannot read {path}: {error}; it must be scikit-learn's sklearn/datasets/data/digits.csv.gz")
    if table.ndim != 2 or table.shape[1] != 65:
        fail(f"{path} has {table.shape[-1]} columns, expected 65 (64 pixels and the label): not scikit-learn's digits")
    pixels = np.rint(table[:, :64] * (255 / 16)).astype(np.uint8).reshape(-1, 8, 8)
    images = np.pad(np.kron(pixels, np.ones((3, 3), np.uint8)), ((0, 0), (2, 2), (2, 2)))
    labels = table[:, 64].astype(np.int32)
    order = np.random.default_rng(0).permutation(len(labels))
    train, test = order[:DIGITS_TRAIN], order[DIGITS_TRAIN:]
    return images[train], labels[train], images[test], labels[test]


# Seven-segment strokes in a unit box (x right, y down) and the segments lit for each digit.
SEGMENTS = np.array([[(0.2, 0.1), (0.8, 0.1)], [(0.8, 0.1), (0.8, 0.5)], [(0.8, 0.5), (0.8, 0.9)],
                     [(0.2, 0.9), (0.8, 0.9)], [(0.2, 0.5), (0.2, 0.9)], [(0.2, 0.1), (0.2, 0.5)],
                     [(0.2, 0.5), (0.8, 0.5)]])
DIGIT_SEGMENTS = ["abcdef", "bc", "abged", "abgcd", "fgbc", "afgcd", "afgedc", "abc", "abcdefg", "abcdfg"]
LIT = np.array([[letter in segments for letter in "abcdefg"] for segments in DIGIT_SEGMENTS])


def glyphs(count, seed, size=28):
    """`count` digit images (uint8, size x size) with balanced labels, a pure function of (count, seed)."""
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % NUM_CLASSES
    rng.shuffle(labels)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    px, py = xx.ravel(), yy.ravel()  # (P,)
    images = np.empty((count, size, size), np.uint8)
    for start in range(0, count, 256):
        n = min(256, count - start)
        ends = SEGMENTS[None] + rng.normal(scale=0.05, size=(n, 7, 2, 2))  # jittered stroke ends
        x, y = ends[..., 0] - 0.5, ends[..., 1] - 0.5
        x = x + rng.uniform(-0.3, 0.3, (n, 1, 1)) * y  # slant
        angle = rng.uniform(-0.2, 0.2, (n, 1, 1))
        scale = rng.uniform(0.7, 1.05, (n, 2, 1, 1)) * (size - 6)
        shift = size / 2 + rng.uniform(-2.5, 2.5, (n, 2, 1, 1))
        sx = (np.cos(angle) * x - np.sin(angle) * y) * scale[:, 0] + shift[:, 0]
        sy = (np.sin(angle) * x + np.cos(angle) * y) * scale[:, 1] + shift[:, 1]
        width = rng.uniform(0.8, 1.8, (n, 1))
        ink = _stroke(px, py, sx[:, :, 0], sy[:, :, 0], sx[:, :, 1], sy[:, :, 1], width)  # (n, 7, P)
        image = (ink * LIT[labels[start:start + n]][:, :, None]).max(axis=1)
        stray = rng.uniform(0, size, (n, 1, 4)).astype(np.float32)  # a faint stray stroke in some images
        stray_ink = _stroke(px, py, stray[..., 0], stray[..., 1], stray[..., 2], stray[..., 3], 0.7)[:, 0]
        image = np.maximum(image, stray_ink * 0.6 * (rng.random((n, 1)) < 0.3))
        image = np.clip(image + rng.normal(scale=0.12, size=image.shape), 0, 1)
        images[start:start + n] = (image.reshape(n, size, size) * 255).round().astype(np.uint8)
    return images, labels.astype(np.int32)


def _stroke(px, py, ax, ay, bx, by, width):
    """Anti-aliased ink of line segments a-b (arrays (n, k)) of half-width `width` at pixel centres (P,)."""
    ax, ay, bx, by = (v.astype(np.float32)[..., None] for v in (ax, ay, bx, by))
    dx, dy = bx - ax, by - ay
    t = np.clip(((px - ax) * dx + (py - ay) * dy) / np.maximum(dx * dx + dy * dy, 1e-6), 0, 1)
    distance = np.hypot(px - ax - t * dx, py - ay - t * dy)
    return np.clip(np.asarray(width, np.float32)[..., None] + 0.5 - distance, 0, 1)


def synthetic(train, test, seed=4321):
    rng = np.random.default_rng(seed)
    prototypes = rng.uniform(0, 255, (NUM_CLASSES, 28, 28))

    def draw(count):
        labels = rng.integers(0, NUM_CLASSES, count)
        images = np.clip(prototypes[labels] + rng.normal(scale=60, size=(count, 28, 28)), 0, 255)
        return images.astype(np.uint8), labels

    return (*draw(train), *draw(test))


def train_dataset(tf, x, y, *, batch, steps, seed, start_epoch, epochs, shuffle_buffer,
                  shard=None, cache_file=None):
    """The training pipeline of seeds 002/003: [shard] -> map(scale) -> cache -> shuffle -> batch -> prefetch.

    Epoch e is shuffled with seed + e, so the order of every epoch is fixed by (seed, e) alone: all ranks shuffle
    alike, and a run resumed at epoch e sees exactly the batches an uninterrupted run sees there. drop_remainder
    keeps every step's batch full, so every rank takes the same number of steps.
    """
    autotune = tf.data.AUTOTUNE
    data = tf.data.Dataset.from_tensor_slices((x, y))
    if shard is not None:
        data = data.shard(*shard)  # Horovod: each rank reads its own part (num_shards, index).
    data = data.map(lambda image, label: (tf.cast(image, tf.float32) / 255.0, label), num_parallel_calls=autotune)
    data = data.cache(cache_file or "")
    samples = len(x) if shard is None else len(range(shard[1], len(x), shard[0]))
    buffer = samples if shuffle_buffer < 0 else shuffle_buffer

    def epoch(e):
        ordered = data.shuffle(buffer, seed=seed + e) if buffer > 0 else data
        return ordered.batch(batch, drop_remainder=True).take(steps)

    return tf.data.Dataset.range(start_epoch, epochs).flat_map(epoch).prefetch(autotune)


def test_dataset(tf, x, y, batch, shard=None):
    data = tf.data.Dataset.from_tensor_slices((x, y))
    if shard is not None:
        data = data.shard(*shard)
    return data.map(lambda image, label: (tf.cast(image, tf.float32) / 255.0, label)).batch(batch)


# ---------------------------------------------------------------------------------------------------------------- #
# Model and optimizer

def build_model(tf, name):
    layers = tf.keras.layers
    if name == "mlp":  # seed 002's example model
        body = [layers.Flatten(), layers.Dense(128, activation="relu")]
    else:  # seed 004's CNN
        body = [layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(), layers.Flatten(),
                layers.Dense(64, activation="relu")]
    return tf.keras.Sequential([tf.keras.Input(shape=IMAGE_SHAPE), *body, layers.Dense(NUM_CLASSES)])


def make_optimizer(tf, args, lr):
    if args.optimizer == "adam":
        return tf.keras.optimizers.Adam(learning_rate=lr)
    return tf.keras.optimizers.SGD(learning_rate=lr, momentum=args.momentum)


def gpu_for_rank(local_rank, local_size, visible):
    """Index of the GPU this rank uses among the `visible` ones, or None with no GPU.

    One GPU visible: it is this rank's (srun --gpus-per-task=1 or a per-task CUDA_VISIBLE_DEVICES hands each task
    its own GPU as device 0). At least as many GPUs as ranks on the node: the rank's local index. Fewer GPUs than
    ranks but more than one: a launch error, stopped here in one line rather than by an IndexError or two ranks
    silently sharing a GPU."""
    if visible == 0:
        return None
    if visible == 1:
        return 0
    if visible >= local_size:
        return local_rank
    fail(f"{local_size} ranks on this node but {visible} GPUs visible: start one rank per GPU "
         f"(srun --ntasks-per-node={visible} --gpus-per-task=1, or horovodrun -np/-H with {visible} slots per node)")


def pin_gpu(tf, local_rank, local_size):
    """Horovod: one GPU per rank; its memory grows on demand so that a second process on the GPU (the doctor, a
    profiler) still fits. Returns the GPU's index among the visible ones, or None on a CPU node."""
    gpus = tf.config.list_physical_devices("GPU")
    index = gpu_for_rank(local_rank, local_size, len(gpus))
    if index is not None:
        tf.config.set_visible_devices(gpus[index], "GPU")
        tf.config.experimental.set_memory_growth(gpus[index], True)
    return index


def configure_threads(tf, threads, local_ranks=1):
    """Intra-op threads per rank: --intra-threads, else the cores of this process divided by the ranks on the node
    (TensorFlow's own default takes every core in every rank: N ranks on a node then fight over the cores)."""
    if not threads:
        threads = max(1, len(os.sched_getaffinity(0)) // max(1, local_ranks))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    return threads


def export_saved_model(model, directory, writer):
    """SavedModel export (seed 004). Every MWMS worker must take part in the save; the writer saves into a hidden
    temporary directory that is then renamed to `directory`, the others into a private one that is deleted."""
    if not writer:
        scratch = tempfile.mkdtemp(prefix="tfhpc-export-")
        try:
            model.save(os.path.join(scratch, "model"), save_format="tf")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None
    final = Path(directory).resolve()
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        os.chmod(temporary, 0o777 & ~UMASK)
        model.save(str(temporary), save_format="tf")
        previous = final.with_name(f".{final.name}.old-{os.getpid()}")
        if final.exists():
            os.rename(final, previous)
        os.rename(temporary, final)
        shutil.rmtree(previous, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return str(final)


def hvd_evaluate(tf, hvd, model, x, y, batch):
    """Exact test loss and accuracy over the whole test set with Horovod: each rank evaluates its own shard and the
    sums are allreduced (averaging per-rank means would weight unequal shards wrongly)."""
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    totals = np.zeros(3)
    for images, labels in test_dataset(tf, x, y, batch, shard=(hvd.size(), hvd.rank())):  # Horovod: own shard.
        logits = model(images, training=False)
        correct = tf.reduce_sum(tf.cast(tf.argmax(logits, 1, output_type=tf.int32) == labels, tf.float64))
        totals += [float(loss_fn(labels, logits)), float(correct), len(labels)]
    totals = hvd.allreduce(tf.constant(totals), op=hvd.Sum, name="evaluate").numpy()  # Horovod: global sums.
    return float(totals[0] / totals[2]), float(totals[1] / totals[2])


def flat_weights(model):
    return np.concatenate([w.numpy().ravel() for w in model.weights]).astype(np.float64)


def keras_callbacks(tf):
    """Keras callbacks the fit entrypoints share (defined once TensorFlow is imported)."""

    class EpochLog(tf.keras.callbacks.Callback):
        """Seed 004's PrintLR: the learning rate at the end of each epoch, recorded in the history and printed."""

        def __init__(self, chief):
            super().__init__()
            self.chief = chief

        def on_epoch_end(self, epoch, logs=None):
            lr = float(tf.keras.backend.get_value(self.model.optimizer.learning_rate))
            if logs is not None:
                logs["lr_at_end"] = lr
            log(self.chief, f"learning rate at the end of epoch {epoch + 1}: {lr:.6g}")

    class StepDecay(tf.keras.callbacks.Callback):
        """Seed 004's decay(): the learning rate divided by 10 at each listed epoch (after any warm-up)."""

        def __init__(self, lr, epochs, warmup=0):
            super().__init__()
            self.lr, self.epochs, self.warmup = lr, epochs, warmup

        def on_epoch_begin(self, epoch, logs=None):
            if epoch >= self.warmup:
                self.model.optimizer.learning_rate.assign(self.lr * 0.1 ** sum(epoch >= e for e in self.epochs))

    class SaveEachEpoch(tf.keras.callbacks.Callback):
        """Checkpoints.save after every epoch (participate: non-writers also run the save, see Checkpoints)."""

        def __init__(self, checkpoints, checkpoint, participate=False):
            super().__init__()
            self.checkpoints, self.checkpoint, self.participate = checkpoints, checkpoint, participate

        def on_epoch_end(self, epoch, logs=None):
            self.checkpoints.save(self.checkpoint, epoch + 1, participate=self.participate)

    class EpochScalars(tf.keras.callbacks.Callback):
        """Epoch metrics as TensorBoard scalars (ScalarLog), for images without the tensorboard package."""

        def __init__(self, log_dir):
            super().__init__()
            self.log = ScalarLog(tf, log_dir)

        def on_epoch_end(self, epoch, logs=None):
            self.log.write(epoch + 1, logs or {})

        def on_train_end(self, logs=None):
            self.log.close()

    return argparse.Namespace(EpochLog=EpochLog, StepDecay=StepDecay, SaveEachEpoch=SaveEachEpoch,
                              EpochScalars=EpochScalars)


class ScalarLog:
    """Scalars in TensorBoard's format in <log_dir>/train without the tensorboard package (tf.summary needs it): the
    event file is written directly, as TFRecords of Event protocol buffers. Used by the custom loops and, when
    tensorboard is missing, by the fit entrypoints."""

    def __init__(self, tf, log_dir):
        from tensorflow.core.util import event_pb2
        self.event_pb2 = event_pb2
        directory = Path(log_dir) / "train"
        directory.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.v2"
        self.writer = tf.io.TFRecordWriter(str(directory / name))
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def _write(self, event):
        self.writer.write(event.SerializeToString())
        self.writer.flush()

    def write(self, step, values):
        event = self.event_pb2.Event(wall_time=time.time(), step=step)
        for key, value in sorted(values.items()):
            event.summary.value.add(tag=f"epoch_{key}", simple_value=float(value))
        self._write(event)

    def close(self):
        self.writer.close()


def tensorboard_callback(tf, log_dir):
    """Keras' TensorBoard callback (seed 002: scalars, graph, histograms) when the tensorboard package is installed,
    else epoch scalars written without it."""
    import importlib.util
    if importlib.util.find_spec("tensorboard"):
        return tf.keras.callbacks.TensorBoard(log_dir=log_dir, histogram_freq=1)
    return keras_callbacks(tf).EpochScalars(log_dir)


def parse_epochs(text, flag="--lr-decay-epochs"):
    try:
        return sorted({int(e) for e in text.split(",") if e.strip()})
    except ValueError:
        fail(f"{flag} {text!r} must be comma-separated epoch numbers, e.g. 3,7")


# ---------------------------------------------------------------------------------------------------------------- #
# Output written by one rank, atomically

def atomic_write_bytes(path, data):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(temporary, 0o666 & ~UMASK)  # mkstemp makes 0600; give the file the mode open() would
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)  # readers see the old file or the new one, never half of one
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def save_weights_npz(path, model):
    import io
    buffer = io.BytesIO()
    np.savez(buffer, **{f"{i:03d}:{w.name}": w.numpy() for i, w in enumerate(model.weights)})
    atomic_write_bytes(path, buffer.getvalue())


class Checkpoints:
    """Per-epoch checkpoints of model + optimizer + epoch in <dir>/epoch-NNNN/, plus <dir>/latest.json.

    Only the writer (rank 0 / chief) writes there. A checkpoint is first written into a hidden temporary directory
    beside it and then renamed into place, and latest.json is replaced atomically afterwards: a job killed at any
    moment leaves the previous checkpoint intact and never a half-written one that --resume would pick up.
    Non-writers under MultiWorkerMirroredStrategy still take part in the save (it may need collectives) but write to
    a private temporary directory that is deleted at once (TensorFlow's documented pattern).
    """

    # What a checkpoint must match to be resumed: another --model or --optimizer gives other variables (a traceback
    # from TensorFlow, or a silent partial restore), another --dataset other batches.
    IDENTITY_FLAGS = ("model", "optimizer", "dataset")

    def __init__(self, directory, writer, keep=2, args=None):
        self.directory = Path(directory) if directory else None
        self.writer = writer
        self.keep = keep
        self.written = []
        self.identity = {flag: getattr(args, flag) for flag in self.IDENTITY_FLAGS if hasattr(args, flag)}

    def latest(self):
        """(epoch, checkpoint prefix) of the latest complete checkpoint, or (0, None)."""
        if not self.directory:
            return 0, None
        try:
            record = json.loads((self.directory / "latest.json").read_text())
            prefix = self.directory / record["path"]
        except FileNotFoundError:
            return 0, None
        except (ValueError, KeyError) as error:
            fail(f"{self.directory / 'latest.json'} is unreadable ({error}): remove it to start afresh or "
                 f"point --checkpoint-dir at another run")
        if not Path(str(prefix) + ".index").is_file():
            fail(f"{self.directory / 'latest.json'} names {prefix}, which is missing: restore the directory or "
                 f"drop --resume")
        for flag, value in self.identity.items():
            written = record.get("identity", {}).get(flag, value)
            if written != value:
                fail(f"{self.directory} holds a checkpoint written with --{flag} {written}, not --{flag} {value}: "
                     f"resume with --{flag} {written}, or give a new --checkpoint-dir")
        return int(record["epoch"]), str(prefix)

    def save(self, checkpoint, epoch, participate=False):
        """checkpoint: a tf.train.Checkpoint; epoch: number of completed epochs."""
        if not self.directory:
            return
        if not self.writer:
            if participate:
                scratch = tempfile.mkdtemp(prefix="tfhpc-ckpt-")
                try:
                    checkpoint.write(os.path.join(scratch, "ckpt"))
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"epoch-{epoch:04d}"
        temporary = Path(tempfile.mkdtemp(dir=self.directory, prefix=f".{name}.", suffix=".tmp"))
        try:
            os.chmod(temporary, 0o777 & ~UMASK)
            checkpoint.write(str(temporary / "ckpt"))
            final = self.directory / name
            if final.exists():
                shutil.rmtree(final)
            os.rename(temporary, final)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        record = {"epoch": epoch, "path": f"{name}/ckpt", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "identity": self.identity}
        atomic_write_bytes(self.directory / "latest.json", (json.dumps(record) + "\n").encode())
        self.written.append(name)
        for old in sorted(self.directory.glob("epoch-[0-9][0-9][0-9][0-9]"))[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)


def listing(directory):
    """Relative paths under a directory (for the RESULT line), or None."""
    if not directory or not Path(directory).is_dir():
        return None
    return sorted(str(p.relative_to(directory)) for p in Path(directory).rglob("*"))


# ---------------------------------------------------------------------------------------------------------------- #
# MultiWorkerMirroredStrategy cluster set-up (seeds 001, 003, 004)

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
    are equal modulo the number of blocks. Seed 003: Jean Zay allows ports 10000-20000."""
    blocks = (high - low) // stride
    return low + (job_id % blocks) * stride


def slurm_max_tasks_per_node():
    """Largest number of tasks on one node of the step: SLURM_STEP_TASKS_PER_NODE looks like '2(x3),1'."""
    try:
        return max(int(t.split("(")[0]) for t in os.environ["SLURM_STEP_TASKS_PER_NODE"].split(","))
    except ValueError:
        fail(f"SLURM_STEP_TASKS_PER_NODE={os.environ['SLURM_STEP_TASKS_PER_NODE']!r} is not a Slurm task list "
             f"such as '2(x3),1': start the workers with srun")


def detect_gpus_per_node():
    for name in ("SLURM_GPUS_ON_NODE",):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() not in ("", "-1")])
    if shutil.which("nvidia-smi"):
        import subprocess
        try:
            out = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True, timeout=30).stdout
            return sum(line.startswith("GPU ") for line in out.splitlines())
        except (OSError, subprocess.SubprocessError):
            return 0
    return 0


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


def remove_proxies(keep=False):
    """Seed 003: gRPC (MultiWorkerMirroredStrategy's transport) would send worker-to-worker traffic through an
    HTTP proxy set in the environment; remove them before the strategy starts. Returns what was removed."""
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
                        help="all-reduce implementation: ring (gRPC, CPU and GPU), nccl (GPUs; seed 003's advice), "
                             "auto (TensorFlow picks)")
    parser.add_argument("--auto-shard", default="data", choices=("auto", "data", "file", "off"),
                        help="tf.data auto-shard policy: data = every worker reads everything and keeps its part "
                             "(in-memory data), file = by input file (TFRecords), off = the dataset is already "
                             "sharded per worker")
    parser.add_argument("--keep-proxy", action="store_true",
                        help="keep http(s)_proxy in the environment (by default removed: gRPC would use them)")
    parser.add_argument("--no-memory-growth", dest="memory_growth", action="store_false",
                        help="let TensorFlow take all GPU memory at start (default: grow as needed, seed 004)")
    return parser


def make_strategy(tf, args, plan):
    """MWMS: the strategy, created before any other TensorFlow operation (seed 003)."""
    if args.memory_growth:
        for gpu in tf.config.list_physical_devices("GPU"):  # MWMS: before the runtime starts (seed 004).
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
    # The chief is "chief" if the cluster has one, else worker 0 (seed 004: all nodes as workers).
    is_chief = task_type is None or task_type == "chief" or (task_type == "worker" and task_id == 0
                                                            and "chief" not in spec)
    rank = (0 if task_type in (None, "chief") else task_id + len(spec.get("chief", [])))
    return strategy, {"rank": rank, "workers": max(len(workers), 1), "is_chief": is_chief,
                      "addresses": workers}


def auto_shard_options(tf, policy):
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = {
        "auto": tf.data.experimental.AutoShardPolicy.AUTO, "data": tf.data.experimental.AutoShardPolicy.DATA,
        "file": tf.data.experimental.AutoShardPolicy.FILE, "off": tf.data.experimental.AutoShardPolicy.OFF}[policy]
    return options


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
