#!/usr/bin/env python3
"""Data-parallel training with Horovod and tf.keras Model.fit, as the CSCS Piz Daint course, the IT4Innovations
course and the Lablup course teach it.

Horovod's steps, each marked "# Horovod:" below: hvd.init(); pin one GPU per rank; scale the learning rate with the
number of ranks (--lr-scaling); shard the data so each rank reads its own part and divide the steps per epoch by the
number of ranks; wrap the optimizer in hvd.DistributedOptimizer (gradients averaged by allreduce); broadcast rank 0's
initial state; average the metrics; warm the learning rate up; and let only rank 0 print, write TensorBoard logs,
checkpoints and exported weights.

Run with N ranks, e.g.:
    horovodrun -np 2 python hvd_keras_fit.py --epochs 3
    mpirun -np 2 python hvd_keras_fit.py
    srun --mpi=pmix python hvd_keras_fit.py --checkpoint-dir $SCRATCH/ckpt --resume
    mpirun -np 2 python hvd_keras_fit.py --log-dir logs --profile-steps 5,8   # then: tensorboard --logdir logs

Defaults: the built-in glyphs data set (no download), per-rank batch 32, lr 0.01 x ranks (linear scaling) with one
warm-up epoch, SGD with momentum 0.9, seed 1234 on every rank. Every rank prints one "RESULT {json}" line.

SIGUSR1 or SIGTERM (Slurm's warning before the time limit, preemption) saves and stops: the ranks agree after every
batch, rank 0 writes a checkpoint of that step, every rank exits with status 99; --resume auto continues there.

--elastic (Horovod Elastic, under `horovodrun --min-np N --max-np M --host-discovery-script SCRIPT`): hvd.elastic's
KerasState holds the model, the optimizer and the position, committed in memory every --commit-steps batches; when a
host fails or joins, the ranks roll back to the last commit, Horovod starts again with the hosts there are, rank 0's
state is broadcast, and Model.fit goes on after the samples the epoch has done, with the learning rate and the warm-up
scaled for the new number of ranks.
"""
import os
import socket
import sys
import time

import numpy as np

from tfhpc_runtime.callbacks import elastic_callbacks, keras_callbacks, tensorboard_callback
from tfhpc_runtime.checkpoints import Checkpoints, export_saved_model
from tfhpc_runtime.cli import Parser, log, report
from tfhpc_runtime.data import load_data, per_replica_batch, steps_per_epoch, train_dataset
from tfhpc_runtime.elastic import (Timeline, add_elastic_args, check_elastic_args, resume_step,
                                   run_training)
from tfhpc_runtime.errors import fail, launch_size
from tfhpc_runtime.files import listing, save_weights_npz
from tfhpc_runtime.gpu import pin_gpu
from tfhpc_runtime.kerasselect import select_keras
from tfhpc_runtime.metrics import configure_threads
from tfhpc_runtime.model import (build_model, flat_weights, hvd_evaluate, keras_version, make_optimizer,
                                 optimizer_variables, scaled_lr)
from tfhpc_runtime.preemption import StopOnSignal
from tfhpc_runtime.trainflags import add_training_args, check_training_args, parse_epochs


def main():
    parser = Parser(__doc__.split("\n\n")[0])
    add_training_args(parser, lr=0.05)
    parser.add_argument("--warmup-epochs", type=float, default=1.0,
                        help="epochs over which the learning rate rises from --lr to the scaled one (0 = off)")
    parser.add_argument("--lr-decay-epochs", default="",
                        help="comma-separated epochs at which the learning rate is divided by 10 (the Lablup "
                             "course's schedule)")
    parser.add_argument("--different-init-per-rank", action="store_true",
                        help="start every rank from other random weights, to see the broadcast make them agree")
    add_elastic_args(parser)
    args = parser.parse_args()
    check_training_args(args)
    args.keras = select_keras(args.keras)  # before TensorFlow is imported: its import reads the choice
    check_elastic_args(args)
    per_replica_batch(args, launch_size())  # checked again once Horovod knows its size
    decay_epochs = parse_epochs(args.lr_decay_epochs)
    stop = StopOnSignal()  # from now on SIGUSR1/SIGTERM only set a flag

    import tensorflow as tf
    import horovod.tensorflow.keras as hvd
    from horovod.tensorflow import Sum, allreduce, broadcast_object, broadcast_variables

    hvd.init()  # Horovod: join the job started by horovodrun/mpirun/srun.
    rank, size = hvd.rank(), hvd.size()
    chief = rank == 0  # Horovod: rank 0 alone prints and writes.
    threads = configure_threads(tf, args.intra_threads, hvd.local_size())
    pin_gpu(tf, hvd.local_rank(), hvd.local_size())  # Horovod: one GPU per rank.

    batch = per_replica_batch(args, size)
    (x_train, y_train), (x_test, y_test) = load_data(args)
    steps = steps_per_epoch(args, len(x_train), batch * size)  # Horovod: the epoch is split across ranks.
    lr = scaled_lr(args.lr, size, args.lr_scaling)  # Horovod: scale the learning rate with the ranks.

    # Horovod: the ranks agree after every batch whether one of them was signalled (a one-number allreduce).
    stop.agree = lambda flag: float(allreduce(tf.constant(flag), op=Sum, name="tfhpc_stop"))
    stop.end = (args.epochs - 1, steps)
    checkpoints = Checkpoints.for_training(args, chief, size, batch * size, steps)
    start_epoch, start_step, resume_from = checkpoints.latest() if args.resume and chief else (0, 0, None)
    if not args.elastic:  # Horovod Elastic: no collective before hvd.elastic.run (a joining rank would block)
        start_epoch, start_step = broadcast_object((start_epoch, start_step), root_rank=0)  # Horovod: rank 0's view
    if start_epoch >= args.epochs:
        fail(f"the checkpoint in {args.checkpoint_dir} has already done {start_epoch} epoch(s): raise "
             f"--epochs above {start_epoch} to train further")

    tf.keras.utils.set_random_seed(args.seed + (rank if args.different_init_per_rank else 0))
    model = build_model(tf, args.model)
    tf.keras.utils.set_random_seed(args.seed)  # the same global seed for the data pipeline on every rank
    optimizer = make_optimizer(tf, args, lr)
    optimizer = hvd.DistributedOptimizer(optimizer)  # Horovod: average the gradients of all ranks.
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)  # Horovod: its ops have no XLA kernels (Keras 3
    # compiles fit's step with XLA where a GPU is visible, docs/keras.md).
    optimizer.build(model.trainable_variables)  # slots exist now, so that they can be restored and broadcast
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    if resume_from and chief:  # Horovod: rank 0 reads the checkpoint; the broadcast below hands it on.
        checkpoint.read(resume_from).assert_existing_objects_matched()
        log(chief, f"resumed from {resume_from} after epoch {start_epoch}"
                   + (f" and {start_step} step(s) of epoch {start_epoch + 1}" if start_step else ""))
    # Horovod: rank 0's initial state (weights, optimizer slots, step counter) on every rank, before the first
    # step. hvd.callbacks.BroadcastGlobalVariablesCallback(0) does the same after the first batch, which suits
    # identical starts but lets ranks that resumed differently average gradients of different weights once.
    if not args.elastic:  # Horovod Elastic: KerasState broadcasts them at every (re)start
        broadcast_variables(model.variables + optimizer_variables(optimizer), root_rank=0)
    initial_weights = flat_weights(model)

    extra = keras_callbacks(tf)
    tracking = elastic_callbacks(tf, hvd.elastic.CommitStateCallback if args.elastic else None)
    timeline = Timeline(time.time)

    def fit_callbacks(first_epoch, first_step, lr, steps, chief, checkpoints):
        callbacks = [
            hvd.callbacks.MetricAverageCallback(),  # Horovod: epoch metrics averaged over the ranks.
        ]
        if args.warmup_epochs > 0 and lr != args.lr and first_epoch < args.warmup_epochs:
            # Horovod: from lr/size up to the scaled rate. No momentum correction: Keras >= 2.11 optimizers hold
            # momentum as a Python number that the compiled train step captures when it is traced (on the first,
            # corrected batch), so the correction would freeze a smaller momentum in for the whole run.
            warmup = hvd.callbacks.LearningRateWarmupCallback(
                initial_lr=lr, warmup_epochs=args.warmup_epochs, steps_per_epoch=steps, momentum_correction=False,
                verbose=0)
            callbacks.append(extra.ShiftBatches(warmup, first_step) if first_step else warmup)
        if decay_epochs:
            callbacks.append(extra.StepDecay(lr, decay_epochs, args.warmup_epochs))
        callbacks.append(extra.EpochLog(chief))
        callbacks.append(extra.SaveOnSignal(stop, checkpoints, checkpoint, first_step=first_step))  # every rank
        if chief:  # Horovod: logs and checkpoints from rank 0 only, so that ranks do not overwrite each other.
            callbacks.append(extra.SaveEachEpoch(checkpoints, checkpoint, stop=stop))
            if args.log_steps:
                callbacks.append(extra.StepLog(args.log_steps, args.epochs, steps, first_step))
            if args.log_dir:  # Horovod: TensorBoard scalars and the --profile-steps trace of rank 0.
                callbacks.append(tensorboard_callback(tf, args.log_dir, args.profile_steps))
        return callbacks

    def train(state):
        """Model.fit over the epochs from state.epoch on, state.samples into it. With --elastic, Horovod's run()
        calls it again after every reset, with the state of the last commit and the ranks there are then."""
        rank, size = hvd.rank(), hvd.size()
        chief = rank == 0
        steps = steps_per_epoch(args, len(x_train), batch * size)
        lr = scaled_lr(args.lr, size, args.lr_scaling)  # Horovod: scale the learning rate with the ranks.
        if args.elastic:  # after a reset: the rate for the new number of ranks (the warm-up sets its own)
            optimizer.learning_rate.assign(lr)
        stop.end = (args.epochs - 1, steps)
        checkpoints = Checkpoints.for_training(args, chief, size, batch * size, steps)
        first_epoch, first_step = state.epoch, resume_step(state.samples, batch * size, steps)
        # One Model.fit per stretch of whole epochs; a run resumed mid-epoch first finishes that epoch in a fit of
        # its own.
        stretches = [(first_epoch, first_epoch + 1, first_step)] if first_step else []
        if first_epoch + bool(first_step) < args.epochs:
            stretches.append((first_epoch + bool(first_step), args.epochs, 0))
        for stretch_epoch, end_epoch, stretch_step in stretches:
            data = train_dataset(tf, x_train, y_train, batch=batch, steps=steps, seed=args.seed,
                                 start_epoch=stretch_epoch, epochs=end_epoch, shuffle_buffer=args.shuffle_buffer,
                                 shard=(size, rank),  # Horovod: each rank reads its own part of the data.
                                 cache_file=cache_file(args, rank), start_step=stretch_step)
            callbacks = fit_callbacks(stretch_epoch, stretch_step, lr, steps, chief, checkpoints)
            callbacks.append(tracking.Record(state, batch * size, stretch_step, timeline, size))
            if args.elastic:  # Horovod Elastic: the state to roll back to; raises when hosts changed
                callbacks.append(tracking.Commit(state, args.commit_steps))
            model.fit(data, epochs=end_epoch, initial_epoch=stretch_epoch, steps_per_epoch=steps - stretch_step,
                      callbacks=callbacks, verbose=args.verbose if chief else 0)  # Horovod: rank 0 prints.
            if stop.at:
                stop.exit({"rank": rank, "size": size, "script": "hvd_keras_fit",
                           "initial_epoch": state.initial[0], "initial_step": state.initial[1],
                           "epochs": args.epochs, "steps_per_epoch": steps,
                           "checkpoints_written": checkpoints.written,
                           "weights_sum": float(flat_weights(model).sum()),
                           "checkpoint_dir_listing": listing(args.checkpoint_dir) if chief else None,
                           "failures": []})
        return checkpoints

    # "initial": rank 0's resume point; Horovod Elastic broadcasts the state, so every rank reports it.
    history = {"initial": [start_epoch, start_step], "epoch": start_epoch,
               "samples": start_step * batch * size, "losses": [], "accuracies": [],
               "learning_rates": []}
    started = time.time()
    elastic = (hvd.elastic.KerasState, hvd.elastic.run, model, optimizer) if args.elastic else None
    state, checkpoints = run_training(train, history, timeline, elastic)
    rank, size = hvd.rank(), hvd.size()  # Horovod Elastic: the ranks at the end
    chief = rank == 0
    seconds = time.time() - started

    test_loss, test_accuracy = hvd_evaluate(tf, hvd, model, x_test, y_test, batch)
    flat = flat_weights(model)
    everyone = hvd.allgather(tf.constant(flat[None, :])).numpy()  # Horovod: every rank's weights, to compare.
    max_difference = float(np.max(np.abs(everyone - everyone[0])))
    if chief and args.weights_out:
        save_weights_npz(args.weights_out, model)
    exported = export_saved_model(model, args.export_dir, True) if chief and args.export_dir else None
    log(chief, f"test loss {test_loss:.4f}, test accuracy {test_accuracy:.4f}, {seconds:.1f} s")
    failures = [] if max_difference == 0.0 else [f"weights differ across ranks by up to {max_difference}"]
    report({
        "host": socket.gethostname(), "rank": rank, "size": size, "script": "hvd_keras_fit",
        "keras": keras_version(model), "dataset": args.dataset, "model": args.model,
        "batch_per_rank": batch, "global_batch": batch * size,
        "steps_per_epoch": steps_per_epoch(args, len(x_train), batch * size),
        "lr": scaled_lr(args.lr, size, args.lr_scaling), "initial_epoch": state.initial[0], "epochs": args.epochs,
        "exported": exported, "losses": state.losses, "accuracies": state.accuracies,
        "learning_rates": state.learning_rates, "initial_step": state.initial[1],
        "test_loss": test_loss, "test_accuracy": test_accuracy, "train_seconds": seconds, "intra_threads": threads,
        "weights_sum": float(flat.sum()), "max_weight_change": float(abs(flat - initial_weights).max()),
        "max_weight_difference_across_ranks": max_difference, "checkpoints_written": checkpoints.written,
        "checkpoint_dir_listing": listing(args.checkpoint_dir) if chief else None, "failures": failures,
        "elastic": timeline.result() if args.elastic else None})
    return 1 if failures else 0


def cache_file(args, rank):
    # Cache on node-local storage, as the IT4Innovations course advises: one file per rank.
    return os.path.join(args.cache_dir, f"train-rank{rank}") if args.cache_dir else None


if __name__ == "__main__":
    sys.exit(main())
