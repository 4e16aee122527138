"""What every multi-rank test runs with because the tests oversubscribe the machine, and only because of that.

`make test` runs two pytest workers on the machine's 2 cores, each often with a 2-rank job: four ranks or more on
two cores, which no site allocates. An Open MPI rank that waits for a message spins on its core by default; beside
the other test's ranks, the rank it waits for then waits for that core. `mpi_yield_when_idle` makes a waiting rank
yield the core instead: what Open MPI sets by itself when mpirun knows that a node is oversubscribed ("will default
to 1 when oversubscribing nodes", its parameter's help), which mpirun cannot know of two separate jobs. It changes no
result, only who waits: two 2-rank Horovod trainings side by side took 44-50 s each without it and 29-34 s with it;
one alone 20 s either way (docs/measurements.md, test runs).

Measured and not set:
- MPICH's ch4 device has a like setting (MPIR_CVAR_CH4_PROGRESS_THROTTLE: a yield after a number of polls without
  progress): two 2-rank runs of mpi4py's suite side by side took 278 s without it and 275 s with it.
- One TensorFlow inter-op thread per process (TF_NUM_INTEROP_THREADS=1): two 2-rank trainings side by side used
  13-17 % less CPU time with it, but the whole `make test` with it took 42 min 26 s at f10e2e4 against 38 min 41 s at a934517
  (the mpi4py suite, which runs no TensorFlow, 823 s against 587 s: the runs differed by more than the setting).

Set in every test container's environment (tests/support/containers.py), on the test cluster's nodes (their jobs
and steps inherit it: tests/cluster/harness.py) and in pytest's own environment (what `apptainer exec` and ch-run
pass into a container: tests/conftest.py)."""

ENVIRONMENT = {"OMPI_MCA_mpi_yield_when_idle": "1"}
