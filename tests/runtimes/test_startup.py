"""Start-up of one rank per runtime: the wall time of the runtime command that runs
`python -c 'import tensorflow, horovod.tensorflow'` (3 runs, median), for Docker, Apptainer (the SIF, in the helper
container, as uid 1000), Charliecloud (as uid 1000) and Podman; each run must import both. The medians go to
build/runtimes/startup.json (docs/measurements.md records them)."""
import json
import statistics
import subprocess
import time

import pytest

from runtimes.runtime_helpers import WORK_ROOT, as_user, label, podman_run_args, run_in, user_environment
from support.stack import CONFIG, LEAF

# Figures, not checks: every runtime starts the image's ranks in the test tier (tests/runtimes' two-rank tests,
# tests/sif), so the medians are the full tier's.
pytestmark = pytest.mark.full("each runtime's two-rank test imports TensorFlow and Horovod in the test tier")

RUNS = 3
CODE = "import tensorflow, horovod.tensorflow; print('imported')"
MEASURED = {}


def timed(run):
    """[(seconds, output)] of RUNS calls of run(), each of which returns (exit status, output)."""
    samples = []
    for _ in range(RUNS):
        start = time.perf_counter()
        status, output = run()
        seconds = time.perf_counter() - start
        assert status == 0 and "imported" in output.split(), output[-2000:]
        samples.append(seconds)
    return samples


def record(runtime, samples, how):
    MEASURED[runtime] = {"median_s": round(statistics.median(samples), 2), "runs_s": [round(s, 2) for s in samples],
                         "command": how}
    assert MEASURED[runtime]["median_s"] < 120, MEASURED[runtime]


def test_docker(docker_client, app_image):
    def run():
        output = docker_client.containers.run(app_image.id, ["-c", CODE], entrypoint=["python"], remove=True,
                                              network_mode="none", labels=label("startup"), stderr=True)
        return 0, output.decode(errors="replace")  # a failure raises ContainerError
    record("docker", timed(run), "docker run --rm --network none --entrypoint python IMAGE -c ...")


@pytest.mark.sif
def test_apptainer(helper):
    from tfhpc.sif import sif_path
    sif = sif_path(CONFIG, LEAF)
    if not sif.is_file():
        pytest.fail(f"{sif} is missing: run `make sif` first")
    # Timed inside the helper (the docker exec around it is not apptainer's).
    command = (f"s=$(date +%s%N); apptainer exec /sif/{sif.name} python -c \"{CODE}\"; r=$?; "
               "echo elapsed_ns=$(( $(date +%s%N) - s )); exit $r")
    samples = []
    for _ in range(RUNS):
        status, output = run_in(helper, command)
        assert status == 0 and "imported" in output.split(), output[-2000:]
        samples.append(int(output.rsplit("elapsed_ns=", 1)[1].split()[0]) / 1e9)
    record("apptainer", samples, "apptainer exec IMAGE.sif python -c ... (uid 1000, in the helper container)")


def test_charliecloud(ch_image):
    def run():
        done = subprocess.run(as_user(["ch-run", "--set-env", str(ch_image), "--", "python", "-c", CODE]),
                              capture_output=True, text=True, env=user_environment(), timeout=300)
        return done.returncode, done.stdout + done.stderr
    record("charliecloud", timed(run), "ch-run --set-env DIR -- python -c ... (uid 1000)")


def test_podman(podman_image):
    base, name = podman_image

    def run():
        done = subprocess.run([*base, "run", *podman_run_args(), "--entrypoint", "python", name, "-c", CODE],
                              capture_output=True, text=True, timeout=300)
        return done.returncode, done.stdout + done.stderr
    record("podman", timed(run), "podman run --rm --network none --entrypoint python IMAGE -c ... (rootful)")


def test_write_results():
    """Runs last in this module: all four runtimes measured, written to build/runtimes/startup.json."""
    assert set(MEASURED) == {"docker", "apptainer", "charliecloud", "podman"}, MEASURED
    WORK_ROOT.mkdir(parents=True, exist_ok=True)
    result = {"image": CONFIG.image(LEAF), "runs": RUNS, "code": CODE, "measured": time.strftime("%Y-%m-%d"),
              "runtimes": MEASURED}
    (WORK_ROOT / "startup.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
