"""What every multi-rank test runs with because the tests oversubscribe the machine, and only because of that.

`make test` runs two pytest workers on the machine's 2 cores, each often with a 2-rank job: four ranks or more on
two cores, which no site allocates. An Open MPI rank that waits for a message spins on its core by default; beside
the other test's ranks, the rank it waits for then waits for that core. `mpi_yield_when_idle` makes a waiting rank
yield the core instead: what Open MPI sets by itself when mpirun knows that a node is oversubscribed ("will default
to 1 when oversubscribing nodes", its parameter's help), which mpirun cannot know of two separate jobs. It changes no
result, only who waits: two 2-rank Horovod trainings side by side took 44-50 s each without it and 29-34 s with it;
one alone 20 s either way (docs/measurements.md, test runs). MPICH's ch4 device has no such setting.

Set in every test container's environment (tests/support/containers.py), on the test cluster's nodes (their jobs
and steps inherit it: tests/cluster/harness.py) and in pytest's own environment (what `apptainer exec` and ch-run
pass into a container: tests/conftest.py)."""

ENVIRONMENT = {"OMPI_MCA_mpi_yield_when_idle": "1"}
