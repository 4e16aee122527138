"""The goals `make bench` judges: each a figure against its target."""
from .context import MB
from .sections.hostmpi import HOST_MPI_SIZE
from .stats import Goal

GOALS = [
    Goal("container_vs_host", "train.ratio.container_host.hvd2", 0.99, "container / host throughput >= 0.99"),
    Goal("horovod_vs_mpi4py_64MB", f"allreduce.ratio.horovod_mpi.{64 * MB}", 0.9,
         "Horovod-over-MPI busbw >= 0.9 x mpi4py at 64 MB"),
    Goal("host_mpich_vs_image_64MB", f"hostmpi.ratio.{HOST_MPI_SIZE}", 0.9,
         "host MPICH (bind model) busbw >= 0.9 x the image's MPICH at 64 MB"),
    Goal("two_worker_efficiency", "train.efficiency.container.hvd", 0.9, "2-worker efficiency >= 0.9"),
    Goal("two_worker_efficiency_pinned", "train.efficiency.container.hvd_pinned", 0.9,
         "2-worker efficiency, every worker bound to one core >= 0.9"),
    Goal("keras3_vs_tf_keras_horovod", "train.ratio.keras3_tfkeras.hvd2", 0.95,
         "Keras 3 throughput >= 0.95 x tf_keras's, Horovod, 2 workers"),
    Goal("keras3_vs_tf_keras_mwms", "train.ratio.keras3_tfkeras.mwms2", 0.95,
         "Keras 3 throughput >= 0.95 x tf_keras's, MultiWorkerMirroredStrategy, 2 workers"),
    Goal("sif_import_faster_8", "startup.ratio.venv_sif.8", 1.0,
         "import from the SIF faster than from the venv at 8 processes (venv / SIF >= 1)"),
    Goal("sif_import_vs_docker_8", "startup.ratio.sif_docker.8", 1.2,
         "import from the SIF at 8 processes <= 1.2 x Docker's", at_most=True),
    Goal("sif_mpi4py_memcpy_64MB", f"allreduce.ratio.mpi4py_sif_memcpy.{64 * MB}", 0.25,
         "mpi4py busbw in the SIF >= 0.25 x one core's memcpy at 64 MB"),
    Goal("sif_horovod_memcpy_64MB", f"allreduce.ratio.horovod_mpi_sif_memcpy.{64 * MB}", 0.25,
         "Horovod-over-MPI busbw in the SIF >= 0.25 x one core's memcpy at 64 MB"),
    Goal("sif_horovod_vs_mpi4py_64MB", f"allreduce.ratio.horovod_mpi_sif.{64 * MB}", 0.9,
         "Horovod-over-MPI busbw >= 0.9 x mpi4py in the SIF at 64 MB"),
    Goal("horovod_latency_1KB", "allreduce.latency.horovod_mpi.1024", 0.2,
         "Horovod time per 1 KB allreduce <= 0.2 ms", at_most=True),
    Goal("rebuild_one_script", "build.rebuild_one_script", 30.0, "rebuild after one script <= 30 s", at_most=True),
    Goal("gpu_image_half_of_ngc", "size.ratio.ngc", 0.5, "GPU app image <= half of the NGC TensorFlow image",
         at_most=True),
]
