"""Which Keras `tf.keras` is in a training entrypoint: --keras 3|2, or TFHPC_KERAS for a whole job script.

TensorFlow reads TF_USE_LEGACY_KERAS once, when `tensorflow` is first imported: 0 makes `tf.keras` (and
horovod.tensorflow.keras, built on it) Keras 3, 1 makes it tf_keras (Keras 2). So the choice is made here, from the
installed distributions' metadata, before the script imports TensorFlow; after that import it would have no effect.

Default: Keras 3 where TensorFlow ships it (>= 2.16, the latest stack), as TensorFlow's own guides use it; Keras 2 on
TensorFlow < 2.16 (the conservative stack), whose Keras 2 is built in and which looks for tf_keras when the switch
is 1 (docs/keras.md).

Imports neither numpy nor TensorFlow.
"""
import os
from importlib import metadata

from .errors import fail

ENVIRONMENT = "TFHPC_KERAS"
CHOICES = ("3", "2")
HELP = (f"the Keras of tf.keras and of Horovod's Keras API: 3 (Keras 3, what TensorFlow >= 2.16 ships) or 2 "
        f"(tf_keras, or the Keras 2 built into TensorFlow < 2.16); default: ${ENVIRONMENT}, else 3 where TensorFlow "
        f"has Keras 3, else 2")


def add_keras_arg(parser):
    parser.add_argument("--keras", choices=CHOICES, default=None, help=HELP)
    return parser


def _version(*names):
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return None


def _major_minor(version):
    try:
        return tuple(int(part) for part in version.split(".")[:2])
    except (AttributeError, ValueError):
        return (0, 0)


def available(versions=None):
    """The Keras majors this Python environment can give tf.keras, the first the default: ("3", "2"), ("2",) or ()
    without TensorFlow. versions: {distribution: version} (default: the installed ones)."""
    if versions is None:
        versions = {name: _version(name) for name in ("tensorflow", "tensorflow-cpu", "keras", "tf-keras")}
    tensorflow = versions.get("tensorflow") or versions.get("tensorflow-cpu")
    if not tensorflow:
        return ()
    if _major_minor(tensorflow) < (2, 16):
        return ("2",)  # Keras 2 built in
    majors = ("3",) if _major_minor(versions.get("keras")) >= (3, 0) else ()
    return majors + (("2",) if versions.get("tf-keras") else ())


def select_keras(choice=None, environ=os.environ, versions=None):
    """Set TF_USE_LEGACY_KERAS for `choice` (--keras), else for $TFHPC_KERAS, else for the default; returns "3" or
    "2". One line and exit 2 for a value that is neither or a Keras this image does not have. Call it before the
    first `import tensorflow`."""
    source = "--keras"
    if choice is None and environ.get(ENVIRONMENT, "") != "":
        choice, source = environ[ENVIRONMENT].strip(), ENVIRONMENT
        if choice not in CHOICES:
            fail(f"{ENVIRONMENT}={environ[ENVIRONMENT]!r} is not a Keras major version: set it to 3 (Keras 3) or 2 "
                 f"(tf_keras), or unset it for the default")
    majors = available(versions)
    if not majors:
        fail("TensorFlow is not installed in this Python environment: run the entrypoint in a tfhpc image")
    if choice is None:
        choice = majors[0]
    if choice not in majors:
        tensorflow = (versions or {}).get("tensorflow") or _version("tensorflow", "tensorflow-cpu")
        if choice == "3":
            fail(f"{source} 3: TensorFlow {tensorflow} in this image has Keras 2 only (Keras 3 needs TensorFlow "
                 f">= 2.16, the latest stack's image): use --keras 2, or the latest stack's image")
        fail(f"{source} 2: this image has no tf_keras beside TensorFlow {tensorflow}: use --keras 3, or an image "
             f"with tf_keras (the latest stack's images have it)")
    # TensorFlow < 2.16 honours the switch too and would look for tf_keras: Keras 2 there is 0.
    legacy = choice == "2" and "3" in majors
    environ["TF_USE_LEGACY_KERAS"] = "1" if legacy else "0"
    return choice
