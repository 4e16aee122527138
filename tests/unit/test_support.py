"""The shared test helpers (tests/support/) on made-up launcher output: the image tests use them only where images
exist, so a parser that stopped accepting a launcher's prefix, or a check that stopped checking, shows here first."""
import json
import os

import pytest

from support.collectives import check_collectives, smoke_arguments
from support.containers import start_container
from support.count import checks_in
from support.failures import excerpt
from support.results import results
from support.stack import LEAF, expected_collectives
from support.wheels import build_info, matching_wheels, python_tag


def smoke_report(rank, size, sizes=(1, 4096), dtypes=("float32", "int32"), controller="mpi"):
    """What scripts/smoke/hvd_collectives.py prints for a rank of a correct run."""
    rows = [r for r in range(size) for _ in range(r + 1)]
    return {"rank": rank, "size": size, "controller": controller, "failures": [],
            "allreduce": expected_collectives(size, sizes, dtypes),
            "broadcast": {"root": size - 1, "values": [float(size)] * 5},
            "allgather": {"shape": [len(rows), 3], "first_column": rows}}


def output(*reports, prefix=lambda rank: ""):
    return "\n".join(["warming up"] + [f"{prefix(r['rank'])}RESULT {json.dumps(r)}" for r in reports] + ["done"])


@pytest.mark.parametrize("prefix", [lambda rank: "", lambda rank: f"[1,{rank}]<stdout>:", lambda rank: f"{rank}: "],
                         ids=["bare", "mpirun", "srun"])
def test_results_takes_the_json_after_any_launcher_prefix_sorted_by_rank(prefix):
    text = output({"rank": 1, "x": "RESULT [not this]"}, {"rank": 0, "x": 2}, prefix=prefix)
    assert results(text, 2) == [{"rank": 0, "x": 2}, {"rank": 1, "x": "RESULT [not this]"}]


@pytest.mark.parametrize("ranks_seen", [[0], [0, 1, 1], [1, 2]])
def test_results_fails_on_a_missing_duplicated_or_wrong_rank(ranks_seen):
    with pytest.raises(AssertionError, match="expected 2 ranks to report"):
        results(output(*({"rank": r} for r in ranks_seen)), 2)


def test_check_collectives_passes_a_correct_run_and_fails_every_wrong_value():
    good = [smoke_report(r, 2) for r in range(2)]
    assert check_collectives(output(*good), controller="mpi") == good
    spoiled = [("size", 3), ("failures", ["allreduce sum float32 n=1 is not exact"]), ("controller", "gloo"),
               ("allreduce", {**good[0]["allreduce"], "sum/float32/4096": 0.0}),
               ("allreduce", {**good[0]["allreduce"], "sum/float16/1": 6.0}),  # a dtype the run was not given
               ("broadcast", {"root": 0, "values": [2.0] * 5}), ("allgather", {"shape": [2, 3], "first_column": [0, 1]})]
    for key, value in spoiled:
        with pytest.raises(AssertionError):
            check_collectives(output({**good[0], key: value}, good[1]), controller="mpi")


def test_smoke_arguments_name_the_lengths_and_dtypes_checked():
    assert smoke_arguments() == "--sizes 1,4096 --dtypes float32,int32"
    assert smoke_arguments((1,), ("float16",)) == "--sizes 1 --dtypes float16"


def test_the_check_count_sees_asserts_and_pytest_fail_and_raises_only():
    source = ("import pytest\nassert 1\ndef f():\n    assert 2, 'x'\n    pytest.fail('no')\n"
              "    with pytest.raises(ValueError):\n        pass\n    fail()\n    other.raises()\n")
    assert checks_in(source) == 4


def test_a_long_result_line_that_mpirun_split_and_tagged_again_is_joined():
    output = '[1,0]<stdout>:RESULT {"rank": 0, "losses": [0.5,[1,0]<stdout>: 0.25]}\n[1,1]<stdout>:RESULT {"rank": 1}\n'
    assert results(output, 2) == [{"rank": 0, "losses": [0.5, 0.25]}, {"rank": 1}]


@pytest.mark.parametrize("label", ["", "0: "])
def test_a_long_result_line_that_slurm_forwarded_in_pieces_is_joined(label):
    # as measured in a Slurm job's output: task 0's line cut after 1 KiB (mid-number), task 1's line after the piece
    report = {"rank": 0, "pad": "x" * 980, "test_accuracy": 0.949999988079071, "losses": [0.5, 0.25]}
    line = "RESULT " + json.dumps(report)
    output = (f"{label}{line[:1024]}test loss 0.1541, test accuracy 0.9500, 3.7 s\n{label}{line[1024:]}\n"
              'RESULT {"rank": 1}\n')
    assert results(output, 2) == [report, {"rank": 1}]
    with pytest.raises(AssertionError, match="a RESULT line is not JSON .* no later line completes it"):
        results(f"{line[:1024]}test loss 0.1541\n")


# A made-up index listing (PEP 691) of a project's files: the wheel tests/network reads is picked from one like it.
LISTING = [{"filename": f"tensorflow-9.9.9-{tags}.whl", "hashes": {"sha256": digest}, "url": f"https://x/{digest}"}
           for tags, digest in [("cp399-cp399-manylinux_2_27_aarch64", "a" * 64),
                                ("cp399-cp399-manylinux_2_27_x86_64", "b" * 64),
                                ("cp398-cp398-manylinux_2_27_aarch64", "c" * 64),
                                ("cp399-cp399-manylinux_2_17_aarch64.manylinux2014_aarch64", "d" * 64),
                                ("cp399-cp399-macosx_12_0_arm64", "e" * 64)]]
LISTING.append({"filename": "tensorflow-9.9.9.tar.gz", "hashes": {"sha256": "f" * 64}, "url": "https://x/sdist"})


def test_the_wheel_of_a_lock_is_picked_by_python_machine_and_hash():
    assert python_tag("3.99") == "cp399"
    picked = matching_wheels(LISTING, "tensorflow", "9.9.9", "3.99", "aarch64", ["a" * 64, "b" * 64, "e" * 64])
    assert [entry["hashes"]["sha256"] for entry in picked] == ["a" * 64]
    # a compound platform tag (manylinux_2_17 + manylinux2014) is one of the machine's too
    assert len(matching_wheels(LISTING, "tensorflow", "9.9.9", "3.99", "aarch64", ["a" * 64, "d" * 64])) == 2
    # a file whose sha256 the lock does not hold is never taken, nor another version's or project's
    assert matching_wheels(LISTING, "tensorflow", "9.9.9", "3.99", "aarch64", ["0" * 64]) == []
    assert matching_wheels(LISTING, "tensorflow", "9.9.8", "3.99", "aarch64", ["a" * 64]) == []
    assert matching_wheels(LISTING, "tensorflow-cpu", "9.9.9", "3.99", "aarch64", ["a" * 64]) == []


@pytest.mark.parametrize("source", [
    "import collections\n\nbuild_info = collections.OrderedDict([('is_cuda_build', False),\n"
    "                                          ('is_rocm_build', False)])\n",
    "build_info = {'is_cuda_build': False, 'is_rocm_build': False}\n",
], ids=["OrderedDict", "dict"])
def test_build_info_is_read_without_running_the_module(source):
    assert build_info(source) == {"is_cuda_build": False, "is_rocm_build": False}
    with pytest.raises(ValueError, match="no `build_info = ...` assignment"):
        build_info("import os\nos.system('false')\n")


class _Images:
    def get(self, name):
        return type("Image", (), {"labels": {"io.tfhpc.layer": LEAF}})()


class _Containers:
    def __init__(self):
        self.runs = []

    def run(self, image, command, **options):
        self.runs.append(options)


def test_every_test_container_runs_open_mpi_ranks_that_yield_while_they_wait():
    """support/oversubscription.py: two workers' ranks share 2 cores; the containers tests start carry the setting,
    and pytest's own environment too (what apptainer passes on)."""
    client = type("Client", (), {"images": _Images(), "containers": _Containers()})()
    start_container(client, "tfhpc-app:test")
    [options] = client.containers.runs
    assert options["environment"]["OMPI_MCA_mpi_yield_when_idle"] == "1"
    assert os.environ["OMPI_MCA_mpi_yield_when_idle"] == "1"


def test_a_failed_runs_excerpt_keeps_the_named_workers_lines_before_the_others_long_error():
    """The launcher names worker 1; worker 0's long traceback after it would push worker 1's error out of a tail."""
    stderr = ("[worker 1] Traceback (most recent call last):\n[worker 1] ValueError: the cause\n"
              "tfhpc: error: worker 1 exited with status 1: stopping the other workers\n"
              + "".join(f"[worker 0] waiting for worker 1, line {n}\n" for n in range(400)))
    shown = excerpt("[worker 1] step 1\n", stderr)
    assert "ValueError: the cause" in shown and "[worker 1] step 1" in shown
    assert shown.index("tfhpc: error: worker 1") < shown.index("--- the end of stderr")
    assert "ValueError: the cause" not in excerpt("", stderr.replace("tfhpc: error", "other"))  # no name: tails only
