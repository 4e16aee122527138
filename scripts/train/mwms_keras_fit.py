#!/usr/bin/env python3
"""Data-parallel training with tf.distribute.MultiWorkerMirroredStrategy and tf.keras Model.fit, as the IDRIS Jean
Zay guide and the Lablup course teach it.

The steps, each marked "# MWMS:" below: remove HTTP proxies from the environment (gRPC would use them); find the
workers (TF_CONFIG, or the Slurm step through SlurmClusterResolver with a port base derived from the job id);
create the strategy before any other TensorFlow operation, with the RING or NCCL all-reduce; global batch =
per-replica batch x replicas in sync; learning rate scaled with the replicas; auto-shard policy on the dataset;
model built and compiled in strategy.scope(); a checkpoint after every epoch (the chief writes it, the others take
part in a throw-away copy); --resume from the latest one; distributed evaluation; SavedModel export.

    TF_CONFIG='{"cluster": {"worker": ["node1:12345", "node2:12345"]}, "task": {"type": "worker", "index": 0}}' \\
        python mwms_keras_fit.py                           # on each node, with its own index
    srun --ntasks=4 python mwms_keras_fit.py              # Slurm: one task per worker (GPU), nothing else to set
    python launch_local_mwms.py -n 2 python mwms_keras_fit.py   # two workers on this machine
    python launch_local_mwms.py -n 2 python mwms_keras_fit.py --log-dir logs --profile-steps 5,8  # TensorBoard

Workers resuming must all see --checkpoint-dir (a shared file system). Every worker prints one "RESULT {json}" line.
SIGUSR1 or SIGTERM saves and stops: the workers agree after every batch, the chief writes a checkpoint of that step,
every worker exits with status 99; --resume auto continues there. --backup-dir DIR adds TensorFlow's own
BackupAndRestore every --backup-every-steps steps (and at a signal's stop; with Keras 3, whose callback restores whole
epochs only, the custom loop's backup in the same layout): a worker killed without warning costs at most that many
steps, and the same command run again continues from the backup.
"""
import sys
import time

from tfhpc_runtime.backup import Backup, LoopBackup
from tfhpc_runtime.callbacks import keras_callbacks, tensorboard_callback
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
from tfhpc_runtime.trainflags import add_backup_args, add_training_args, check_training_args, parse_epochs


def main():
    parser = Parser(__doc__.split("\n\n")[0])
    add_training_args(parser, lr=0.05)
    add_mwms_args(parser)
    add_backup_args(parser)
    parser.add_argument("--lr-decay-epochs", default="",
                        help="comma-separated epochs at which the learning rate is divided by 10 (the Lablup "
                             "course's schedule)")
    args = parser.parse_args()
    check_training_args(args)
    stop = StopOnSignal()  # from now on SIGUSR1/SIGTERM only set a flag
    decay_epochs = parse_epochs(args.lr_decay_epochs)
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
    global_batch = batch * replicas  # MWMS: the dataset is batched with the global batch, split among replicas.
    (x_train, y_train), (x_test, y_test) = load_data(args)
    steps = steps_per_epoch(args, len(x_train), global_batch)
    lr = scaled_lr(args.lr, replicas, args.lr_scaling)  # MWMS: scale the learning rate with the replicas.

    stop.agree = sum_over_workers(tf, strategy)  # MWMS: after every batch, was any worker signalled?
    stop.end = (args.epochs - 1, steps)
    checkpoints = Checkpoints.for_training(args, chief, cluster["workers"], global_batch, steps)
    start_epoch, start_step, resume_from = checkpoints.latest() if args.resume else (0, 0, None)
    # MWMS: TensorFlow's backup; Keras restores it in Model.fit, this run reads where and checks that it fits first.
    backup = Backup.for_training(args, chief, cluster["workers"], global_batch, steps) if args.backup_dir else None
    keras_backup = backup and args.keras == "2"  # Keras 2's BackupAndRestore restores the step itself; Keras 3's not
    restored = None
    if backup:
        start_epoch, start_step, restored = backup.resume_point(tf)
    if start_epoch >= args.epochs:
        fail(f"the {'backup' if restored else 'checkpoint'} in {args.backup_dir if restored else args.checkpoint_dir} "
             f"has already done {start_epoch} epoch(s): raise --epochs above {start_epoch} to train further")

    tf.keras.utils.set_random_seed(args.seed)  # MWMS: the same global seed on every worker (shuffling, weights).
    with strategy.scope():  # MWMS: variables created here are mirrored on every replica of every worker.
        model = build_model(tf, args.model)
        optimizer = make_optimizer(tf, args, lr)
        model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        optimizer.build(model.trainable_variables)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        # MWMS, Keras 3: the custom loop's backup (model, optimizer, position), read here and resumed at its step.
        loop_backup = (LoopBackup(tf, backup, rank, model=model, optimizer=optimizer)
                       if backup and not keras_backup else None)
        if resume_from:  # MWMS: every worker reads the chief's checkpoint from the shared directory.
            checkpoint.read(resume_from).assert_existing_objects_matched()
            log(chief, f"resumed from {resume_from} after epoch {start_epoch}"
                       + (f" and {start_step} step(s) of epoch {start_epoch + 1}" if start_step else ""))
        if restored:
            backup.check_restorable(tf, loop_backup.checkpoint if loop_backup else tf.train.Checkpoint(model=model),
                                    restored)
            log(chief, f"resuming from the backup {restored} at step {start_step} of epoch {start_epoch + 1}")
    if backup:
        backup.write_record()
    initial_weights = flat_weights(model)

    shard_options = auto_shard_options(tf, args.auto_shard)  # MWMS: how workers split the data.
    test = test_dataset(tf, x_test, y_test, global_batch).with_options(shard_options)
    extra = keras_callbacks(tf)
    backup_callback = extra.BackupEverySteps(backup, stop) if keras_backup else None
    backups = backup_callback or loop_backup  # the backups written and the first step trained, for the RESULT line

    def fit_callbacks(first_step):
        callbacks = [extra.EpochLog(chief),
                     extra.SaveOnSignal(stop, checkpoints, checkpoint, participate=True, first_step=first_step),
                     extra.SaveEachEpoch(checkpoints, checkpoint, participate=True, stop=stop)]  # MWMS: all save.
        if backup_callback:  # after SaveOnSignal, which sets stop.at
            callbacks.insert(2, backup_callback)
        elif loop_backup:  # MWMS: every worker saves, the chief into the backup
            callbacks.insert(2, extra.BackupSteps(loop_backup, stop, first_step))
        if decay_epochs:
            callbacks.insert(0, extra.StepDecay(lr, decay_epochs))
        if chief and args.log_steps:
            callbacks.append(extra.StepLog(args.log_steps, args.epochs, steps, first_step))
        if chief and args.log_dir:  # MWMS: the chief alone writes logs (scalars, the --profile-steps trace).
            callbacks.append(tensorboard_callback(tf, args.log_dir, args.profile_steps))
        return callbacks

    # One Model.fit per stretch of whole epochs; a run resumed mid-epoch first finishes that epoch in a fit of its own.
    # With Keras 2's backup, one Model.fit: Keras itself starts at the backup's step and numbers the batches of whole
    # epochs.
    stretches = [(start_epoch, start_epoch + 1, start_step)] if start_step and not keras_backup else []
    if start_epoch + bool(stretches) < args.epochs:
        stretches.append((start_epoch + bool(stretches), args.epochs, start_step if keras_backup else 0))
    keras_skips = start_step if keras_backup else 0  # steps of the first epoch that Keras itself skips
    started = time.time()
    histories = []
    for first_epoch, end_epoch, first_step in stretches:
        train = train_dataset(tf, x_train, y_train, batch=global_batch, steps=steps, seed=args.seed,
                              start_epoch=first_epoch, epochs=end_epoch, shuffle_buffer=args.shuffle_buffer,
                              cache_file=f"{args.cache_dir}/train-worker{rank}" if args.cache_dir else None,
                              start_step=first_step)
        histories.append(model.fit(train.with_options(shard_options), epochs=end_epoch, initial_epoch=first_epoch,
                                   steps_per_epoch=steps - first_step + keras_skips,
                                   callbacks=fit_callbacks(first_step - keras_skips),
                                   verbose=args.verbose if chief else 0).history)  # MWMS: the chief prints.
        if stop.at:
            stop.exit({"rank": rank, "size": cluster["workers"], "script": "mwms_keras_fit",
                       "initial_epoch": start_epoch, "initial_step": start_step, "epochs": args.epochs,
                       "steps_per_epoch": steps, "checkpoints_written": checkpoints.written,
                       "backup": backup.report(restored, backups.written, backups.first_step) if backup else None,
                       "weights_sum": float(flat_weights(model).sum()),
                       "checkpoint_dir_listing": listing(args.checkpoint_dir) if chief else None, "failures": []})
    if loop_backup:  # training has ended: the backup goes, as BackupAndRestore's does
        loop_backup.finish()
    history = {key: [value for h in histories for value in h.get(key, [])]
               for key in ("loss", "accuracy", "lr_at_end")}
    seconds = time.time() - started
    test_loss, test_accuracy = model.evaluate(test, verbose=0)  # MWMS: distributed, metrics summed over workers.

    exported = export_saved_model(model, args.export_dir, chief) if args.export_dir else None
    if chief and args.weights_out:
        save_weights_npz(args.weights_out, model)
    flat = flat_weights(model)
    log(chief, f"test loss {test_loss:.4f}, test accuracy {test_accuracy:.4f}, {seconds:.1f} s")
    report({
        "rank": rank, "size": cluster["workers"], "script": "mwms_keras_fit",
        "keras": keras_version(model), "cluster_source": plan["source"],
        "addresses": cluster["addresses"], "port_base": plan.get("port_base"), "is_chief": chief,
        "removed_proxy_variables": removed_proxies, "collective": args.collective,
        "replicas_in_sync": replicas, "dataset": args.dataset, "model": args.model, "batch_per_replica": batch,
        "global_batch": global_batch, "steps_per_epoch": steps, "lr": lr, "initial_epoch": start_epoch,
        "initial_step": start_step, "epochs": args.epochs, "losses": [float(v) for v in history["loss"]],
        "accuracies": [float(v) for v in history["accuracy"]],
        "learning_rates": [float(v) for v in history["lr_at_end"]],
        "test_loss": float(test_loss), "test_accuracy": float(test_accuracy), "train_seconds": seconds,
        "intra_threads": threads, "weights_sum": float(flat.sum()),
        "max_weight_change": float(abs(flat - initial_weights).max()), "exported": exported,
        "checkpoints_written": checkpoints.written,
        "backup": backup.report(restored, backups.written, backups.first_step) if backup else None,
        "checkpoint_dir_listing": listing(args.checkpoint_dir) if chief else None, "failures": []})
    return 0


if __name__ == "__main__":
    sys.exit(main())
