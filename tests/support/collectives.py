"""The one check of what `tfhpc-smoke-collectives` (scripts/smoke/hvd_collectives.py) reports, wherever it ran (docker,
apptainer, podman, charliecloud, a site MPI, a pushed image): the values are derived here, independently of the script
(support.stack.expected_collectives), so a script that checks itself wrongly still fails here."""
from support.results import results
from support.stack import expected_collectives

# The lengths and dtypes most callers run (`--sizes 1,4096 --dtypes float32,int32`); a caller that runs others says so.
SIZES = (1, 4096)
DTYPES = ("float32", "int32")


def smoke_arguments(sizes=SIZES, dtypes=DTYPES):
    """The smoke test's options for these lengths and dtypes, as one string."""
    return f"--sizes {','.join(map(str, sizes))} --dtypes {','.join(dtypes)}"


def check_collectives(output, size=2, sizes=SIZES, dtypes=DTYPES, controller=None):
    """Every rank of a `size`-rank run reported once in `output` (the launcher's), and each report holds what
    check_collective_reports asks. Returns the reports, by rank."""
    return check_collective_reports(results(output, size), size, sizes, dtypes, controller)


def check_collective_reports(reports, size=2, sizes=SIZES, dtypes=DTYPES, controller=None):
    """Each report (one per rank, parsed already, e.g. by the image tests' run_ranks) has no failures, exact allreduce
    sums and averages for exactly the `sizes` and `dtypes` the run was given, the broadcast from the last rank and the
    uneven allgather in rank order; `controller` ("mpi" or "gloo"), when given, is the one Horovod used."""
    expected = expected_collectives(size, sizes, dtypes)
    rows = [r for r in range(size) for _ in range(r + 1)]
    for report in reports:
        assert report["size"] == size and report["failures"] == [], report
        if controller is not None:
            assert report["controller"] == controller, report
        assert report["allreduce"] == expected, report
        assert report["broadcast"] == {"root": size - 1, "values": [float(size)] * 5}, report
        assert report["allgather"] == {"shape": [len(rows), 3], "first_column": rows}, report
    return reports
