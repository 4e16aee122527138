"""Checks of the tensorflow layer, run on tensorflow and every image built on it."""
import json
import re

from support.stack import CONFIG

PROBE = ("import json, importlib, tensorflow as tf; m = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)]); "
         "package = type(m).__module__.split('.')[0]; "
         "print(json.dumps({'tf': tf.__version__, 'keras_package': package, "
         "'keras_version': importlib.import_module(package).__version__, "
         "'cuda': tf.test.is_built_with_cuda(), 'sum': float(tf.reduce_sum(tf.range(10.0)))}))")


def test_tensorflow_version_and_keras(host, image_layer):
    report = json.loads(host.check_output(f'python -c "{PROBE}"').splitlines()[-1])
    assert report["tf"] == CONFIG.versions["tensorflow"]
    assert report["sum"] == 45.0
    if "tf_keras" in CONFIG.versions:
        # TF >= 2.16: tf.keras must be Keras 2 from tf_keras (TF_USE_LEGACY_KERAS=1), at the pinned version
        assert report["keras_package"] == "tf_keras"
        assert report["keras_version"] == CONFIG.versions["tf_keras"]
    else:
        assert report["keras_package"] == "keras" and report["keras_version"].startswith("2.")
    assert report["cuda"] is (CONFIG.flavor == "gpu")


def test_legacy_keras_switch_matches_tf_keras(host, image_layer):
    expected = "1" if "tf_keras" in CONFIG.versions else "0"
    assert host.check_output("echo $TF_USE_LEGACY_KERAS") == expected


def test_tensorflow_distribution_matches_flavor(host, image_layer):
    packages = {re.sub(r"[-_.]+", "-", p).lower() for p in host.pip.get_packages(pip_path="/opt/venv/bin/pip")}
    distribution = CONFIG.tensorflow_distribution  # "tensorflow[and-cuda]" installs the wheel "tensorflow"
    assert distribution in packages
    if distribution != "tensorflow":
        assert "tensorflow" not in packages, "the full tensorflow wheel must not be installed over " + distribution
