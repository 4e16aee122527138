"""Which Keras each Keras name of a script resolves to (tfhpc_runtime/kerasnames.py, used by tfhpc-doctor --script),
on the host: aliases, from-imports and `keras = tf.keras` followed; a mix found with its fix; no mix in the shipped
examples. tests/images/app/test_doctor.py runs the doctor on such scripts in the image."""
import pytest

from tfhpc import REPO_ROOT
from tfhpc_runtime.kerasnames import find_mix, keras_names, keras_of, mix_fix

MIXED = """
import tensorflow as tf
import keras
from tensorflow.keras.callbacks import EarlyStopping
model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(2)])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
model.fit(x, y, callbacks=[tf.keras.callbacks.TerminateOnNaN(), EarlyStopping()])
"""


def names(source):
    return [(n["name"], n["root"], n["role"], n["line"]) for n in keras_names(source)]


def test_each_name_resolves_through_imports_and_aliases():
    assert names(MIXED) == [
        ("keras.Sequential", "keras", "model", 5), ("keras.Input", "keras", "model", 5),
        ("keras.layers.Dense", "keras", "model", 5), ("keras.optimizers.SGD", "keras", "optimizer", 6),
        ("tf.keras.callbacks.TerminateOnNaN", "tensorflow.keras", "callback", 7),
        ("EarlyStopping", "tensorflow.keras", "callback", 7)]
    aliased = "import tensorflow as tf\nimport tf_keras as k2\nkeras = tf.keras\nm = keras.models.Sequential()\n" \
              "o = k2.optimizers.Adam()\nimport horovod.tensorflow.keras as hvd\nhvd.callbacks.MetricAverageCallback()\n"
    assert names(aliased) == [("keras.models.Sequential", "tensorflow.keras", "model", 4),
                              ("k2.optimizers.Adam", "tf_keras", "optimizer", 5),
                              ("hvd.callbacks.MetricAverageCallback", "horovod.tensorflow.keras", "callback", 7)]


def test_tf_keras_follows_the_legacy_switch_and_horovod_follows_the_model():
    assert [keras_of(root, True) for root in ("keras", "tensorflow.keras", "tf_keras")] == ["3", "2", "2"]
    assert [keras_of(root, False) for root in ("keras", "tensorflow.keras", "tf_keras")] == ["3", "3", "2"]
    assert keras_of("horovod.tensorflow.keras", True) is None


def test_a_keras3_model_with_a_tf_keras_callback_is_a_mix_with_its_fix():
    found = keras_names(MIXED)
    model, others = find_mix(found, legacy_keras=True)
    other = others[0]
    assert (model["name"], [o["name"] for o in others]) == ("keras.Sequential", ["tf.keras.callbacks.TerminateOnNaN",
                                                                                 "EarlyStopping"])
    assert mix_fix(model, other, True) == (
        "write keras.callbacks.TerminateOnNaN instead of tf.keras.callbacks.TerminateOnNaN (line 7): the model's "
        "Keras, or export TF_USE_LEGACY_KERAS=0 so that tf.keras is Keras 3 too")
    assert find_mix(found, legacy_keras=False) is None  # tf.keras is Keras 3 then


def test_tf_keras_is_never_keras3():
    source = ("import keras, tf_keras\nm = tf_keras.Sequential()\nm.compile(loss=keras.losses.MeanSquaredError(), "
              "optimizer=keras.optimizers.SGD())\n")
    model, others = find_mix(keras_names(source), legacy_keras=False)
    assert [o["role"] for o in others] == ["optimizer", "loss"]  # the optimizer first: compile refuses it
    assert mix_fix(model, others[0], False) == ("write tf_keras.optimizers.SGD instead of keras.optimizers.SGD (line 3): "
                                            "the model's Keras")


@pytest.mark.parametrize("example", sorted(p.name for p in (REPO_ROOT / "examples").glob("*.py")))
def test_no_shipped_example_mixes_two_keras(example):
    found = keras_names((REPO_ROOT / "examples" / example).read_text())
    assert any(n["role"] == "model" for n in found), example
    legacy = example.startswith("tf_keras")
    assert find_mix(found, legacy_keras=True) is None
    if not legacy:
        assert {keras_of(n["root"], True) for n in found} <= {"3", None}
