#!/usr/bin/env python3
"""Data-parallel training with MultiWorkerMirroredStrategy and a custom training loop, as the IDRIS Jean Zay guide
teaches it.

The steps, each marked "# MWMS:" below, besides those of mwms_keras_fit.py (proxies, cluster, strategy first,
strategy.scope()): a global seed so that every worker shuffles alike; shuffle().batch(global batch,
drop_remainder=True) so that every step's global batch is full; strategy.experimental_distribute_dataset, which hands
each replica its slice of every global batch; per-example losses summed and divided by the *global* batch
(tf.nn.compute_average_loss) because the replicas' gradients are summed; strategy.run in a tf.function;
strategy.reduce for the loss and the metrics; a distributed evaluation built the same way; TensorBoard logs
(tf.summary; the TensorFlow profiler with --profile-steps) from the chief alone.

    python launch_local_mwms.py -n 2 python mwms_custom_loop.py --epochs 3
    srun --ntasks=2 python mwms_custom_loop.py --checkpoint-dir $SCRATCH/ckpt --resume
    srun --ntasks=2 python mwms_custom_loop.py --log-dir logs --profile-steps 5,8   # then: tensorboard --logdir logs

Every worker prints one "RESULT {json}" line. SIGUSR1 or SIGTERM saves and stops: the workers agree after every
step, the chief writes a checkpoint of that step, every worker exits with status 99; --resume auto continues there.
--backup-dir DIR backs the training up every --backup-every-steps steps (and at a signal's stop) with
tf.train.CheckpointManager in BackupAndRestore's layout: a worker killed without warning costs at most that many
steps, and the same command run again continues from the backup.
"""
import sys
import time

from tfhpc_runtime.backup import Backup, LoopBackup
from tfhpc_runtime.callbacks import ProfileWindow, log_step
from tfhpc_runtime.checkpoints import Checkpoints, export_saved_model
from tfhpc_runtime.cli import Parser, log, report
from tfhpc_runtime.cluster import add_mwms_args, make_strategy, plan_cluster, remove_proxies, sum_over_workers
from tfhpc_runtime.data import (auto_shard_options, load_data, per_replica_batch, steps_per_epoch, test_dataset,
                                train_dataset)
from tfhpc_runtime.errors import fail
from tfhpc_runtime.files import listing, save_weights_npz
from tfhpc_runtime.kerasselect import select_keras
from tfhpc_runtime.metrics import configure_threads
from tfhpc_runtime.model import build_model, flat_weights, keras_version, make_optimizer, scaled_lr
from tfhpc_runtime.preemption import StopOnSignal
from tfhpc_runtime.trainflags import add_backup_args, add_training_args, check_training_args


def main():
    parser = Parser(__doc__.split("\n\n")[0])
    add_training_args(parser, lr=0.05)
    add_mwms_args(parser)
    add_backup_args(parser)
    args = parser.parse_args()
    check_training_args(args)
    stop = StopOnSignal()  # from now on SIGUSR1/SIGTERM only set a flag
    plan = plan_cluster(args)  # MWMS: TF_CONFIG checked, Slurm port base chosen, before TensorFlow starts.
    removed_proxies = remove_proxies(args.keep_proxy)  # MWMS: no HTTP proxy for gRPC.
    per_replica_batch(args, plan["workers"])  # checked again with the replicas the strategy finds

    args.keras = select_keras(args.keras)  # before TensorFlow is imported: its import reads the choice

    import tensorflow as tf

    threads = configure_threads(tf, args.intra_threads, plan["local_workers"])
    strategy, cluster = make_strategy(tf, args, plan)  # MWMS: the strategy before any other TF operation.
    chief, rank = cluster["is_chief"], cluster["rank"]
    replicas = strategy.num_replicas_in_sync
    batch = per_replica_batch(args, replicas)
    global_batch = batch * replicas  # MWMS: one step consumes a global batch, split among the replicas.
    (x_train, y_train), (x_test, y_test) = load_data(args)
    steps = steps_per_epoch(args, len(x_train), global_batch)
    lr = scaled_lr(args.lr, replicas, args.lr_scaling)  # MWMS: scale the learning rate with the replicas.

    stop.agree = sum_over_workers(tf, strategy)  # MWMS: after every step, was any worker signalled?
    stop.end = (args.epochs - 1, steps)
    checkpoints = Checkpoints.for_training(args, chief, cluster["workers"], global_batch, steps)
    start_epoch, start_step, resume_from = checkpoints.latest() if args.resume else (0, 0, None)
    backup = Backup.for_training(args, chief, cluster["workers"], global_batch, steps) if args.backup_dir else None
    restored = None
    if backup:
        start_epoch, start_step, restored = backup.resume_point(tf)
    if start_epoch >= args.epochs:
        fail(f"the {'backup' if restored else 'checkpoint'} in {args.backup_dir if restored else args.checkpoint_dir} "
             f"has already done {start_epoch} epoch(s): raise --epochs above {start_epoch} to train further")

    tf.keras.utils.set_random_seed(args.seed)  # MWMS: global seed, so that all workers shuffle the same way.
    with strategy.scope():  # MWMS: model, optimizer and checkpoint variables mirrored on every replica.
        model = build_model(tf, args.model)
        optimizer = make_optimizer(tf, args, lr)
        optimizer.build(model.trainable_variables)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        if resume_from:  # MWMS: every worker reads the chief's checkpoint from the shared directory.
            checkpoint.read(resume_from).assert_existing_objects_matched()
            log(chief, f"resumed from {resume_from} after epoch {start_epoch}"
                       + (f" and {start_step} step(s) of epoch {start_epoch + 1}" if start_step else ""))
        loop_backup = LoopBackup(tf, backup, rank, model=model, optimizer=optimizer) if backup else None
        if restored:  # MWMS: every worker reads the chief's backup
            backup.check_restorable(tf, loop_backup.checkpoint, restored)
            log(chief, f"resuming from the backup {restored} at step {start_step} of epoch {start_epoch + 1}")
    if backup:
        backup.write_record()
    initial_weights = flat_weights(model)
    per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    shard_options = auto_shard_options(tf, args.auto_shard)
    # MWMS: shuffle().batch(global_batch, drop_remainder=True), then split among the replicas.
    train = train_dataset(tf, x_train, y_train, batch=global_batch, steps=steps, seed=args.seed,
                          start_epoch=start_epoch, epochs=args.epochs, shuffle_buffer=args.shuffle_buffer,
                          cache_file=f"{args.cache_dir}/train-worker{rank}" if args.cache_dir else None,
                          start_step=start_step)
    train = strategy.experimental_distribute_dataset(train.with_options(shard_options))  # MWMS
    test = strategy.experimental_distribute_dataset(
        test_dataset(tf, x_test, y_test, global_batch).with_options(shard_options))  # MWMS

    @tf.function
    def train_step(iterator):
        def step_fn(images, labels):
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                # MWMS: sum over this replica's examples / the GLOBAL batch; the gradients are summed over replicas.
                loss = tf.nn.compute_average_loss(per_example_loss(labels, logits), global_batch_size=global_batch)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))  # MWMS: all-reduce inside.
            correct = tf.reduce_sum(tf.cast(tf.argmax(logits, 1, output_type=tf.int32) == labels, tf.float32))
            return loss, correct

        loss, correct = strategy.run(step_fn, args=next(iterator))  # MWMS: one step on every replica.
        return (strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None),  # MWMS: the global batch's mean loss
                strategy.reduce(tf.distribute.ReduceOp.SUM, correct, axis=None))

    @tf.function
    def eval_step(images, labels):
        def step_fn(images, labels):
            logits = model(images, training=False)
            return (tf.reduce_sum(per_example_loss(labels, logits)),
                    tf.reduce_sum(tf.cast(tf.argmax(logits, 1, output_type=tf.int32) == labels, tf.float32)),
                    tf.cast(tf.size(labels), tf.float32))

        sums = strategy.run(step_fn, args=(images, labels))
        return [strategy.reduce(tf.distribute.ReduceOp.SUM, s, axis=None) for s in sums]  # MWMS: over workers.

    log_to_tensorboard = bool(chief and args.log_dir)  # MWMS: the chief alone writes TensorBoard logs.
    writer = tf.summary.create_file_writer(f"{args.log_dir}/train") if log_to_tensorboard else None
    profiler = ProfileWindow(tf, args.log_dir, args.profile_steps if log_to_tensorboard else None)
    losses, accuracies = [], []
    started = time.time()
    iterator = iter(train)
    run_step = 0  # --profile-steps counts from 1 in this run
    for epoch in range(start_epoch, args.epochs):
        loss_sum, correct_sum = 0.0, 0.0
        first_step = start_step if epoch == start_epoch else 0
        for step in range(first_step, steps):
            run_step += 1
            profiler.begin(run_step)
            loss, correct = train_step(iterator)
            loss_sum += float(loss)
            correct_sum += float(correct)
            profiler.end(run_step)
            log_step(chief, args.log_steps, epoch, args.epochs, step + 1, steps)
            stopping = stop.requested(epoch, step + 1)  # MWMS: every worker, the same answer
            if loop_backup:  # MWMS: every worker saves, the chief into the backup
                loop_backup.step_done(epoch, step + 1, stopping)
            if stopping:
                checkpoints.save(checkpoint, epoch, step + 1, participate=True)  # MWMS: the chief writes.
                profiler.close()
                stop.exit({"rank": rank, "size": cluster["workers"], "script": "mwms_custom_loop",
                           "initial_epoch": start_epoch, "initial_step": start_step, "epochs": args.epochs,
                           "steps_per_epoch": steps, "checkpoints_written": checkpoints.written, "losses": losses,
                           "backup": backup.report(restored, loop_backup.written, loop_backup.first_step)
                           if backup else None,
                           "weights_sum": float(flat_weights(model).sum()),
                           "checkpoint_dir_listing": listing(args.checkpoint_dir) if chief else None, "failures": []})
        losses.append(loss_sum / (steps - first_step))
        accuracies.append(correct_sum / ((steps - first_step) * global_batch))
        log(chief, f"epoch {epoch + 1}/{args.epochs}: loss {losses[-1]:.4f}, accuracy {accuracies[-1]:.4f}")
        checkpoints.save(checkpoint, epoch + 1, participate=True)  # MWMS: the chief writes, all take part.
        if writer:  # the tags and steps of Keras' TensorBoard callback: epoch_<metric> at step = epoch (from 0)
            with writer.as_default():
                tf.summary.scalar("epoch_loss", losses[-1], step=epoch)
                tf.summary.scalar("epoch_accuracy", accuracies[-1], step=epoch)
            writer.flush()
    profiler.close()
    if writer:
        writer.close()
    if loop_backup:
        loop_backup.finish()
    seconds = time.time() - started

    totals = [0.0, 0.0, 0.0]
    for images, labels in test:  # MWMS: distributed evaluation, every worker on its part of each batch.
        totals = [t + float(v) for t, v in zip(totals, eval_step(images, labels))]
    test_loss, test_accuracy = totals[0] / totals[2], totals[1] / totals[2]

    exported = export_saved_model(model, args.export_dir, chief) if args.export_dir else None  # MWMS: all
    if chief and args.weights_out:
        save_weights_npz(args.weights_out, model)
    flat = flat_weights(model)
    log(chief, f"test loss {test_loss:.4f}, test accuracy {test_accuracy:.4f}, {seconds:.1f} s")
    report({
        "rank": rank, "size": cluster["workers"], "script": "mwms_custom_loop",
        "keras": keras_version(model), "cluster_source": plan["source"],
        "addresses": cluster["addresses"], "is_chief": chief, "removed_proxy_variables": removed_proxies,
        "replicas_in_sync": replicas, "dataset": args.dataset, "model": args.model, "batch_per_replica": batch,
        "global_batch": global_batch, "steps_per_epoch": steps, "lr": lr, "initial_epoch": start_epoch,
        "initial_step": start_step, "epochs": args.epochs, "exported": exported, "losses": losses,
        "accuracies": accuracies, "test_loss": test_loss,
        "test_accuracy": test_accuracy, "test_examples": totals[2], "train_seconds": seconds,
        "intra_threads": threads, "weights_sum": float(flat.sum()),
        "max_weight_change": float(abs(flat - initial_weights).max()), "checkpoints_written": checkpoints.written,
        "backup": backup.report(restored, loop_backup.written, loop_backup.first_step) if backup else None,
        "checkpoint_dir_listing": listing(args.checkpoint_dir) if chief else None, "failures": []})
    return 0


if __name__ == "__main__":
    sys.exit(main())
