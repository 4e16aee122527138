"""The import graphs of the two packages, read from their source with `ast`: no circle, and imports at module top.

A circle makes the result of an import depend on which module was imported first, and hides what depends on what.
An import inside a function is still a dependency (it only runs later), so it counts in the graph; and it hides the
dependency from a reader of the module's top, so each one that stays carries a comment on its line that says why
(an optional or heavy dependency, start-up time).
"""
import ast
import io
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# package name -> the directory its import root is (where `import NAME` finds it)
PACKAGES = {"tfhpc": REPO, "tfhpc_runtime": REPO / "scripts" / "runtime"}


def modules(package):
    """{dotted module name: path} of every module of the package; a package's own name maps to its __init__.py."""
    root = PACKAGES[package]
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name, path, tree=None):
    """(node, [imported module names]) of every import statement of a module, at any depth."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree or ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield node, [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[:len(name.split(".")) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            # `from X import y` imports X, and X.y too when y is a module
            yield node, [target, *(f"{target}.{alias.name}" for alias in node.names)]


def graph(package):
    """{module: {modules of the package it imports}}, imports inside functions included."""
    known = modules(package)
    edges = {name: set() for name in known}
    for name, path in known.items():
        for _, targets in imports(name, path):
            edges[name] |= {target for target in targets if target in known and target != name}
    return edges


def circles(edges):
    """Every elementary circle, each once, starting at its smallest module: [[a, b, ..., a], ...]."""
    found = []
    for start in sorted(edges):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for following in sorted(edges[node]):
                if following == start:
                    found.append([*path, start])
                elif following > start and following not in path:
                    stack.append((following, [*path, following]))
    return found


def describe(found):
    return "\n".join(" -> ".join(circle) for circle in found)


@pytest.mark.parametrize("package", ["tfhpc_runtime", "tfhpc"])
def test_no_import_circle(package):
    found = circles(graph(package))
    assert not found, f"import circles in {package}:\n{describe(found)}"


def function_imports(package):
    """(path, line, statement) of each import inside a function or class that has no comment on its lines."""
    uncommented = []
    for name, path in modules(package).items():
        source = path.read_text()
        commented = {token.start[0] for token in tokenize.generate_tokens(io.StringIO(source).readline)
                     if token.type == tokenize.COMMENT}
        tree = ast.parse(source, filename=str(path))
        nested = {id(node) for scope in ast.walk(tree)
                  if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  for node in ast.walk(scope) if node is not scope}
        for node, _ in imports(name, path, tree):
            if id(node) in nested and not commented & set(range(node.lineno, node.end_lineno + 1)):
                uncommented.append((path.relative_to(REPO), node.lineno, ast.unparse(node)))
    return sorted(uncommented)


@pytest.mark.parametrize("package", ["tfhpc_runtime", "tfhpc"])
def test_function_level_imports_say_why(package):
    found = function_imports(package)
    assert not found, ("imports inside functions without a comment that says why (move them to the top, or add "
                       "one on the line):\n" + "\n".join(f"{path}:{line}: {text}" for path, line, text in found))


def test_graph_sees_lazy_and_relative_imports():
    """The reader itself: a relative import inside a function is an edge, and `from . import x` names module x."""
    edges = graph("tfhpc_runtime")
    assert "tfhpc_runtime.errors" in edges["tfhpc_runtime.data"]
    assert "tfhpc_runtime.trainflags" not in edges["tfhpc_runtime.cli"]
    assert circles({"a": {"b"}, "b": {"c", "a"}, "c": {"a"}}) == [["a", "b", "a"], ["a", "b", "c", "a"]]
