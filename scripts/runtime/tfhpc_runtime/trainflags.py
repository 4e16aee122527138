"""The flags every training entrypoint shares, and the checks of them that run before TensorFlow starts (bad input
is reported in well under a second, before anything is written)."""
import os
from pathlib import Path

from .data import check_data_args
from .errors import fail
from .kerasselect import add_keras_arg
from .metrics import default_threads
from .model import LR_SCALING


def add_training_args(parser, epochs=3, batch_size=32, lr=0.01, model="cnn"):
    parser.add_argument("--dataset", default="glyphs",
                        choices=("glyphs", "digits", "synthetic", "mnist", "fashion_mnist"),
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
    parser.add_argument("--resume", nargs="?", const="auto", choices=("auto",), default=None,
                        help="--resume or --resume auto: continue from the newest complete checkpoint in "
                             "--checkpoint-dir, at an epoch or where a signal stopped the run, or start fresh when "
                             "there is none")
    parser.add_argument("--log-steps", type=int, default=0, metavar="N",
                        help="print 'epoch E/EPOCHS step S/STEPS' every N steps (rank 0 / chief only; 0 = never)")
    parser.add_argument("--log-dir", default=None,
                        help="TensorBoard logs (rank 0 / chief only): epoch scalars in <log-dir>/train; view them with "
                             "tensorboard --logdir <log-dir>")
    parser.add_argument("--profile-steps", default=None, metavar="A,B",
                        help="write a TensorFlow profiler trace of this run's steps A to B (counted from 1) into "
                             "<log-dir>/plugins/profile (rank 0 / chief only; needs --log-dir)")
    parser.add_argument("--export-dir", default=None,
                        help="write the trained model here as a SavedModel (rank 0 / chief, atomically)")
    parser.add_argument("--weights-out", default=None,
                        help="write the final weights to this .npz (rank 0 / chief only, atomically)")
    parser.add_argument("--intra-threads", type=int, default=default_threads(),
                        help="TensorFlow intra-op threads per rank; default from OMP_NUM_THREADS or "
                             "SLURM_CPUS_PER_TASK (as the CSCS Piz Daint course's job script sets it), else (0) the "
                             "cores divided by the ranks on the node")
    parser.add_argument("--verbose", type=int, default=2, choices=(0, 1, 2), help="Keras verbosity on rank 0")
    add_keras_arg(parser)
    return parser


def add_backup_args(parser):
    """The MWMS entrypoints' TensorFlow backup (tfhpc_runtime.backup)."""
    parser.add_argument("--backup-dir", default=None,
                        help="back up the training state here every --backup-every-steps steps (Keras' "
                             "BackupAndRestore in fit, a tf.train.CheckpointManager in its layout in the loop; the "
                             "chief writes, on a file system every worker sees); the same command run again "
                             "continues from the backup, which is deleted when training ends")
    parser.add_argument("--backup-every-steps", type=int, default=10, metavar="N",
                        help="steps between backups: a worker killed without warning costs at most N steps")
    return parser


def check_training_args(args):
    """Everything that can be checked before TensorFlow starts; one line and a non-zero exit otherwise."""
    if args.log_steps < 0:
        fail(f"--log-steps must be 0 (never) or a number of steps, got {args.log_steps}")
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
    if getattr(args, "backup_dir", None):
        if args.resume:
            fail("--backup-dir restores its backup by itself: drop --resume (or drop --backup-dir to resume from "
                 "--checkpoint-dir)")
        if args.backup_every_steps < 1:
            fail(f"--backup-every-steps must be at least 1, got {args.backup_every_steps}")
    args.profile_steps = parse_profile_steps(args.profile_steps, args.log_dir)
    check_data_args(args)
    for flag in ("checkpoint_dir", "backup_dir", "log_dir", "weights_out", "cache_dir"):
        path = getattr(args, flag, None)
        if path:
            parent = Path(path).resolve().parent if flag == "weights_out" else Path(path).resolve()
            existing = next(p for p in (parent, *parent.parents) if p.exists())
            if not os.access(existing, os.W_OK):
                fail(f"--{flag.replace('_', '-')} {path}: {existing} is not writable; choose a writable path "
                     f"(e.g. a bind-mounted directory)")


def parse_profile_steps(text, log_dir):
    """--profile-steps "A,B" -> (A, B) with 1 <= A <= B, or None when not given."""
    if text is None:
        return None
    try:
        first, last = (int(value) for value in text.split(","))
    except ValueError:
        first, last = 0, 0
    if not 1 <= first <= last:
        fail(f"--profile-steps {text!r} must be two step numbers A,B with 1 <= A <= B, e.g. 5,8")
    if not log_dir:
        fail("--profile-steps needs --log-dir (the profiler trace is written there)")
    return first, last


def parse_epochs(text, flag="--lr-decay-epochs"):
    try:
        return sorted({int(e) for e in text.split(",") if e.strip()})
    except ValueError:
        fail(f"{flag} {text!r} must be comma-separated epoch numbers, e.g. 3,7")
