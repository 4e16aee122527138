"""A real Slurm (slurmctld + 2 slurmd, munge) in containers: the shipped job scripts (scripts/slurm/) submitted with
sbatch run the SIF on 2 nodes through `srun ... apptainer exec`; each test reads the job's output, checks the values,
that 2 ranks on 2 different hosts took part, and that Slurm recorded the job as COMPLETED (or FAILED when it must)."""
import base64
import json
import re
import shlex

import pytest

from conftest import NODES
from support import keras_files
from support.results import results
from support.site_mpi import LIBRARY_VERSIONS, in_containers, install_host_mpi, install_site_mpi
from support.stack import CONFIG, LEAF, MANIFEST
from support.tiers import TIER
from tfhpc.sif import sif_path


def sbatch(cluster, sif, script, arguments="", options="", timeout=900, environment=""):
    """Submit a job script (shipped, or an absolute path) as the user, wait for it; returns (job id, job state, exit
    status, output)."""
    path = script if script.startswith("/") else f"/jobs/scripts/{script}"
    rc, out = cluster.run("ctl", f"cd /jobs/out && TFHPC_SIF={sif} {environment} sbatch --parsable --wait {options} "
                                 f"--output=/jobs/out/%j.out {path} {arguments}", timeout=timeout)
    match = re.search(r"^(\d+)", out, re.M)
    assert match, f"sbatch gave no job id:\n{out}"
    job = match.group(1)
    _, state = cluster.run("ctl", f"scontrol show job {job} | grep -o 'JobState=[A-Z_]*'")
    _, output = cluster.run("ctl", f"cat /jobs/out/{job}.out")
    return job, state.strip().partition("=")[2], rc, output


def test_generic_pmix_job_runs_the_allreduce_smoke_test_on_two_nodes(slurm_cluster, sif):
    job, state, rc, output = sbatch(slurm_cluster, sif, "command-srun-pmix.sbatch",
                                    "tfhpc-smoke-collectives --sizes 1,1023,65536")
    reports = results(output)
    assert (rc, state) == (0, "COMPLETED"), output
    assert [(r["rank"], r["size"], r["controller"]) for r in reports] == [(0, 2, "mpi"), (1, 2, "mpi")], output
    assert {r["host"] for r in reports} == set(NODES)
    assert not any(r["failures"] for r in reports) and reports[0]["allreduce"] == reports[1]["allreduce"]


def test_daint_horovod_job_trains_with_identical_weights(hvd_fit_job):
    """horovod-srun-pmix.sbatch with the Horovod fit: one rank on each node, equal weights, the loss falls (the run
    is also the signalled job's uninterrupted reference)."""
    reports, output = hvd_fit_job
    assert {r["host"] for r in reports} == set(NODES) and [r["size"] for r in reports] == [2, 2]
    assert all(r["max_weight_difference_across_ranks"] == 0.0 and r["failures"] == [] for r in reports)
    assert reports[0]["losses"][-1] < 0.5 * reports[0]["losses"][0]
    assert f"tfhpc: 2 node(s), 2 rank(s): {TRAINING} --weights-out uninterrupted.npz" in output


def test_gloo_job_without_mpi_allreduces_on_two_nodes(slurm_cluster, sif):
    job, state, rc, output = sbatch(slurm_cluster, sif, "horovod-srun-gloo.sbatch",
                                    "tfhpc-smoke-collectives --sizes 1,1023,65536")
    reports = results(output)
    assert (rc, state) == (0, "COMPLETED"), output
    assert [(r["rank"], r["size"], r["controller"]) for r in reports] == [(0, 2, "gloo"), (1, 2, "gloo")], output
    assert {r["host"] for r in reports} == set(NODES)
    assert not any(r["failures"] for r in reports)


# A user's own Keras 3 scripts (the shipped examples, unchanged) in one allocation of 2 nodes: Horovod's
# DistributedOptimizer and callbacks under srun --mpi=pmix, then MultiWorkerMirroredStrategy fit with TF_CONFIG from
# the step (tfhpc-slurm-tf-config).
KERAS3_JOB = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=10
set -euo pipefail
mkdir -p keras3-$SLURM_JOB_ID/hvd keras3-$SLURM_JOB_ID/mwms
srun --mpi=pmix apptainer exec "$TFHPC_SIF" python /opt/tfhpc/examples/keras3_hvd_fit.py keras3-$SLURM_JOB_ID/hvd
srun apptainer exec "$TFHPC_SIF" tfhpc-slurm-tf-config python /opt/tfhpc/examples/keras3_mwms_fit.py \\
    keras3-$SLURM_JOB_ID/mwms
"""
# Each step's code is proven in the test tier by another run on the same path: the examples themselves on 2 ranks
# (tests/images/app/test_keras3.py), Horovod's Keras 3 fit under srun --mpi=pmix on 2 nodes (the Daint job: the stack's
# default Keras), Keras 3 under MWMS with TF_CONFIG from the step on 2 nodes (the Keras files job's Keras 3 column).
EXAMPLES_ON_SLURM = pytest.mark.full("the examples on 2 ranks: tests/images/app/test_keras3.py; Keras 3 under srun "
                                     "--mpi=pmix: the Daint job; Keras 3 MWMS from the step: the files job's column")


@EXAMPLES_ON_SLURM
@pytest.mark.skipif(not CONFIG.keras_patches, reason="the stack has no Keras 3 (TensorFlow < 2.16)")
def test_keras3_examples_train_on_two_nodes_in_one_job(slurm_cluster, sif):
    """The examples' Horovod and MWMS fits, one step each in one job."""
    rc, out = slurm_cluster.run("ctl", f"printf %s {shlex.quote(KERAS3_JOB)} > /jobs/out/keras3.sbatch")
    assert rc == 0, out
    job, state, rc, output = sbatch(slurm_cluster, sif, "/jobs/out/keras3.sbatch")
    assert (rc, state) == (0, "COMPLETED"), output[-3000:]
    _, nodes = slurm_cluster.run("ctl", f"scontrol show job {job} | grep -o ' NodeList=[^ ]*'")
    assert nodes.strip() == "NodeList=node[1-2]", nodes
    reports = results(output)
    horovod = [r for r in reports if "size" in r]
    mwms = [r for r in reports if "workers" in r]
    assert [(r["rank"], r["size"]) for r in horovod] == [(0, 2), (1, 2)], output[-3000:]
    assert [(r["rank"], r["workers"]) for r in mwms] == [(0, 2), (1, 2)], output[-3000:]
    for report in horovod + mwms:
        assert report["losses"][-1] < 0.75 * report["losses"][0], report["losses"]
    assert horovod[0]["weights_digest"] == horovod[1]["weights_digest"]
    assert horovod[0]["reloaded_equal"] is True
    assert mwms[0]["weights_digest"] == mwms[1]["weights_digest"]
    assert mwms[0]["reloaded_digest"] == mwms[0]["weights_digest"] and mwms[0]["keras"].startswith("3.")


# The Keras files matrix from the SIF on 2 nodes sharing the job directory, one step per column in one job: Keras 3
# under MWMS (TF_CONFIG from the step: Keras patch 0003's case), and in the full tier the other columns, tf_keras under
# MWMS and both Kerases under Horovod (srun --mpi=pmix). Each task writes its own output file: Slurm forwards a task's
# output in pieces of at most 1 KiB, between which the other task's may fall, and these RESULT lines are longer. A
# failed step does not stop the others.
FILES_COLUMNS = [("3", "mwms"), ("2", "mwms"), ("3", "hvd"), ("2", "hvd")]
# The columns the job runs: the test tier's one, or all of them.
JOB_COLUMNS = FILES_COLUMNS if TIER == "full" else FILES_COLUMNS[:1]
FILES_JOB = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=20
set -uo pipefail
status=0
for column in {columns}; do
    keras=${{column%-*}} strategy=${{column#*-}} out=files-$SLURM_JOB_ID/keras$column
    mkdir -p $out
    if [ $strategy = hvd ]; then mpi=--mpi=pmix; wrap=; else mpi=; wrap=tfhpc-slurm-tf-config; fi
    srun $mpi --output=$out-%t.out --error=$out-%t.err apptainer exec "$TFHPC_SIF" $wrap \\
        python multi_worker_files.py --strategy $strategy --keras $keras $out
    step=$?
    echo "STEP keras$column $step"
    [ $step = 0 ] || status=$step
done
exit $status
"""
FULL_COLUMNS = pytest.mark.full("the Keras 3 MWMS column from the SIF in this job; these columns in Docker: "
                                "tests/images/app/test_keras_files.py")


@pytest.fixture(scope="module")
def files_columns_job(slurm_cluster, sif):
    """{(keras, strategy): (step exit status, both tasks' RESULT lines, output)} of FILES_JOB."""
    columns = " ".join(f"{keras}-{strategy}" for keras, strategy in JOB_COLUMNS)
    rc, out = slurm_cluster.run("ctl", f"printf %s {shlex.quote(FILES_JOB.format(columns=columns))} "
                                       f"> /jobs/out/files-columns.sbatch")
    assert rc == 0, out
    encoded = base64.b64encode(keras_files.USER_SCRIPT.read_bytes()).decode()
    rc, out = slurm_cluster.run("ctl", f"echo {encoded} | base64 -d > /jobs/out/{keras_files.USER_SCRIPT.name}")
    assert rc == 0, out
    job, state, rc, output = sbatch(slurm_cluster, sif, "/jobs/out/files-columns.sbatch", timeout=1800)
    steps = dict(re.findall(r"^STEP keras(\S+) (\d+)$", output, re.M))
    runs = {}
    for keras, strategy in JOB_COLUMNS:
        _, tasks = slurm_cluster.run("ctl", f"cd /jobs/out/files-{job} && cat keras{keras}-{strategy}-*.err "
                                            f"keras{keras}-{strategy}-*.out")
        runs[keras, strategy] = (steps.get(f"{keras}-{strategy}"), results(tasks), tasks)
    return runs


@pytest.mark.skipif(not CONFIG.keras_patches, reason="the stack has no Keras 3 (TensorFlow < 2.16)")
@pytest.mark.parametrize("keras, strategy", [pytest.param(*column, id=f"keras{column[0]}-{column[1]}",
                                                          marks=[FULL_COLUMNS] if column != FILES_COLUMNS[0] else [])
                                             for column in FILES_COLUMNS])
def test_keras_files_columns_from_the_sif_on_two_nodes(files_columns_job, keras, strategy):
    """The same user script and checks as the Docker matrix (tests/support/keras_files.py), each worker on its own
    node of the test cluster, both given the same paths in the shared job directory; Keras 3 under MWMS also the
    one-line stop of a backup directory per worker."""
    step, reports, output = files_columns_job[keras, strategy]
    assert step == "0", output[-3000:]
    assert [r["rank"] for r in reports] == [0, 1], output[-3000:]
    keras_files.every_feature(reports, keras, strategy)


def test_hybrid_mpirun_on_the_nodes_starts_the_sif_on_each(slurm_cluster, sif):
    # The nodes' own Open MPI (same 4.1 series as the image's) launches over ssh, apptainer exec on each node.
    rc, out = slurm_cluster.run("node1", f"mpirun -np 2 -H node1,node2 apptainer exec {sif} "
                                         "tfhpc-smoke-collectives --sizes 1,1023", timeout=300)
    reports = results(out)
    assert rc == 0, out
    assert {r["host"] for r in reports} == set(NODES) and [r["size"] for r in reports] == [2, 2]
    assert not any(r["failures"] for r in reports)


def test_jeanzay_mwms_job_trains_from_the_slurm_step(mwms_fit_job):
    """mwms-slurm-resolver.sbatch: TF_CONFIG from the Slurm step (SlurmClusterResolver), the port block from the job
    id, equal weights (the run is also the killed worker's uninterrupted reference)."""
    reports = mwms_fit_job
    assert [r["replicas_in_sync"] for r in reports] == [2, 2] and reports[0]["cluster_source"] == "slurm"
    assert {a.rpartition(":")[0] for a in reports[0]["addresses"]} == set(NODES)
    port = int(reports[0]["addresses"][0].rpartition(":")[2])
    assert 10000 <= port < 20000 and (port - 10000) % 32 == 0  # the job id's port block
    assert reports[0]["weights_sum"] == reports[1]["weights_sum"]


def doctor_reports(cluster, name):
    """The JSON reports that `tfhpc-doctor --output /jobs/out/doctor/<name>-{rank}.json` wrote, by rank."""
    _, out = cluster.run("ctl", f"cat /jobs/out/doctor/{name}-0.json /jobs/out/doctor/{name}-1.json")
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_doctor_across_nodes_passes_with_pmix_and_flags_srun_without_it(slurm_cluster, sif):
    # One report file per rank (--output): srun may split the long JSON lines of two ranks into each other's.
    slurm_cluster.run("ctl", "rm -rf /jobs/out/doctor && mkdir -m 1777 /jobs/out/doctor")
    job, state, rc, output = sbatch(slurm_cluster, sif, "command-srun-pmix.sbatch",
                                    "tfhpc-doctor --json --output /jobs/out/doctor/pmix-{rank}.json")
    assert (rc, state) == (0, "COMPLETED"), output
    reports = doctor_reports(slurm_cluster, "pmix")
    assert sorted(r["host"] for r in reports) == NODES
    assert all(set(r["facts"]["sizes"].values()) == {2} for r in reports), [r["facts"]["sizes"] for r in reports]
    assert all(r["facts"]["runtime"] == "apptainer" for r in reports)
    # The same with srun --mpi=none: the image's MPI cannot wire up; the doctor says so on both ranks (the cluster
    # kills a step on a bad exit: keep the other rank alive to hear it too).
    # (from /jobs/out, which apptainer binds as the working directory, as the job above does)
    rc, out = slurm_cluster.run("ctl", f"cd /jobs/out && srun -N2 -n2 --mpi=none --kill-on-bad-exit=0 apptainer exec {sif} "
                                       "tfhpc-doctor --json --output /jobs/out/doctor/none-{rank}.json", timeout=300)
    reports = doctor_reports(slurm_cluster, "none")
    assert rc != 0 and len(reports) == 2, out
    for report in reports:
        # The image's Open MPI either starts as a world of 1 (flagged as the size()==1 trap) or aborts because it
        # sees Slurm without PMI (flagged as Horovod/MPI not starting): both must name srun --mpi=pmix.
        (launcher,) = [c for c in report["checks"] if c["section"] == "launcher"]
        assert launcher["status"] == "fail" and "--mpi=pmix" in launcher["fix"], launcher
        assert "size()==1" in launcher["detail"] or "without PMI" in launcher["detail"], launcher


@pytest.mark.parametrize("script", ["horovod-srun-pmix.sbatch", "mwms-slurm-resolver.sbatch", "command-srun-pmix.sbatch",
                                    "horovod-srun-gloo.sbatch", "horovod-host-mpi.sbatch"])
def test_job_script_without_sif_is_a_one_line_error(slurm_cluster, script):
    rc, out = slurm_cluster.run("ctl", f"cd /tmp && bash /jobs/scripts/{script} 2>&1")
    assert rc != 0 and len(out.strip().splitlines()) == 1 and "set TFHPC_SIF" in out, out


# (image MPI, host MPI): the MPICH image on the site's MPICH; the standard-ABI image, where the stack has one, on three
# implementations: MPICH and Intel MPI (srun --mpi=pmi2) and Open MPI 6 (srun --mpi=pmix: Slurm's PMIx 5 serving
# Open MPI 6's PMIx client).
FULL_TIER_JOBS = [("abi", "mpich"), ("abi", "impi-rt"), ("abi", "openmpi6")]
# The test tier runs the MPICH image on MPICH (srun --mpi=pmi2, the job script's bind model); the ABI image on MPICH,
# Intel MPI and Open MPI 6 is the full tier's: each library loads and trains from the SIF with its own launcher in
# tests/sites/test_abi_host_mpi.py, srun --mpi=pmix starts the SIF's ranks in test_generic_pmix_job_... and the
# doctor's job below, and the job script is the MPICH image's job.
SAME_PATH = pytest.mark.full("the ABI image on this MPI: tests/sites; srun --mpi=pmix: the generic PMIx job; "
                             "the job script: mpich-on-mpich")
HOST_MPI_JOBS = [pytest.param(*case, id=f"{case[0]}-on-{case[1]}", marks=[SAME_PATH] if case in FULL_TIER_JOBS else [])
                 for case in [("mpich", "mpich"), ("abi", "mpich"), ("abi", "impi-rt"), ("abi", "openmpi6")]
                 if case[0] in CONFIG.site_test_mpis]
SRUN_MPI = {"mpich": "pmi2", "impi-rt": "pmi2", "openmpi6": "pmix"}


def host_mpi_job(slurm_cluster, image_mpi, host_mpi, command):
    """Submit `command` through horovod-host-mpi.sbatch with the SIF of the `image_mpi` image on host MPI
    `host_mpi`; returns sbatch()'s (job id, state, exit status, output)."""
    image_sif = sif_path(MANIFEST.config(CONFIG.stack, CONFIG.flavor, image_mpi), LEAF)
    if not image_sif.is_file():
        pytest.fail(f"{image_sif} is missing: run `make site-images` first")
    environment = f"TFHPC_HOST_MPI={in_containers(install_host_mpi(host_mpi))} TFHPC_SRUN_MPI={SRUN_MPI[host_mpi]}"
    if host_mpi == "impi-rt":
        environment += f" TFHPC_HOST_LIBS={in_containers(install_site_mpi('mpich'))}/lib/mpich"
    # --time: a rank that waits for ever in MPI_Init ends with the job instead of the test's timeout.
    return sbatch(slurm_cluster, f"/sif/{image_sif.name}", "horovod-host-mpi.sbatch", command, options="--time=5",
                  environment=environment)


@pytest.mark.parametrize(("image_mpi", "host_mpi"), HOST_MPI_JOBS)
def test_host_mpi_job_runs_on_the_sites_mpi_under_srun(slurm_cluster, image_mpi, host_mpi):
    """The Cray-style bind model: srun starts the ranks of the MPICH image (its libmpi.so.12 replaced) or of the
    standard-ABI image (MPI=abi, its libmpi_abi.so.1 replaced) on the host MPI that TFHPC_HOST_MPI names: each rank
    loaded the host library (the doctor), MPI and Horovod wired up as one world of 2 across the nodes and the
    collectives are exact. Intel MPI's wheel has no libfabric: TFHPC_HOST_LIBS gives it the one of PyPI's MPICH (a
    site gives its own; without one, MPI_Init fails in MPIDI_OFI_mpi_init_hook). The image gives MPICH the OFI network
    module under srun --mpi=pmi2 (tfhpc_runtime/hostenv.py): with UCX, Slurm's pmi2 plugin misparsed MPICH's long PMI-1
    requests and MPI_Init hung in 3 of 4 Horovod starts."""
    prefix = in_containers(install_host_mpi(host_mpi))
    library = {"mpich": "libmpi.so.12", "abi": "libmpi_abi.so.1"}[image_mpi]
    # One report file per rank: two ranks' long JSON lines can interleave in the job's shared output file.
    job, state, rc, output = host_mpi_job(slurm_cluster, image_mpi, host_mpi,
                                          "sh -c 'exec tfhpc-doctor --json > doctor.$SLURM_JOB_ID.$SLURM_PROCID.json'")
    assert (rc, state) == (0, "COMPLETED"), output
    _, written = slurm_cluster.run("ctl", f"cat /jobs/out/doctor.{job}.0.json /jobs/out/doctor.{job}.1.json")
    reports = [json.loads(line) for line in written.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in reports) == [0, 1] and {r["host"] for r in reports} == set(NODES), output
    for report in reports:
        assert report["facts"]["mpi_library"]["paths"] and all(
            p.startswith(prefix + "/") and p.endswith(f"/{library}") for p in report["facts"]["mpi_library"]["paths"]
        ), report["facts"]
        assert report["facts"]["mpi_library"]["version"].startswith(LIBRARY_VERSIONS[host_mpi]), report["facts"]
        (world,) = [c for c in report["checks"] if c["section"] == "launcher" and c["name"] == "world size"]
        assert world["status"] == "ok" and "horovod 2, mpi 2" in world["detail"], world

    job, state, rc, output = host_mpi_job(slurm_cluster, image_mpi, host_mpi,
                                          "tfhpc-smoke-collectives --sizes 1,1023,65536")
    found = results(output)
    assert (rc, state) == (0, "COMPLETED"), output[-3000:]
    assert [(r["rank"], r["size"], r["controller"]) for r in found] == [(0, 2, "mpi"), (1, 2, "mpi")], output
    assert {r["host"] for r in found} == set(NODES) and "value not properly terminated" not in output
    assert not any(r["failures"] for r in found) and found[0]["allreduce"] == found[1]["allreduce"]


# Keras training over the host MPI under srun: Horovod's allreduce of the gradients is the collectives job's
# allreduce above, over the same library, launcher and job script.
TRAINING = pytest.mark.full("the collectives job of the same job script and host MPI (the gradients' allreduce is "
                            "Horovod's allreduce over that library); Keras training on each host MPI: tests/sites/"
                            "test_host_mpi.py's test_keras_training_on_the_host_mpi; under srun: the Daint job")


@pytest.mark.parametrize(("image_mpi", "host_mpi"), [pytest.param(*case.values, id=case.id, marks=[TRAINING])
                                                     for case in HOST_MPI_JOBS])
def test_host_mpi_job_trains_keras_with_equal_weights(slurm_cluster, image_mpi, host_mpi):
    """2-rank Keras training on the host MPI under srun ends with equal weights on both ranks and the loss falling."""
    job, state, rc, output = host_mpi_job(slurm_cluster, image_mpi, host_mpi, "tfhpc-smoke-train --epochs 3")
    found = results(output)
    assert (rc, state) == (0, "COMPLETED"), output[-3000:]
    assert {r["host"] for r in found} == set(NODES) and [r["size"] for r in found] == [2, 2]
    assert all(r["max_weight_difference_across_ranks"] == 0.0 for r in found)
    assert found[0]["losses"][-1] < 0.5 * found[0]["losses"][0]


def test_srun_pmix_starts_charliecloud_ranks_on_two_nodes(slurm_cluster):
    """Charliecloud across nodes: srun --mpi=pmix starts `ch-run` of the directory image on 2 nodes, unprivileged;
    the image's Open MPI wires up from Slurm's PMIx as under apptainer (MPICH images: --mpi=pmi2)."""
    pmi = "pmi2" if CONFIG.mpi == "mpich" else "pmix"
    # ch-run wants $USER, which a login shell has and `docker exec` does not give.
    rc, out = slurm_cluster.run("ctl", f"cd /jobs/out && export USER=$(id -un) && srun -N2 -n2 --mpi={pmi} "
                                       "ch-run --set-env /ch/app -- "
                                       "tfhpc-smoke-collectives --sizes 1,4096 --dtypes float32,int32", timeout=600)
    found = results(out)
    assert rc == 0, out[-3000:]
    assert [(r["rank"], r["size"]) for r in found] == [(0, 2), (1, 2)] and {r["host"] for r in found} == set(NODES)
    assert not any(r["failures"] for r in found) and found[0]["allreduce"] == found[1]["allreduce"], out[-3000:]


# ---------------------------------------------------------------------------------------------------------------- #
# A long job: Slurm's warning signal mid-epoch (scancel --signal=USR1 --batch, as --signal=B:USR1@120 sends it before
# the time limit) reaches the batch script, which forwards it to the ranks on both nodes (srun --overlap pkill); they
# save that step and exit 99, the script requeues the job, the second run resumes with --resume auto and finishes.

TRAINING = "tfhpc-train-hvd-fit --train-samples 3000 --test-samples 500 --epochs 3 --verbose 0"
RESUME_TOLERANCE = 1e-5  # as tests/images/app/test_training.py
# Runs on the controller once the job was interrupted at time $2 (date +%s.%N): records when the job was requeued
# (Restarts=1: the ranks had exited), when it ran again, when the resumed run finished its first step (the first
# step line after the line matching $3), and the final state; prints them as one "TIMES {json}" line (seconds since
# the interruption).
SIGNAL_AT = "epoch 2/3 step 5/"
FOLLOW_REQUEUE = r"""
job=$1 start=$2 resumed=$3 out=/jobs/out/$1.out
field() { scontrol show job -o "$job" | grep -o "$1=[^ ]*" | cut -d= -f2; }
within() { local end=$((SECONDS + $1)); shift; until "$@"; do [ $SECONDS -lt $end ] || exit 1; sleep 0.1; done; }
since() { awk -v now="$(date +%s.%N)" -v start="$start" 'BEGIN {printf "%.2f", now - start}'; }
is() { [ "$(field "$1")" = "$2" ]; }
ended() { case "$(field JobState)" in PENDING|CONFIGURING|RUNNING|COMPLETING|REQUEUE*) return 1;; esac; }
requeued() { is Restarts 1 || { ended && echo "not requeued: $(field JobState) $(field ExitCode)" && exit 1; }; }
within 300 requeued; requeued=$(since)
within 300 is JobState RUNNING; running=$(since)
within 300 awk -v resumed="$resumed" '$0 ~ resumed {r = 1} r && / step [0-9]+\// {found = 1} END {exit !found}' "$out"
first_step=$(since)
within 900 ended
printf 'TIMES {"requeued": %s, "running": %s, "first_step": %s, "state": "%s", "exit": "%s", "restarts": %s}\n' \
    "$requeued" "$running" "$first_step" "$(field JobState)" "$(field ExitCode)" "$(field Restarts)"
"""


def submit(cluster, sif, script, arguments):
    """sbatch without waiting; returns the job id."""
    rc, out = cluster.run("ctl", f"cd /jobs/out && TFHPC_SIF={sif} sbatch --parsable --output=/jobs/out/%j.out "
                                 f"/jobs/scripts/{script} {arguments}")
    assert rc == 0, out
    return out.strip().splitlines()[-1].partition(";")[0]


def interrupt_and_follow(cluster, job, at, node, interrupt, resumed):
    """Once the job's output shows `at`, run `interrupt` on `node` and follow the job (FOLLOW_REQUEUE) until it
    ends; returns (the TIMES, the job's output)."""
    rc, out = cluster.run("ctl", f"timeout 600 sh -c 'until grep -q \"{at}\" /jobs/out/{job}.out; do sleep 0.1; done'",
                          timeout=700)
    assert rc == 0, out
    rc, start = cluster.run(node, f"date +%s.%N && {interrupt}")
    assert rc == 0, start
    rc, follow = cluster.run("ctl", f"bash -c {shlex.quote(FOLLOW_REQUEUE)} follow {job} {start.split()[0]} "
                                    f"{shlex.quote(resumed)}", timeout=900)
    _, output = cluster.run("ctl", f"cat /jobs/out/{job}.out")
    assert rc == 0 and "TIMES {" in follow, follow + output
    return json.loads(follow.partition("TIMES ")[2]), output


def max_weight_difference(cluster, sif, first, second):
    code = ("import numpy as np, sys; a, b = np.load(sys.argv[1]), np.load(sys.argv[2]); "
            "print(max(float(np.abs(a[k] - b[k]).max()) for k in a.files))")
    rc, difference = cluster.run("ctl", f"cd /jobs/out && apptainer exec {sif} python -c {shlex.quote(code)} "
                                        f"{first} {second}", timeout=300)
    assert rc == 0, difference
    return float(difference.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def hvd_fit_job(slurm_cluster, sif):
    """(RESULT lines, output) of an uninterrupted TRAINING job under horovod-srun-pmix.sbatch; its weights in
    /jobs/out/uninterrupted.npz."""
    _, state, rc, output = sbatch(slurm_cluster, sif, "horovod-srun-pmix.sbatch",
                                  f"{TRAINING} --weights-out uninterrupted.npz")
    assert (rc, state) == (0, "COMPLETED"), output
    return results(output, 2), output


def test_signalled_job_saves_requeues_resumes_and_ends_like_an_uninterrupted_run(slurm_cluster, sif, hvd_fit_job):
    job = submit(slurm_cluster, sif, "horovod-srun-pmix.sbatch",
                 f"{TRAINING} --log-steps 1 --checkpoint-dir ckpt-signalled --resume auto --weights-out signalled.npz")
    times, output = interrupt_and_follow(slurm_cluster, job, SIGNAL_AT, "ctl", f"scancel --signal=USR1 --batch {job}",
                                         "resumed from")
    assert (times["state"], times["exit"], times["restarts"]) == ("COMPLETED", "0:0", 1), (times, output)
    assert "tfhpc: USR1: the ranks save and stop" in output

    reports = results(output)
    stopped = [r for r in reports if "stopped" in r]
    finished = [r for r in reports if "stopped" not in r]
    assert [r["rank"] for r in stopped] == [0, 1] and [r["rank"] for r in finished] == [0, 1], output
    (epoch, step), = {(r["stopped"]["epoch"], r["stopped"]["step"]) for r in stopped}
    assert epoch == 1 and 5 <= step < stopped[0]["steps_per_epoch"], "mid-epoch 2, at or after the signal"
    # The job script signals the ranks of every node at about the same time, but a step takes some 40 ms here: the
    # first rank's signal stops all of them at the next step's agreement, and the other node's may arrive after it
    # (that rank's "signal" is then None). What must hold: the signal reached a rank in its container, and every rank
    # that had it stopped within one step.
    signalled = [r for r in stopped if r["stopped"]["signal"] is not None]
    assert signalled and all(r["stopped"]["signal"] == "SIGUSR1" and r["stopped"]["steps_since_signal"] <= 1
                             for r in signalled), [r["stopped"] for r in stopped]
    assert stopped[0]["checkpoints_written"] == ["epoch-0001", f"epoch-0001-step-{step:06d}"]
    for report in finished:
        assert (report["initial_epoch"], report["initial_step"]) == (epoch, step), "no step done twice"
        assert report["size"] == 2 and report["failures"] == []
    difference = max_weight_difference(slurm_cluster, sif, "uninterrupted.npz", "signalled.npz")
    print(f"Slurm: USR1 at step {step} of epoch 2; ranks saved and exited in "
          f"{max(r['stopped']['seconds_since_signal'] for r in signalled):.2f} s, job requeued "
          f"{times['requeued']:.1f} s after the signal, running again after {times['running']:.1f} s, first resumed "
          f"step after {times['first_step']:.1f} s ({times['first_step'] - times['requeued']:.1f} s after the "
          f"requeue); 0 steps redone; resumed vs uninterrupted: max |dw| = {difference:.3g}")
    assert difference <= RESUME_TOLERANCE


# ---------------------------------------------------------------------------------------------------------------- #
# A worker killed without warning: SIGKILL of one MWMS worker's Python process mid-epoch, as the out-of-memory killer
# or a lost node ends it; no signal to save on. TensorFlow's BackupAndRestore (--backup-dir, every BACKUP_EVERY
# steps) has backed up the training state; the job fails, mwms-slurm-resolver.sbatch requeues it because the backup
# exists, and the same command continues from the backup.

# --keras 2: Keras' own BackupAndRestore (tf_keras); the Keras 3 backup is tested in tests/images/app
MWMS_TRAINING = "--train-samples 3000 --test-samples 500 --epochs 3 --verbose 0 --keras 2"
BACKUP_EVERY = 10
KILL_AT = "epoch 2/3 step 25/"
KILL_WORKER = "pkill -KILL -f '[/]opt/tfhpc/scripts/train/'"  # on node2: the worker's Python process in apptainer


@pytest.fixture(scope="module")
def mwms_fit_job(slurm_cluster, sif):
    """The RESULT lines of an uninterrupted MWMS_TRAINING job under mwms-slurm-resolver.sbatch; its weights in
    /jobs/out/mwms-uninterrupted.npz."""
    _, state, rc, output = sbatch(slurm_cluster, sif, "mwms-slurm-resolver.sbatch",
                                  f"{MWMS_TRAINING} --weights-out mwms-uninterrupted.npz")
    assert (rc, state) == (0, "COMPLETED"), output
    return results(output, 2)


def test_killed_worker_fails_the_job_which_requeues_and_resumes_from_the_backup(slurm_cluster, sif, mwms_fit_job):
    uninterrupted = mwms_fit_job
    job = submit(slurm_cluster, sif, "mwms-slurm-resolver.sbatch",
                 f"{MWMS_TRAINING} --log-steps 1 --backup-dir backup-killed --backup-every-steps {BACKUP_EVERY} "
                 "--weights-out mwms-killed.npz")
    times, output = interrupt_and_follow(slurm_cluster, job, KILL_AT, "node2", KILL_WORKER,
                                         "resuming from the backup")
    assert (times["state"], times["exit"], times["restarts"]) == ("COMPLETED", "0:0", 1), (times, output)
    first_run, _, second_run = output.partition("requeued to continue from the backup in backup-killed")
    assert second_run, f"the job script requeued the job:\n{output}"
    assert "RESULT {" not in first_run, "the killed run did not finish"

    steps = uninterrupted[0]["steps_per_epoch"]
    logged = [(int(e) - 1, int(s)) for e, s in re.findall(r"epoch (\d+)/3 step (\d+)/", first_run)]
    killed_at = max(logged)  # the last step the chief finished before the kill took it down
    reports = results(second_run)
    assert [(r["rank"], r["size"]) for r in reports] == [(0, 2), (1, 2)], second_run
    resumed = {(r["initial_epoch"], r["initial_step"]) for r in reports}
    assert len(resumed) == 1, resumed
    (epoch, step), = resumed
    for report in reports:
        backup = report["backup"]
        assert backup["restored_from"].startswith("backup-killed/chief/ckpt-"), backup
        assert (backup["first_step"]["epoch"], backup["first_step"]["step"]) == (epoch, step), \
            "Keras itself started at the backup's step"
        assert len(report["losses"]) == 3 - epoch and report["failures"] == []
    # Backups every BACKUP_EVERY steps of the fit, counted from its start: the run resumed at the newest one before
    # the kill (or at the step the chief had backed up but not yet logged when the kill took it down: -1 redone; or
    # the one before a logged step whose backup the kill cut short: BACKUP_EVERY redone).
    redone = (killed_at[0] * steps + killed_at[1]) - (epoch * steps + step)
    assert (epoch * steps + step) % BACKUP_EVERY == 0 and -1 <= redone <= BACKUP_EVERY, (killed_at, resumed)
    final_losses = reports[0]["losses"]
    assert final_losses[-1] < 0.5 * uninterrupted[0]["losses"][0], (final_losses, uninterrupted[0]["losses"])
    _, listing = slurm_cluster.run("ctl", "ls -A /jobs/out/backup-killed")
    assert listing.strip() == "", "a finished run's backup is deleted"
    difference = max_weight_difference(slurm_cluster, sif, "mwms-uninterrupted.npz", "mwms-killed.npz")
    print(f"Slurm: worker on node2 SIGKILLed after step {killed_at[1]} of epoch {killed_at[0] + 1} (as logged); job "
          f"requeued {times['requeued']:.1f} s after the kill, running again after {times['running']:.1f} s, first "
          f"resumed step after {times['first_step']:.1f} s ({times['first_step'] - times['running']:.1f} s after the "
          f"job started again); resumed from the backup at step {step} of epoch {epoch + 1}: {redone} step(s) "
          f"redone; final loss {final_losses[-1]:.4f} (uninterrupted {uninterrupted[0]['losses'][-1]:.4f}); resumed "
          f"vs uninterrupted: max |dw| = {difference:.3g}")
    assert difference <= RESUME_TOLERANCE
