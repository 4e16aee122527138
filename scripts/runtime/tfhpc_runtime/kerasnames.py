"""Which Keras each Keras name of a user's script resolves to, read from its source (nothing is run), and whether it
mixes two: a Keras 3 model trained with a tf_keras optimizer, loss, metric or callback (or the other way round) fails
in compile or fit. Used by `tfhpc-doctor --script train.py`.

The names and where they lead (docs/keras.md):
- `keras` (import keras, from keras import ...): Keras 3, the Keras TensorFlow >= 2.16 installs;
- `tf.keras`, `tensorflow.keras`: whatever TF_USE_LEGACY_KERAS selects (tf_keras, Keras 2, when it is 1; else
  Keras 3);
- `tf_keras`: Keras 2;
- `horovod.tensorflow.keras` (DistributedOptimizer, callbacks, elastic): the image's Horovod wraps an optimizer of
  either Keras and its callbacks run in a fit of either (Horovod patches 0007-0009), so they never make a mix.
"""
import ast

KERAS3, LEGACY, TF_KERAS, HOROVOD = "keras", "tensorflow.keras", "tf_keras", "horovod.tensorflow.keras"
ROOTS = (HOROVOD, LEGACY, TF_KERAS, KERAS3)  # longest first: horovod.tensorflow.keras is not tensorflow.keras
# The first name after the root -> the part of training it makes.
ROLES = {"Sequential": "model", "Model": "model", "Input": "model", "layers": "model", "models": "model",
         "applications": "model", "optimizers": "optimizer", "losses": "loss", "metrics": "metric",
         "callbacks": "callback"}


def resolve(dotted):
    """(root, role, rest) of a fully qualified name such as 'tensorflow.keras.optimizers.SGD', or None."""
    for root in ROOTS:
        if dotted == root or dotted.startswith(root + "."):
            rest = dotted[len(root) + 1:]
            return root, ROLES.get(rest.split(".")[0]), rest
    return None


def _dotted(node):
    """'a.b.c' of a Name or chain of Attributes, or None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _aliases(tree):
    """{local name: fully qualified name} from the script's imports and plain `name = other.name` assignments."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    aliases[head] = head
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    # `keras = tf.keras` and the like, after the imports they name (one pass in source order suffices for scripts).
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            dotted = _dotted(node.value)
            if dotted and dotted.split(".")[0] in aliases:
                head, _, tail = dotted.partition(".")
                full = aliases[head] + ("." + tail if tail else "")
                if resolve(_canonical(full)):
                    aliases[node.targets[0].id] = full
    return aliases


def _canonical(name):
    return "tensorflow.keras" + name[len("tensorflow.python.keras"):] \
        if name.startswith("tensorflow.python.keras") else name


def keras_names(source):
    """Every use of a Keras name in `source`: [{'name': as written, 'qualified': ..., 'root': ..., 'role': ...,
    'line': ...}], in source order, the longest chain of each expression only."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Attribute, ast.Name)) or id(node) in inner:
            continue
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            continue
        written = _dotted(node)
        if not written:
            continue
        head, _, tail = written.partition(".")
        if head not in aliases:
            continue
        qualified = _canonical(aliases[head] + ("." + tail if tail else ""))
        resolved = resolve(qualified)
        if resolved and resolved[2]:
            found.append({"name": written, "qualified": qualified, "root": resolved[0], "role": resolved[1],
                          "line": node.lineno, "column": node.col_offset})
    return sorted(found, key=lambda item: (item["line"], item["column"]))


def keras_of(root, legacy_keras):
    """'3' or '2' for a root; legacy_keras: whether tf.keras is tf_keras here (TF_USE_LEGACY_KERAS=1). None for
    Horovod's names, which follow the model."""
    return {KERAS3: "3", TF_KERAS: "2", LEGACY: "2" if legacy_keras else "3"}.get(root)


def find_mix(names, legacy_keras):
    """(the script's first model name, [uses of another Keras than the model's: optimizers first]), or None.
    A Keras 3 model cannot compile with a tf_keras optimizer (nor the other way round); other names of another
    Keras may run or fail depending on what they call."""
    models = [n for n in names if n["role"] == "model" and keras_of(n["root"], legacy_keras)]
    if not models:
        return None
    model = models[0]
    others = [n for n in names if n["role"] and
              keras_of(n["root"], legacy_keras) not in (None, keras_of(model["root"], legacy_keras))]
    others.sort(key=lambda n: n["role"] != "optimizer")
    return (model, others) if others else None


def mix_fix(model, other, legacy_keras):
    """The fix in one line: the other name taken from the model's Keras, or TF_USE_LEGACY_KERAS=0 where that makes
    both one Keras."""
    model_prefix = model["name"][:len(model["name"]) - len(resolve(model["qualified"])[2])] or \
        {KERAS3: "keras.", LEGACY: "tf.keras.", TF_KERAS: "tf_keras."}[model["root"]]
    replacement = model_prefix + resolve(other["qualified"])[2]
    fix = f"write {replacement} instead of {other['name']} (line {other['line']}): the model's Keras"
    if legacy_keras and {model["root"], other["root"]} == {KERAS3, LEGACY}:
        fix += ", or export TF_USE_LEGACY_KERAS=0 so that tf.keras is Keras 3 too"
    return fix
