"""The arm64 SIF (`make sif ARCH=arm64`) as a user runs it, under emulation: apptainer of this host's architecture
starts the SIF's aarch64 programs through binfmt_misc. Its header names arm64, and its own mpirun and Horovod reduce
and train on 2 ranks with the values checked."""
import json

from support.collectives import check_collectives
from support.results import results
from support.stack import CONFIG


def test_the_sif_is_arm64_in_its_header_and_runs_aarch64_programs(apptainer_container, user_host, in_sif):
    done = apptainer_container.exec_run(["apptainer", "sif", "header", in_sif], user="tfhpc")
    assert done.exit_code == 0, done.output.decode(errors="replace")
    assert "Primary Architecture: arm64" in done.output.decode(), done.output.decode()
    assert user_host.check_output(f"apptainer exec {in_sif} uname -m") == CONFIG.machine
    assert user_host.check_output(f"apptainer exec {in_sif} id -u") == "1000"


def test_two_ranks_with_the_sifs_mpirun(user_host, in_sif):
    out = user_host.check_output(f"apptainer exec {in_sif} mpirun -np 2 tfhpc-smoke-collectives "
                                 "--sizes 1,4096 --dtypes float32,int32")
    check_collectives(out, controller="mpi")


def test_two_rank_training_from_the_sif_converges_with_equal_weights(user_host, in_sif):
    out = user_host.check_output(f"apptainer exec {in_sif} horovodrun -np 2 tfhpc-smoke-train --epochs 4")
    reports = results(out, 2)
    for report in reports:
        assert report["size"] == 2
        assert report["losses"][-1] < 0.5 * report["losses"][0], report["losses"]
        assert report["max_weight_difference_across_ranks"] == 0.0
    assert reports[0]["weights_sum"] == reports[1]["weights_sum"], json.dumps(reports)[-2000:]
