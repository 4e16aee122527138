"""The doctor entrypoint, tested by creating each condition it must detect: a healthy 2-rank run under
horovodrun and mpirun passes with size 2 everywhere; srun-style tasks whose MPI cannot wire up (each rank alone) are
flagged; HTTP proxies, a malformed TF_CONFIG and an NCCL interface that does not exist are flagged with a fix; no GPU
here is reported without failing. Every --json report validates against scripts/doctor.schema.json."""
import json
import shlex

import jsonschema
import pytest

from support.stack import CONFIG, REPO_ROOT

SCHEMA = json.loads((REPO_ROOT / "scripts" / "doctor.schema.json").read_text())
TWO_SLURM_TASKS = ("for i in 0 1; do SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_PROCID=$i SLURM_LOCALID=$i "
                   "SLURM_NTASKS=2 SLURM_STEP_NUM_TASKS=2 tfhpc-doctor --json > /tmp/doctor.$i & done; "
                   "wait %1; a=$?; wait %2; b=$?; cat /tmp/doctor.0 /tmp/doctor.1; echo \"exits $a $b\"")


def reports(output):
    """Every JSON report in the output (horovodrun prefixes lines with the rank), validated, sorted by rank."""
    found = []
    for line in output.splitlines():
        if "{" in line:
            report = json.loads(line[line.index("{"):])
            jsonschema.validate(report, SCHEMA)
            found.append(report)
    return sorted(found, key=lambda r: r["rank"])


def check(report, name):
    matches = [c for c in report["checks"] if c["name"] == name]
    assert len(matches) == 1, (name, report["checks"])
    return matches[0]


def doctor(host, environment="", arguments="--json"):
    result = host.run(f"env {environment} tfhpc-doctor {arguments}")
    return result.rc, result.stdout, result.stderr


# horovodrun over MPI starts the ranks through the image's mpirun with Horovod's variables: the doctor reads the same
# launcher, Horovod and MPI sizes as under mpirun itself; horovodrun's own launch is the Gloo one.
SAME_LAUNCH = pytest.mark.full("mpirun -np 2: the Open MPI launch that horovodrun -np 2 runs; horovodrun's own "
                               "launch: horovodrun -np 2 --gloo")


@pytest.mark.parametrize("launcher", [pytest.param("horovodrun -np 2", marks=SAME_LAUNCH), "horovodrun -np 2 --gloo",
                                      "mpirun -np 2"])
def test_healthy_two_rank_run_passes_with_size_two_everywhere(host, image_layer, launcher):
    # One file per rank: a launcher that forwards output in chunks may cut a long line of one rank with the other's.
    result = host.run(f"rm -rf /tmp/healthy && {launcher} tfhpc-doctor --json --output '/tmp/healthy/{{rank}}.json'"
                      " && cat /tmp/healthy/*.json")
    found = reports(result.stdout)
    assert result.rc == 0, result.stdout + result.stderr
    assert [r["rank"] for r in found] == [0, 1]
    for report in found:
        assert report["ok"] and report["summary"]["fail"] == 0, report["checks"]
        assert set(report["facts"]["sizes"].values()) == {2}, report["facts"]["sizes"]
        assert "size 2 everywhere" in check(report, "world size")["detail"]
    if "mpirun" in launcher or "--gloo" not in launcher:
        assert found[0]["facts"]["sizes"].get("mpi") == 2
    for report in found:  # the image's architecture, native on this host (emulated: tests/arm64)
        architecture = check(report, "architecture")
        assert architecture["status"] == "ok" and architecture["detail"].startswith(f"{CONFIG.machine}, native: ")
        assert report["facts"]["architecture"]["machine"] == CONFIG.machine, report["facts"]["architecture"]


def test_tasks_that_each_see_size_one_are_flagged_on_every_rank(host, image_layer):
    # srun without --mpi=pmix: Slurm says 2 tasks, but the image's MPI starts each rank as a world of 1.
    result = host.run(TWO_SLURM_TASKS)
    found = reports(result.stdout)
    assert result.stdout.strip().endswith("exits 1 1"), result.stdout
    assert [r["rank"] for r in found] == [0, 1]
    for report in found:
        world = check(report, "world size")
        assert world["status"] == "fail" and "size()==1" in world["detail"], world
        assert report["facts"]["sizes"] == {"launcher": 2, "horovod": 1, "mpi": 1}
        assert "--mpi=pmix" in world["fix"]
        assert check(report, "slurm port")["status"] == "ok"  # the job id's port block is free here


# The environment checks run in one doctor each way: every condition at once flagged, then every one cleared.
TF_CONFIG = json.dumps({"cluster": {"worker": ["node1:2222", "node2:2222"]}, "task": {"type": "worker", "index": 0}})
FLAGGED = "http_proxy=http://proxy.invalid:3128 NCCL_SOCKET_IFNAME=ib9"
CLEARED = f"http_proxy=http://proxy.invalid:3128 no_proxy=node1,node2 TF_CONFIG={shlex.quote(TF_CONFIG)} " \
          "NCCL_SOCKET_IFNAME=eth"


@pytest.fixture(scope="module")
def environment_reports(host):
    """{"flagged" | "cleared": (exit status, the JSON report)} of the doctor in FLAGGED's and CLEARED's environment."""
    found = {}
    for name, environment in (("flagged", FLAGGED), ("cleared", CLEARED)):
        rc, out, _ = doctor(host, environment)
        found[name] = rc, reports(out)[0]
    return found


def test_http_proxy_is_flagged_unless_no_proxy_covers_the_workers(image_layer, environment_reports):
    rc, report = environment_reports["flagged"]
    proxy = check(report, "http proxy")
    assert rc == 1 and proxy["status"] == "fail" and "unset http_proxy" in proxy["fix"]
    rc, report = environment_reports["cleared"]
    assert rc == 0 and check(report, "http proxy")["status"] == "ok", report["checks"]
    assert check(report, "TF_CONFIG")["detail"] == "worker 0 of 2 workers: node1:2222"


@pytest.mark.full("the same check on the host: tests/unit/test_doctor_units.py's "
                  "test_a_malformed_tf_config_fails_with_a_fix; the image's doctor reads TF_CONFIG in the proxy test")
@pytest.mark.parametrize("tf_config, phrase", [
    ("{not json", "is not valid JSON"),
    ('{"cluster": {"worker": ["node1:2222"]}, "task": {"type": "worker", "index": 3}}', "task index 3 is outside"),
    ('{"cluster": {"worker": ["node1"]}, "task": {"type": "worker", "index": 0}}', "host:port"),
])
def test_malformed_tf_config_is_flagged(host, image_layer, tf_config, phrase):
    rc, out, _ = doctor(host, f"TF_CONFIG={shlex.quote(tf_config)}")
    entry = check(reports(out)[0], "TF_CONFIG")
    assert rc == 1 and entry["status"] == "fail" and phrase in entry["detail"] and entry["fix"], entry


def test_nccl_interface_that_does_not_exist_is_flagged(image_layer, environment_reports):
    rc, report = environment_reports["flagged"]
    entry = check(report, "NCCL_SOCKET_IFNAME")
    assert rc == 1 and entry["status"] == "fail" and "eth0" in entry["fix"], entry
    rc, report = environment_reports["cleared"]
    assert rc == 0 and check(report, "NCCL_SOCKET_IFNAME")["status"] == "ok", report["checks"]


@pytest.fixture(scope="module")
def text_report(host):
    """The doctor's text report as `--output '/tmp/out/doctor-{rank}.txt'` wrote it: (exit status, the directory's
    listing, the file)."""
    result = host.run("rm -rf /tmp/out && tfhpc-doctor --output '/tmp/out/doctor-{rank}.txt'")
    return result.rc, host.check_output("ls -A /tmp/out").split(), host.file("/tmp/out/doctor-0.txt").content_string


def test_no_gpu_is_reported_without_failing_and_text_report_ends_with_a_verdict(image_layer, text_report):
    rc, _, out = text_report
    assert rc == 0, out
    assert out.strip().splitlines()[-1].startswith("verdict: OK (0 failed")
    if CONFIG.flavor == "gpu":  # a GPU image without a GPU: a warning with the fix, and what the image expects
        gpu = CONFIG.gpu
        assert (f"[warn] devices: no GPU visible: TensorFlow runs on the CPU (image built for CUDA {gpu['cuda']}, "
                f"cuDNN {gpu['cudnn'].split('.')[0]}, NCCL {gpu['nccl']})") in out
        assert "fix: on a GPU node add --nv" in out
        assert "[ ok ] horovod: Horovod built with MPI, Gloo, NCCL" in out
    else:
        assert "[info] devices: CPU image; 0 GPU device(s) visible" in out
        assert "[ ok ] horovod: Horovod built with MPI, Gloo" in out


def test_output_file_holds_the_whole_report_and_a_bad_path_is_one_line(host, image_layer, text_report):
    rc, listing, out = text_report
    assert rc == 0 and listing == ["doctor-0.txt"], (rc, listing)  # no temporary file left beside it
    assert out.strip().splitlines()[-1].startswith("verdict: OK")
    result = host.run("tfhpc-doctor --output /proc/forbidden/doctor.txt")
    assert result.rc != 0 and result.stderr.strip().count("\n") == 0, result.stderr
    assert "cannot write /proc/forbidden/doctor.txt" in result.stderr and "--output" in result.stderr


KERAS3 = pytest.mark.skipif(not CONFIG.keras_patches, reason="the stack has no Keras 3 (TensorFlow < 2.16)")
# A user's script that trains a Keras 3 model with the optimizer and a callback of tf.keras, which is tf_keras under
# the image's TF_USE_LEGACY_KERAS=1.
MIXED_SCRIPT = """import numpy as np
import tensorflow as tf
import keras
x, y = np.zeros((8, 4), "float32"), np.zeros((8, 2), "float32")
model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(2)])
model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
model.fit(x, y, epochs=1, verbose=0, callbacks=[tf.keras.callbacks.TerminateOnNaN()])
print("trained")
"""


@pytest.fixture(scope="module")
def script_reports(host):
    """The doctor on a mixed script and on a shipped example (one Keras), under the image's TF_USE_LEGACY_KERAS=1 and
    under 0, and the mixed script itself under both."""
    host.check_output(f"printf '%s' {shlex.quote(MIXED_SCRIPT)} > /tmp/mixed.py")
    scripts = "--script /tmp/mixed.py --script /opt/tfhpc/examples/keras3_hvd_fit.py"
    found = {}
    for legacy in ("1", "0"):
        rc, out, _ = doctor(host, f"TF_USE_LEGACY_KERAS={legacy}", f"--json {scripts}")
        run = host.run(f"TF_USE_LEGACY_KERAS={legacy} python /tmp/mixed.py")
        found[legacy] = (rc, reports(out)[0], run)
    rc, text, _ = doctor(host, "", scripts)
    return found, rc, text


@KERAS3
def test_doctor_names_a_keras_mix_in_a_script_with_the_fix(image_layer, script_reports):
    found, _, _ = script_reports
    rc, report, run = found["1"]
    names = check(report, "keras in mixed.py")["detail"]
    assert "keras.Sequential (line 5) -> Keras 3." in names
    assert f"tf.keras.optimizers.SGD (line 6) -> tf_keras {CONFIG.versions['tf_keras']} (TF_USE_LEGACY_KERAS=1)" \
        in names
    mix = check(report, "keras mix in mixed.py")
    assert rc == 1 and mix["status"] == "fail", mix
    assert mix["detail"] == ("a Keras 3 model (keras.Sequential, line 5) with a Keras 2 optimizer "
                             "(tf.keras.optimizers.SGD, line 6); also tf.keras.callbacks.TerminateOnNaN")
    assert mix["fix"] == ("write keras.optimizers.SGD instead of tf.keras.optimizers.SGD (line 6): the model's Keras, "
                          "or export TF_USE_LEGACY_KERAS=0 so that tf.keras is Keras 3 too")
    assert [n["keras"] for n in report["facts"]["scripts"]["/tmp/mixed.py"]["names"]][:4] == ["3", "3", "3", "2"]
    # As the doctor says: the script fails in compile.
    assert run.rc != 0 and "trained" not in run.stdout, run.stdout + run.stderr
    assert check(report, "keras mix in keras3_hvd_fit.py")["status"] == "ok"


@KERAS3
def test_doctor_finds_no_mix_once_tf_keras_is_keras3_and_the_script_trains(image_layer, script_reports):
    found, _, _ = script_reports
    rc, report, run = found["0"]
    assert rc == 0 and check(report, "keras mix in mixed.py")["status"] == "ok", report["checks"]
    assert "tf.keras.optimizers.SGD (line 6) -> Keras 3." in check(report, "keras in mixed.py")["detail"]
    assert run.rc == 0 and "trained" in run.stdout, run.stdout + run.stderr


@KERAS3
def test_doctor_text_report_shows_the_mix_and_its_fix(image_layer, script_reports):
    _, rc, text = script_reports
    assert rc == 1
    assert "[FAIL] keras mix in mixed.py: a Keras 3 model (keras.Sequential, line 5)" in text
    assert "fix: write keras.optimizers.SGD instead of tf.keras.optimizers.SGD (line 6)" in text
