"""--keras 3|2 and TFHPC_KERAS (tfhpc_runtime.kerasselect): which TF_USE_LEGACY_KERAS a training entrypoint sets
before it imports TensorFlow, on the host with the distributions of each stack given as data."""
import pytest

from tfhpc_runtime.kerasselect import available, select_keras

LATEST = {"tensorflow-cpu": "2.30.0", "keras": "3.20.0", "tf-keras": "2.30.0"}
CONSERVATIVE = {"tensorflow": "2.14.9", "keras": "2.14.0"}
KERAS3_ONLY = {"tensorflow": "2.30.0", "keras": "3.20.0"}


@pytest.mark.parametrize("versions, majors", [
    (LATEST, ("3", "2")), (CONSERVATIVE, ("2",)), (KERAS3_ONLY, ("3",)), ({"keras": "3.20.0"}, ())])
def test_available_kerases_default_first(versions, majors):
    assert available(versions) == majors


@pytest.mark.parametrize("versions, choice, variable, chosen, legacy", [
    (LATEST, None, None, "3", "0"),          # the default where TensorFlow has Keras 3
    (LATEST, "2", None, "2", "1"),           # tf_keras
    (LATEST, None, "2", "2", "1"),           # a job script's TFHPC_KERAS
    (LATEST, "3", "2", "3", "0"),            # the flag wins over the variable
    (CONSERVATIVE, None, None, "2", "0"),    # Keras 2 built in: TF 2.15 would look for tf_keras with 1
    (CONSERVATIVE, "2", "", "2", "0"),       # an empty variable is unset
])
def test_the_choice_sets_tf_use_legacy_keras(versions, choice, variable, chosen, legacy):
    environ = {"TF_USE_LEGACY_KERAS": "1"} if variable is None else {"TF_USE_LEGACY_KERAS": "1", "TFHPC_KERAS": variable}
    assert select_keras(choice, environ, versions) == chosen
    assert environ["TF_USE_LEGACY_KERAS"] == legacy


@pytest.mark.parametrize("versions, choice, variable, phrases", [
    (LATEST, None, "keras3", ["TFHPC_KERAS='keras3' is not a Keras major version", "set it to 3", "or 2"]),
    (CONSERVATIVE, "3", None, ["--keras 3", "TensorFlow 2.14.9", "Keras 2 only", "use --keras 2"]),
    (CONSERVATIVE, None, "3", ["TFHPC_KERAS 3", "Keras 2 only", "use --keras 2"]),
    (KERAS3_ONLY, "2", None, ["--keras 2", "no tf_keras", "use --keras 3"]),
])
def test_a_keras_the_image_lacks_is_one_line_naming_the_fix(capsys, versions, choice, variable, phrases):
    environ = {} if variable is None else {"TFHPC_KERAS": variable}
    with pytest.raises(SystemExit) as stopped:
        select_keras(choice, environ, versions)
    assert stopped.value.code == 2 and "TF_USE_LEGACY_KERAS" not in environ
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfhpc: error: "), lines
    for phrase in phrases:
        assert phrase in lines[0], (phrase, lines[0])
