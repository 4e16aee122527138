"""tfhpc_runtime: what the shipped scripts share, one module per job.

    errors       one-line errors (fail, UsageError) printed by rank 0; imports nothing of the package
    cli          argument parsing with one-line errors, RESULT lines (report), progress lines (log)
    trainflags   the flags every training entrypoint shares and their checks before TensorFlow starts
    data         data sets that need no download, batch and step arithmetic, the tf.data pipelines
    model        the models, optimizers, learning-rate scaling, Horovod evaluation
    callbacks    Keras callbacks (learning-rate log and decay, per-epoch checkpoints, TensorBoard and the profiler),
                 the custom loops' profiler window
    checkpoints  per-epoch checkpoints with --resume, SavedModel export
    files        atomic single-writer output (RESULT files, weights, reports)
    cluster      MultiWorkerMirroredStrategy set-up: TF_CONFIG, Slurm, proxies, the strategy; network helpers
    gpu          which device and which GPU a rank uses; GPU, driver and NCCL facts
    metrics      thread configuration, bandwidth (busbw) and throughput statistics
    plot         the SGD lab's figure (matplotlib, imported when drawing)
    versions     installed component versions (info, doctor)
    hostenv      the environment against the host's: host install variables removed, TFHPC_HOST_MPI (entrypoint)
    mpilib       the MPI, PMIx and transport libraries a rank loaded (doctor)
    fabric       the libfabric providers a rank can use (doctor)

No module imports TensorFlow or Horovod: the scripts import them after their arguments are checked, and pass `tf`
in. This file imports nothing, so that `import tfhpc_runtime.cli` stays fast.
"""
