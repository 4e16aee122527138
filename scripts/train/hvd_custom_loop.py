#!/usr/bin/env python3
"""Data-parallel training with Horovod and a custom training loop (tf.GradientTape in a tf.function).

Horovod's steps, each marked "# Horovod:" below: hvd.init(); one GPU per rank; learning rate scaled with the ranks
(--lr-scaling) and warmed up; the data sharded per rank and the epoch split across ranks; hvd.DistributedGradientTape
so that the gradients are averaged by allreduce; rank 0's state broadcast after the first step (the optimizer's slots
exist only from then on; the weights are also broadcast before it, so that a run whose ranks start differently, e.g.
resumed from rank 0's checkpoint, computes its first gradients from the same weights); metrics averaged; rank 0 alone
prints and writes checkpoints and TensorBoard logs (tf.summary; the TensorFlow profiler with --profile-steps).

    horovodrun -np 2 python hvd_custom_loop.py --epochs 3
    mpirun -np 2 python hvd_custom_loop.py --checkpoint-dir ckpt --resume
    mpirun -np 2 python hvd_custom_loop.py --log-dir logs --profile-steps 5,8   # then: tensorboard --logdir logs

Every rank prints one "RESULT {json}" line. SIGUSR1 or SIGTERM saves and stops: the ranks agree after every step,
rank 0 writes a checkpoint of that step, every rank exits with status 99; --resume auto continues there.

--elastic (Horovod Elastic, under `horovodrun --min-np N --max-np M --host-discovery-script SCRIPT`): the model,
optimizer and position are committed in memory every --commit-steps steps; when a host fails or joins, the ranks roll
back to the last commit, Horovod starts again with the hosts there are, rank 0's state is broadcast, and the epoch
goes on after the samples it has done, with the learning rate scaled for the new number of ranks.
"""
import socket
import sys
import time

import numpy as np

from tfhpc_runtime.callbacks import ProfileWindow, log_step
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
from tfhpc_runtime.trainflags import add_training_args, check_training_args


def main():
    parser = Parser(__doc__.split("\n\n")[0])
    add_training_args(parser, lr=0.05)
    parser.add_argument("--warmup-epochs", type=float, default=1.0,
                        help="epochs over which the learning rate rises from lr/size to the scaled one (0 = off)")
    parser.add_argument("--different-init-per-rank", action="store_true",
                        help="start every rank from other random weights, to see the broadcast make them agree")
    add_elastic_args(parser)
    args = parser.parse_args()
    check_training_args(args)
    args.keras = select_keras(args.keras)  # before TensorFlow is imported: its import reads the choice
    check_elastic_args(args)
    per_replica_batch(args, launch_size())  # checked again once Horovod knows its size
    stop = StopOnSignal()  # from now on SIGUSR1/SIGTERM only set a flag

    import tensorflow as tf
    import horovod.tensorflow as hvd

    hvd.init()  # Horovod: join the job started by horovodrun/mpirun/srun.
    rank, size = hvd.rank(), hvd.size()
    chief = rank == 0  # Horovod: rank 0 alone prints and writes.
    threads = configure_threads(tf, args.intra_threads, hvd.local_size())
    pin_gpu(tf, hvd.local_rank(), hvd.local_size())  # Horovod: one GPU per rank.

    batch = per_replica_batch(args, size)
    (x_train, y_train), (x_test, y_test) = load_data(args)
    steps = steps_per_epoch(args, len(x_train), batch * size)  # Horovod: the epoch is split across ranks.

    # Horovod: the ranks agree after every step whether one of them was signalled (a one-number allreduce).
    stop.agree = lambda flag: float(hvd.allreduce(tf.constant(flag), op=hvd.Sum, name="tfhpc_stop"))
    checkpoints = Checkpoints.for_training(args, chief, size, batch * size, steps)
    start_epoch, start_step, resume_from = checkpoints.latest() if args.resume and chief else (0, 0, None)
    if not args.elastic:  # Horovod Elastic: no collective before hvd.elastic.run (a joining rank would block)
        start_epoch, start_step = hvd.broadcast_object((start_epoch, start_step), root_rank=0)  # Horovod: rank 0's view
    if start_epoch >= args.epochs:
        fail(f"the checkpoint in {args.checkpoint_dir} has already done {start_epoch} epoch(s): raise "
             f"--epochs above {start_epoch} to train further")

    tf.keras.utils.set_random_seed(args.seed + (rank if args.different_init_per_rank else 0))
    model = build_model(tf, args.model)
    tf.keras.utils.set_random_seed(args.seed)  # the same global seed for the data pipeline on every rank
    optimizer = make_optimizer(tf, args, scaled_lr(args.lr, size, args.lr_scaling))
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # The slots exist before the checkpoint is read (Keras 3 restores no variable created later) and, for Horovod
    # Elastic, to be committed.
    optimizer.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    if resume_from and chief:  # Horovod: rank 0 reads the checkpoint (optimizer slots fill in when created).
        checkpoint.read(resume_from)
        log(chief, f"resumed from {resume_from} after epoch {start_epoch}"
                   + (f" and {start_step} step(s) of epoch {start_epoch + 1}" if start_step else ""))
    if not args.elastic:  # Horovod Elastic: TensorFlowKerasState broadcasts them at every (re)start
        hvd.broadcast_variables(model.variables, root_rank=0)  # Horovod: rank 0's weights before the first step.
    initial_weights = flat_weights(model)

    @tf.function
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = loss_fn(labels, logits)  # the mean over this rank's batch
        tape = hvd.DistributedGradientTape(tape)  # Horovod: gradients averaged over the ranks.
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        correct = tf.reduce_mean(tf.cast(tf.argmax(logits, 1, output_type=tf.int32) == labels, tf.float32))
        return loss, correct

    log_to_tensorboard = bool(chief and args.log_dir)  # Horovod: rank 0 alone writes TensorBoard logs.
    writer = tf.summary.create_file_writer(f"{args.log_dir}/train") if log_to_tensorboard else None
    profiler = ProfileWindow(tf, args.log_dir, args.profile_steps if log_to_tensorboard else None)
    timeline = Timeline(time.time)
    run = {"step": 0}  # --profile-steps counts from 1 in this run

    def train(state):
        """The epochs from state.epoch on, state.samples into it. With --elastic, Horovod's run() calls it again
        after every reset, with the state of the last commit and the ranks there are then."""
        rank, size = hvd.rank(), hvd.size()
        chief = rank == 0
        steps = steps_per_epoch(args, len(x_train), batch * size)
        lr = scaled_lr(args.lr, size, args.lr_scaling)  # Horovod: scale the learning rate with the ranks.
        optimizer.learning_rate.assign(lr)
        warmup_steps = int(args.warmup_epochs * steps) if lr != args.lr else 0
        stop.end = (args.epochs - 1, steps)
        checkpoints = Checkpoints.for_training(args, chief, size, batch * size, steps)
        first_epoch, first_step = state.epoch, resume_step(state.samples, batch * size, steps)
        iterator = iter(train_dataset(tf, x_train, y_train, batch=batch, steps=steps, seed=args.seed,
                                      start_epoch=first_epoch, epochs=args.epochs, shuffle_buffer=args.shuffle_buffer,
                                      shard=(size, rank),  # Horovod: each rank reads its own part of the data.
                                      cache_file=f"{args.cache_dir}/train-rank{rank}" if args.cache_dir else None,
                                      start_step=first_step))
        for epoch in range(first_epoch, args.epochs):
            for step in range(first_step if epoch == first_epoch else 0, steps):
                global_step = epoch * steps + step
                run["step"] += 1
                if global_step < warmup_steps:  # Horovod: warm-up, from lr/size to lr over the first steps.
                    progress = global_step / warmup_steps
                    optimizer.learning_rate.assign(lr * (1.0 / size * (1 - progress) + progress))
                elif global_step == warmup_steps:
                    optimizer.learning_rate.assign(lr)
                images, labels = next(iterator)
                profiler.begin(run["step"])
                loss, correct = train_step(images, labels)
                if run["step"] == 1 and not args.elastic:
                    # Horovod: rank 0's complete state (weights and the optimizer's slots, created by the first
                    # step). Horovod Elastic broadcasts it at every (re)start instead.
                    hvd.broadcast_variables(model.variables, root_rank=0)
                    hvd.broadcast_variables(optimizer_variables(optimizer), root_rank=0)
                state.totals = [state.totals[0] + float(loss), state.totals[1] + float(correct), state.totals[2] + 1]
                state.samples = (step + 1) * batch * size
                profiler.end(run["step"])
                timeline.step(size)
                log_step(chief, args.log_steps, epoch, args.epochs, step + 1, steps)
                if stop.requested(epoch, step + 1):  # Horovod: every rank, the same answer
                    if chief:  # Horovod: rank 0 writes the checkpoint of this step.
                        checkpoints.save(checkpoint, epoch, step + 1)
                    profiler.close()
                    stop.exit({"rank": rank, "size": size, "script": "hvd_custom_loop",
                               "initial_epoch": state.initial[0], "initial_step": state.initial[1],
                               "epochs": args.epochs, "steps_per_epoch": steps,
                               "checkpoints_written": checkpoints.written, "losses": state.losses,
                               "weights_sum": float(flat_weights(model).sum()),
                               "checkpoint_dir_listing": listing(args.checkpoint_dir) if chief else None,
                               "failures": []})
                if args.elastic and (step + 1) % args.commit_steps == 0 and step + 1 < steps:
                    state.commit()  # Horovod Elastic: the state to roll back to; raises when hosts changed
            means = hvd.allreduce(tf.constant(np.array(state.totals[:2]) / state.totals[2]), op=hvd.Average,
                                  name=f"epoch{epoch}").numpy()  # Horovod
            state.losses = state.losses + [float(means[0])]
            state.accuracies = state.accuracies + [float(means[1])]
            state.learning_rates = state.learning_rates + [float(optimizer.learning_rate.numpy())]
            state.epoch, state.samples, state.totals = epoch + 1, 0, [0.0, 0.0, 0]
            log(chief, f"epoch {epoch + 1}/{args.epochs}: loss {means[0]:.4f}, accuracy {means[1]:.4f}, "
                       f"lr {state.learning_rates[-1]:.4g}" + (f", {size} ranks" if args.elastic else ""))
            if chief:  # Horovod: logs and checkpoints from rank 0 only.
                checkpoints.save(checkpoint, epoch + 1)
            if writer:  # the tags and steps of Keras' TensorBoard callback: epoch_<metric> at step = epoch (from 0)
                with writer.as_default():
                    tf.summary.scalar("epoch_loss", state.losses[-1], step=epoch)
                    tf.summary.scalar("epoch_accuracy", state.accuracies[-1], step=epoch)
                    tf.summary.scalar("epoch_lr_at_end", state.learning_rates[-1], step=epoch)
                writer.flush()
            if args.elastic:
                state.commit()
        return checkpoints

    # "initial": rank 0's resume point; Horovod Elastic broadcasts the state, so every rank reports it.
    progress = {"initial": [start_epoch, start_step], "epoch": start_epoch,
                "samples": start_step * batch * size, "totals": [0.0, 0.0, 0],
                "losses": [], "accuracies": [], "learning_rates": []}
    started = time.time()
    elastic = (hvd.elastic.TensorFlowKerasState, hvd.elastic.run, model, optimizer) if args.elastic else None
    state, checkpoints = run_training(train, progress, timeline, elastic)
    rank, size = hvd.rank(), hvd.size()  # Horovod Elastic: the ranks at the end
    chief = rank == 0
    profiler.close()
    if writer:
        writer.close()
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
        "host": socket.gethostname(), "rank": rank, "size": size, "script": "hvd_custom_loop",
        "keras": keras_version(model), "dataset": args.dataset, "model": args.model,
        "batch_per_rank": batch, "global_batch": batch * size,
        "steps_per_epoch": steps_per_epoch(args, len(x_train), batch * size),
        "lr": scaled_lr(args.lr, size, args.lr_scaling),
        "initial_epoch": state.initial[0], "initial_step": state.initial[1], "epochs": args.epochs,
        "exported": exported,
        "losses": state.losses, "accuracies": state.accuracies,
        "learning_rates": state.learning_rates, "test_loss": test_loss, "test_accuracy": test_accuracy,
        "train_seconds": seconds, "intra_threads": threads, "weights_sum": float(flat.sum()),
        "max_weight_change": float(abs(flat - initial_weights).max()),
        "max_weight_difference_across_ranks": max_difference, "checkpoints_written": checkpoints.written,
        "checkpoint_dir_listing": listing(args.checkpoint_dir) if chief else None, "failures": failures,
        "elastic": timeline.result() if args.elastic else None})
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
