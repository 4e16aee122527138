"""What every multi-rank test runs with because the tests oversubscribe the machine, and only because of that.

`make test` runs two pytest workers on the machine's 2 cores, each often with a 2-rank job: four ranks or more on
two cores, which no site allocates. Two settings keep a rank from taking a core that another rank needs:

- An Open MPI rank that waits for a message spins on its core by default; beside the other test's ranks, the rank it
  waits for then waits for that core. `mpi_yield_when_idle` makes a waiting rank yield the core instead: what Open
  MPI sets by itself when mpirun knows that a node is oversubscribed ("will default to 1 when oversubscribing nodes",
  its parameter's help), which mpirun cannot know of two separate jobs. Two 2-rank Horovod trainings side by side
  took 44-50 s each without it and 29-34 s with it; one alone 20 s either way. MPICH's ch4 device has a like
  setting (MPIR_CVAR_CH4_PROGRESS_THROTTLE: yield after a number of polls without progress); it saved nothing
  measurable (two 2-rank runs of mpi4py's suite side by side 278 s without it, 275 s with it), so it is not set.
- TensorFlow's inter-op thread pool has one thread per core in every rank by default (the entrypoints already divide
  the intra-op threads among a node's ranks: tfhpc_runtime/metrics.py); one inter-op thread per rank is what a rank
  would have on a site's one core per task. Two 2-rank trainings side by side used 13-17 % less CPU time with it
  (Horovod 37 -> 31 s each, MWMS 25 -> 21.5 s each).

Neither changes a result, only who waits (docs/measurements.md, test runs). Set in every test container's environment
(tests/support/containers.py), on the test cluster's nodes (their jobs and steps inherit it: tests/cluster/harness.py)
and in pytest's own environment (what `apptainer exec` and ch-run pass into a container: tests/conftest.py)."""

ENVIRONMENT = {"OMPI_MCA_mpi_yield_when_idle": "1", "TF_NUM_INTEROP_THREADS": "1"}
