"""The package holds no code only its tests call, and no process-wide mutable cache.

Read with `ast` and a word search over the sources, nothing is executed.
"""

import ast
import collections
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = sorted((ROOT / "pipo_jax").rglob("*.py"))
USERS = PACKAGE + sorted((ROOT / "experiments").rglob("*.py")) + sorted((ROOT / "configs").rglob("*.py"))
# Public API documented in README.md for users, though nothing in the repository calls it.
DOCUMENTED_API = {"hidden_states"}
# Module-level tables the package fills once at import (the algorithm and task registries), not caches.
REGISTRIES = {"ADVANTAGE_ESTIMATORS", "POLICY_LOSSES", "ATTRIBUTIONS", "ADVANTAGE_SHAPINGS", "ALGORITHMS", "TASKS"}


def _top_level_functions(path: pathlib.Path):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            yield node.name


def test_every_public_function_has_a_caller_outside_the_tests():
    words = collections.Counter(w for p in USERS for w in re.findall(r"\w+", p.read_text()))
    unused = []
    for path in PACKAGE:
        for name in _top_level_functions(path):
            if words[name] == 1 and name not in DOCUMENTED_API:  # its definition only
                unused.append(f"{path.relative_to(ROOT)}:{name}")
    assert not unused, f"only tests (or nothing) call these; move them into the tests: {unused}"


def test_no_module_level_dict_is_filled_by_a_function():
    """A module-level dict written inside a function is a process-wide cache (the old `_ENGINES`):
    its owner should be an object the caller keeps."""
    found = []
    for path in PACKAGE:
        tree = ast.parse(path.read_text())
        tables = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                  for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                  if isinstance(t, ast.Name) and isinstance(node.value, ast.Dict)} - REGISTRIES
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.Lambda)):
                continue
            for node in ast.walk(fn):
                targets = node.targets if isinstance(node, ast.Assign) else []
                for t in targets:
                    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in tables:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {t.value.id}")
    assert not found, found
