"""What a program could do past the sandbox's limits, each run for real through the sandbox:
a directory tree too deep for a recursive cleanup, control-flow exceptions relayed into the
tests, helpers a test uses without importing them, SysV shared memory outliving the run,
`prlimit` of the judge, a scratch directory filled without bound, responses that take as long
as their tests allow."""
import os
import tempfile

import pytest

from pipo_jax.tasks import code as cd

NO_LANDLOCK = cd.landlock_abi() == 0


def _cfg(**kw) -> cd.SandboxConfig:
    kw.setdefault("allow_network", not cd.namespaces_available())
    return cd.SandboxConfig(timeout_s=10.0, startup_s=10.0, allow_unconfined=NO_LANDLOCK, **kw)


def _network_modes() -> list:
    """"audit" (no namespaces: the scratch directory is on the host's disk) and "namespace"."""
    return ["audit", pytest.param("namespace", marks=pytest.mark.skipif(
        not cd.namespaces_available(), reason="'unshare --user --net --pid' is not usable here"))]


# (a) 3000 nested directories: shutil.rmtree recursed once per level and raised RecursionError.
DEEP_TREE = """
import os
depth = 0
for _ in range(3000):
    os.mkdir("d")
    os.chdir("d")
    depth += 1
"""


@pytest.mark.parametrize("network", _network_modes())
def test_a_3000_deep_directory_tree_neither_ends_the_run_nor_stays_behind(network, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the scratch directories go
    cfg = _cfg(network=network, allow_network=network == "audit" or not cd.namespaces_available())
    [result] = cd.score_code_batch(["```python\n" + DEEP_TREE + "```"], [[cd.AssertTest("assert depth == 3000")]], cfg)
    assert result.outcomes == ("pass",), result.feedback  # the whole tree was made
    assert list(tmp_path.iterdir()) == []


def test_removing_a_tree_deeper_than_path_max_with_locked_directories(tmp_path):
    top = tmp_path / "scratch"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for _ in range(3000):  # 9000 characters of path: past PATH_MAX, reachable by fd only
        os.mkdir("dd", dir_fd=fd)
        os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
        os.symlink("/", "up", dir_fd=fd)  # removed, never followed
        below = os.open("dd", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = below
    os.close(fd)
    os.chmod(top / "dd", 0)  # a directory the program locked
    cd.launch.remove_tree(str(top))
    assert list(tmp_path.iterdir()) == []


# (b) relayed by its builtin name, a StopIteration ended the test's map(): all() held, any() did not.
PREDICATE_TESTS = [cd.AssertTest("assert is_even(2)"), cd.AssertTest("assert not is_even(3)"),
                   cd.AssertTest("assert all(map(is_even, [1, 3]))"),
                   cd.AssertTest("assert not any(map(is_even, [2, 4]))")]


@pytest.mark.parametrize("exc", ["StopIteration", "StopAsyncIteration", "GeneratorExit", "KeyboardInterrupt",
                                 "SystemExit"])
def test_control_flow_exceptions_of_the_solution_fail_the_tests(exc):
    result = cd.run_tests(f"def is_even(n):\n    raise {exc}\n", PREDICATE_TESTS, _cfg())
    assert (result.reward, result.outcomes) == (0.0, ("error",) * 4), result.feedback
    assert exc in result.feedback
    honest = cd.run_tests("def is_even(n):\n    return n % 2 == 0\n", PREDICATE_TESTS, _cfg())
    assert honest.outcomes == ("pass", "pass", "fail", "fail")


def test_ordinary_exceptions_of_the_solution_keep_their_builtin_type():
    test = cd.AssertTest("try:\n    f(-1)\nexcept ValueError as e:\n    assert 'negative' in str(e)\n"
                         "else:\n    assert False, 'no error'")
    assert cd.run_tests("def f(x):\n    raise ValueError('negative')\n", [test], _cfg()).outcomes == ("pass",)
    assert cd.run_tests("def f(x):\n    raise StopIteration('negative')\n", [test], _cfg()).outcomes == ("error",)
