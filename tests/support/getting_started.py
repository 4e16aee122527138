"""The commands of docs/getting-started.md, and which test runs each: the page's commands are run as written, so that
the page and the tests cannot drift. tests/images/app/test_getting_started.py runs RUN_IN_THE_APP_IMAGE_TEST (the
page's `docker run` commands, with the image the page names) and checks their output against the page's example;
every other command of the page needs a cluster, a registry or a build, and ELSEWHERE names the test that runs the
same step and why the image test does not. tests/unit/test_getting_started_commands.py holds the page to these lists:
a command added to, changed on or removed from the page fails there until a test runs it or says why none can."""
import re
import shlex

from support.stack import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "getting-started.md"
# The image the page's commands name: the default configuration's app image (stack latest, flavour cpu, openmpi).
PAGE_IMAGE = "tfhpc-app:latest-cpu-openmpi"

# Section 2, "Train on 2 ranks": what the app image test runs, in the page's order.
RUN_IN_THE_APP_IMAGE_TEST = [
    f"docker run --rm {PAGE_IMAGE}",
    f"docker run --rm {PAGE_IMAGE} horovodrun -np 2 tfhpc-train-hvd-fit --epochs 3",
    f"docker run --rm {PAGE_IMAGE} launch-local-mwms -n 2 tfhpc-train-mwms-fit --epochs 3",
    f"docker run --rm {PAGE_IMAGE} horovodrun -np 2 python /opt/tfhpc/examples/keras3_hvd_custom_loop.py",
]

# The page's other commands: (the test that runs the same step, or None where no test can, and why the app image test
# does not run the command).
ELSEWHERE = {
    "make image": (
        "tests/images/app/test_app.py::test_images_json_records_what_each_image_reports",
        "it builds the images every image test runs; `make test` runs it first"),
    "make show": (
        "tests/unit/test_getting_started_commands.py::test_make_show_names_the_image_the_page_runs",
        "no container: the unit test runs it"),
    "make sif": (
        "tests/sif/test_sif.py::test_inspect_shows_component_versions",
        "it converts the image into the SIF the SIF tests run; `make test` runs it first"),
    "rsync -P build/sif/tfhpc-app_latest-cpu-openmpi.sif login.cluster.example:/scratch/$USER/tfhpc-app.sif": (
        None,
        "a copy over ssh to a real cluster's login node, which no test has; the test cluster's nodes read the SIF "
        "from a shared directory, as the page asks"),
    "make push REGISTRY=ghcr.io/ORG": (
        "tests/publish/test_push.py::test_every_image_and_the_sif_carry_every_tag",
        "it needs a registry: tests/publish pushes to one on 127.0.0.1"),
    "apptainer pull tfhpc-app.sif oras://ghcr.io/ORG/tfhpc-app-sif:TAG-amd64": (
        "tests/publish/test_push.py::test_pulled_sif_verifies_with_the_site_key_and_has_the_published_sha256",
        "it needs a registry and apptainer: tests/publish pulls over oras from its registry"),
    "srun -N2 --ntasks-per-node=1 --mpi=pmix apptainer exec $SCRATCH/tfhpc-app.sif tfhpc-doctor": (
        "tests/cluster/test_slurm.py::test_doctor_across_nodes_passes_with_pmix_and_flags_srun_without_it",
        "it needs a Slurm cluster: tests/cluster runs the doctor under srun --mpi=pmix on 2 nodes"),
    "export APPTAINER_BIND=/scratch/$USER": (
        "tests/sif/test_sif.py::test_users_own_script_bind_mounted",
        "a cluster's /scratch; the SIF test binds a user's script into the SIF with -B, the bind the variable asks "
        "Apptainer for"),
    "TFHPC_SIF=$SCRATCH/tfhpc-app.sif sbatch --nodes=4 horovod-srun-pmix.sbatch python /scratch/$USER/my_train.py": (
        "tests/cluster/test_slurm.py::test_daint_horovod_job_trains_with_identical_weights",
        "it needs a Slurm cluster and the user's script: tests/cluster submits horovod-srun-pmix.sbatch with the "
        "command after it on 2 nodes (a shipped one)"),
    "TFHPC_SIF=$SCRATCH/tfhpc-app.sif sbatch --time=12:00:00 horovod-srun-pmix.sbatch tfhpc-train-hvd-fit --epochs 90 "
    "--checkpoint-dir $SCRATCH/ckpt --resume auto": (
        "tests/cluster/test_slurm.py::test_signalled_job_saves_requeues_resumes_and_ends_like_an_uninterrupted_run",
        "it needs a Slurm cluster: tests/cluster signals, requeues and resumes the same job script and entrypoint"),
}

COMMENT = re.compile(r"(?:^|\s+)#.*$")
ELLIPSIS = re.compile(r"\.\.\.(?!\.)")


def shell_blocks(text):
    """The ```sh and ```bash blocks of a Markdown text."""
    return re.findall(r"^```(?:sh|bash)\n(.*?)^```", text, re.M | re.S)


def commands(text=None):
    """Every command of the page's shell blocks as a shell reads it: continuation lines joined, comments and blank
    lines left out, runs of blanks as one."""
    found = []
    for block in shell_blocks(PAGE.read_text() if text is None else text):
        for line in block.replace("\\\n", " ").splitlines():
            line = " ".join(COMMENT.sub("", line).split())
            if line:
                found.append(line)
    return found


def example_output(text=None):
    """The page's example of what the 2-rank training prints: the lines of its ```text block."""
    (block,) = re.findall(r"^```text\n(.*?)^```", PAGE.read_text() if text is None else text, re.M | re.S)
    return block.splitlines()


def pattern(example_line):
    """A regular expression for one line of the example: `...` stands for any text (the last three of a run of dots:
    `"3...."` is "3." and any text), `S/S` for the steps per epoch done and in all (the same number)."""
    parts = [re.escape(part) for part in ELLIPSIS.split(example_line)]
    return re.compile("^" + ".*".join(parts).replace("S/S", r"(\d+)/\1") + "$")


def argv(command, image):
    """The command as the docker CLI's arguments, run with `image` in place of the page's (the same in the default
    configuration) and a label by which `make clean` finds a container a killed run left."""
    words = shlex.split(command)
    assert words[:4] == ["docker", "run", "--rm", PAGE_IMAGE], f"not a `docker run --rm` of {PAGE_IMAGE}: {command}"
    return ["docker", "run", "--rm", "--label", "io.tfhpc.test-runtime=getting-started", image, *words[4:]]
