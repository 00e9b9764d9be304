"""The edit-test tier (`pytest -m quick`, docs/testing.md): the tests neither marked `slow` nor in a file of
`LONG_FILES` (tests/conftest.py), and it still tests every package with its cheap tests."""

import ast
import os
import pathlib
import subprocess
import sys

from tests import long_files
from tests.conftest import LONG_FILES
from tests.import_graph import MODULES, ROOT, file_imports, package_of

TESTS = sorted(p for p in (ROOT / "tests").rglob("test_*.py"))


def _slow(node: ast.AST) -> bool:
    """Whether `node` is `pytest.mark.slow` (a decorator or a `pytestmark` value)."""
    return isinstance(node, ast.Attribute) and node.attr == "slow"


def _has_a_test_not_marked_slow(path: pathlib.Path) -> bool:
    tree = ast.parse(path.read_text())
    module_slow = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                      and (_slow(n.value) or any(_slow(e) for e in getattr(n.value, "elts", ())))
                      for n in tree.body)
    return not module_slow and any(isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
                                   and not any(_slow(d) for d in n.decorator_list) for n in ast.walk(tree))


def _quick_files() -> list[pathlib.Path]:
    return [p for p in TESTS if str(p.relative_to(ROOT)) not in LONG_FILES and _has_a_test_not_marked_slow(p)]


def test_every_package_has_tests_in_the_quick_tier():
    """Each package of `pipo_jax/` (its subpackages and modules), `configs/` and `experiments/` is imported by a
    test file of the tier."""
    packages = {package_of(m) for m in MODULES} - {"pipo_jax"}  # the package's __init__: a docstring
    tested = {package_of(name if name in MODULES else name.rsplit(".", 1)[0])
              for p in _quick_files() for name, _, _ in file_imports(p)
              if name.split(".")[0] in ("pipo_jax", "configs", "experiments")}
    assert packages - tested == set(), f"no test of the quick tier imports {sorted(packages - tested)}"
    assert {"losses", "models", "rl", "run", "sampling", "tasks", "kernels", "parallel"} <= packages


def test_the_tier_is_what_conftest_marks():
    """`-m quick` keeps a cheap file's tests, leaves out a file of `LONG_FILES` and the tests marked `slow`."""
    cheap, long = "tests/test_docs.py", "tests/rl/test_trainer.py"
    slow = "tests/kernels/test_logprobs_vocab_parallel.py"
    assert long in LONG_FILES and slow not in LONG_FILES and not _has_a_test_not_marked_slow(ROOT / slow)
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "quick", "-p",
                          "no:cacheprovider", cheap, long, slow], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    assert ids and all(i.startswith(cheap + "::") for i in ids), out.stdout[-3000:] + out.stderr[-3000:]
    assert len(ids) == sum(1 for line in out.stdout.splitlines() if line.startswith(cheap))


def test_long_files_lists_the_files_over_ten_seconds_longest_first():
    files = long_files.long_files({"tests/a.py": 12.4, "tests/b.py": 9.9, "tests/c.py": 30.6, "tests/d.py": 10.0})
    assert list(files.items()) == [("tests/c.py", 31), ("tests/a.py", 12)]
    text = long_files.as_python({f"tests/t{i}.py": 100 - i for i in range(12)}, width=60)
    assert max(map(len, text.splitlines())) <= 60
    assert ast.literal_eval(text.partition(" = ")[2]) == {f"tests/t{i}.py": 100 - i for i in range(12)}
