"""Data sets that need no download, the batch and step arithmetic of data parallelism, and the tf.data pipelines.

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

TensorFlow is passed in as `tf` by the functions that build pipelines; the module itself needs only numpy.
"""
import gzip
import os
from pathlib import Path

import numpy as np

from .errors import fail

DIGITS_FILE = Path(os.environ.get("TFHPC_DATA", "/opt/tfhpc/data")) / "digits.csv.gz"
DIGITS_TRAIN = 1437  # scikit-learn's digits: 1797 samples, 80 % for training
IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
KERAS_DATASETS_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/"
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
FASHION_IDX_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                     "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


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
                  shard=None, cache_file=None, start_step=0):
    """The training pipeline of the IT4Innovations course and the IDRIS Jean Zay guide: [shard] -> map(scale) ->
    cache -> shuffle -> batch(drop_remainder=True) -> prefetch, with AUTOTUNE.

    Epoch e is shuffled with seed + e, so the order of every epoch is fixed by (seed, e) alone: all ranks shuffle
    alike, and a run resumed at epoch e sees exactly the batches an uninterrupted run sees there; start_step skips
    the batches of epoch start_epoch that a run stopped mid-epoch has done. drop_remainder keeps every step's batch
    full, so every rank takes the same number of steps.
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

    return tf.data.Dataset.range(start_epoch, epochs).flat_map(epoch).skip(start_step).prefetch(autotune)


def test_dataset(tf, x, y, batch, shard=None):
    data = tf.data.Dataset.from_tensor_slices((x, y))
    if shard is not None:
        data = data.shard(*shard)
    return data.map(lambda image, label: (tf.cast(image, tf.float32) / 255.0, label)).batch(batch)


# ---------------------------------------------------------------------------------------------------------------- #
# Batches and steps

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
    """--steps-per-epoch, else one pass over the training set by the global batch: with N ranks each takes 1/N of
    the steps a single worker would (the IT4Innovations course's steps / size)."""
    steps = args.steps_per_epoch or train_samples // global_batch
    if steps < 1 or steps * global_batch > train_samples:
        fail(f"{steps} step(s) of a global batch of {global_batch} need {max(steps, 1) * global_batch} training "
             f"samples but there are {train_samples}: lower --batch-size or --steps-per-epoch, or raise "
             f"--train-samples")
    return steps


def auto_shard_options(tf, policy):
    """MWMS: how tf.data splits a dataset among the workers (--auto-shard), set on the dataset's options as the
    Lablup course does."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = {
        "auto": tf.data.experimental.AutoShardPolicy.AUTO, "data": tf.data.experimental.AutoShardPolicy.DATA,
        "file": tf.data.experimental.AutoShardPolicy.FILE, "off": tf.data.experimental.AutoShardPolicy.OFF}[policy]
    return options
