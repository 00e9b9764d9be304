"""What a program could do past the sandbox's limits, each run for real through the sandbox:
a directory tree too deep for a recursive cleanup, control-flow exceptions relayed into the
tests, helpers a test uses without importing them, SysV shared memory outliving the run,
`prlimit` of the judge, a scratch directory filled without bound, responses that take as long
as their tests allow."""
import os
import tempfile
import time

import pytest

from pipo_jax.data.sources import DataError, Example
from pipo_jax.tasks import code as cd
from pipo_jax.tasks import dataset

NO_LANDLOCK = cd.landlock_abi() == 0


def _cfg(**kw) -> cd.SandboxConfig:
    kw.setdefault("allow_network", not cd.namespaces_available())
    kw.setdefault("timeout_s", 10.0)
    return cd.SandboxConfig(startup_s=10.0, allow_unconfined=NO_LANDLOCK, **kw)


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


# (c) a helper the test does not import was the solution's to define: ``isclose`` that is always True.
AREA = "import math\ndef area(r):\n    return math.pi * r * r\n"
ISCLOSE_HACK = "def area(r):\n    return 0\nisclose = lambda *a, **k: True\n"


def test_a_helper_the_test_does_not_import_is_not_the_solutions_to_define():
    unimported = [cd.AssertTest("assert isclose(area(2), 12.566, rel_tol=1e-3)")]
    for program in (ISCLOSE_HACK, "from math import isclose\n" + AREA):
        result = cd.run_tests(program, unimported, _cfg())
        assert (result.reward, result.outcomes) == (0.0, ("error",)), result.feedback
        assert "'isclose'" in result.feedback and "neither imports nor defines" in result.feedback
    imported = [cd.AssertTest("from math import isclose\nassert isclose(area(2), 12.566, rel_tol=1e-3)"),
                cd.AssertTest("r = area(1)\nassert isclose(r, 3.1416, rel_tol=1e-3)")]
    assert cd.run_tests(ISCLOSE_HACK, imported, _cfg()).outcomes == ("fail", "fail")  # the judge's isclose
    assert cd.run_tests(AREA, imported, _cfg()).reward == 1.0


def test_a_row_whose_test_uses_an_unimported_helper_is_refused_at_load():
    rows = [Example("area?", None, {"tests": ["assert area(1) > 3", "r = area(2)\nassert approx(r, 12.566)"]},
                    "rows.jsonl:7")]
    with pytest.raises(DataError) as e:
        dataset.references_of("code", rows, "tests")
    assert "\n" not in str(e.value) and str(e.value).startswith("rows.jsonl:7: ")
    assert "test 2 judges the solution's results with 'approx', which it neither imports nor defines" in str(e.value)
    fine = [Example("area?", None, {"tests": ["assert area(1) > 3", "import math\nassert math.isclose(area(2), 12.566)",
                                              "assert sorted(roots(1, -3, 2)) == [1, 2]"]}, "rows.jsonl:8")]
    assert len(dataset.references_of("code", fine, "tests")[0]) == 3


# (c') a constant the test does not define was the solution's too: ``EPS = 1e9`` passes any tolerance.
EPS_HACK = "def area(r):\n    return 0\nEPS = 1e9\nMAX_SIZE = 10\n"


@pytest.mark.parametrize("test", [
    "assert abs(area(2) - 12.566) < EPS",
    "assert area(2) - EPS < 12.566",
    "tol = EPS\nassert abs(area(2) - 12.566) < tol",
    "import math\nassert math.isclose(area(2), 12.566, abs_tol=EPS)",
])
def test_a_constant_the_test_does_not_define_is_not_the_solutions_to_set(test):
    result = cd.run_tests(EPS_HACK, [cd.AssertTest(test)], _cfg())
    assert (result.reward, result.outcomes) == (0.0, ("error",)), result.feedback
    assert "with 'EPS'" in result.feedback or "with 'tol'" in result.feedback, result.feedback
    assert "neither imports nor defines" in result.feedback
    rows = [Example("area?", None, {"tests": ["assert area(1) > 3", test]}, "rows.jsonl:3")]
    with pytest.raises(DataError, match=r"^rows\.jsonl:3: field 'tests': test 2 judges the solution's results with '(EPS|tol)'"):
        dataset.references_of("code", rows, "tests")


# (c'') a name on the expected side was the solution's too: its `approx` / `sqrt` / `Counter` return
# what its function under test does (0), and every such test passed.
EXPECTED_SIDE_HACK = ("def area(r):\n    return 0\ndef side(a):\n    return 0\ndef count(s):\n    return 0\n"
                      "def approx(*a, **k):\n    return 0\nsqrt = Counter = approx\n")
EXPECTED_SIDE_HONEST = ("import math\nfrom collections import Counter\nfrom math import sqrt\n"
                        "def approx(x, rel=1e-3):\n    return round(x, 2)\n"
                        "def area(r):\n    return round(math.pi * r * r, 2)\ndef side(a):\n    return math.sqrt(a)\n"
                        "def count(s):\n    return Counter(s)\n")
EXPECTED_SIDE = [  # (test, the name it takes from the solution)
    ("assert area(2) == approx(12.566)", "approx"),
    ("assert side(625) == sqrt(625)", "sqrt"),
    ("assert count('abca') == Counter({'a': 2, 'b': 1, 'c': 1})", "Counter"),
    ("assert sqrt(625) == side(625)", "side"),  # the sides swapped: still two of the solution's
    ("r = side(625)\nassert r == sqrt(625)", "sqrt"),
    ("assert abs(side(625) - sqrt(625)) < 1e-9", "sqrt"),
    ("import math\nassert math.isclose(side(625), sqrt(625))", "sqrt"),
    ("assert [side(625), area(2)] == [25, approx(12.566)]", "approx"),
]


@pytest.mark.parametrize("test,name", EXPECTED_SIDE)
def test_a_name_on_the_expected_side_is_not_the_solutions_to_define(test, name):
    for program in (EXPECTED_SIDE_HACK, EXPECTED_SIDE_HONEST):
        result = cd.run_tests(program, [cd.AssertTest(test)], _cfg())
        assert (result.reward, result.outcomes) == (0.0, ("error",)), result.feedback
        assert f"judges the solution's results with {name!r}, which it neither imports nor defines" in result.feedback
    rows = [Example("area?", None, {"tests": ["assert area(1) > 3", test]}, "rows.jsonl:5")]
    with pytest.raises(DataError, match=rf"^rows\.jsonl:5: field 'tests': test 2 judges the solution's results "
                                        rf"with '{name}', which it neither imports nor defines"):
        dataset.references_of("code", rows, "tests")


def test_the_expected_side_imported_by_the_test_is_the_judges():
    tests = [cd.AssertTest("from math import sqrt\nassert side(625) == sqrt(625)"),
             cd.AssertTest("from collections import Counter\nassert count('abca') == Counter({'a': 2, 'b': 1, 'c': 1})"),
             cd.AssertTest("from pytest import approx\nassert area(2) == approx(12.566, rel=1e-3)"),
             cd.AssertTest("assert side(625) == side(625) and side(16) + side(9) == 7"),  # the same function both sides
             cd.AssertTest("assert area(2) == 12.57")]
    assert cd.run_tests(EXPECTED_SIDE_HONEST, tests, _cfg()).reward == 1.0
    assert cd.run_tests(EXPECTED_SIDE_HACK, tests, _cfg()).outcomes == ("fail",) * 5


def test_a_constant_checked_against_the_tests_own_value_is_the_solutions_answer():
    honest = [cd.AssertTest("assert MAX_SIZE == 10"), cd.AssertTest("EPS = 1e-3\nassert abs(area(2) - 12.566) < EPS")]
    assert cd.run_tests(EPS_HACK, honest, _cfg()).outcomes == ("pass", "fail")
    assert cd.run_tests(AREA + "MAX_SIZE = 10\n", honest, _cfg()).reward == 1.0


# (d) SysV shared memory: 5 x 300 MB, touched and detached, outlived the run without an IPC namespace.
# (Where a memory cgroup caps the sandbox, 5 x 300 MB no longer fit: tests/tasks/test_sandbox_reliability.py;
# here 5 x 150 MB, within its limit at the default memory_mb.)
SHARED_MEMORY = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
made = 0
def make(count, mb):
    global made
    for _ in range(count):
        shmid = libc.shmget(0, mb << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
        addr = libc.shmat(shmid, None, 0) if shmid >= 0 else None
        if addr in (None, ctypes.c_void_p(-1).value):
            break
        ctypes.memset(addr, 1, mb << 20)
        libc.shmdt(ctypes.c_void_p(addr))
        made += 1
    return made
make(5, 150)
"""


def _shared_memory_segments() -> set[tuple[str, str]]:
    """(shmid, size) of every SysV shared memory segment of the host's IPC namespace."""
    with open("/proc/sysvipc/shm") as f:
        return {tuple(line.split()[1:4:2]) for line in list(f)[1:]}


@pytest.mark.skipif(not cd.namespaces_available(), reason="'unshare --user --net --pid --ipc' is not usable here")
def test_shared_memory_of_the_program_is_released_after_the_run():
    before = _shared_memory_segments()
    result = cd.run_tests(SHARED_MEMORY, [cd.AssertTest("assert made == 5")], _cfg())
    assert result.outcomes == ("pass",), result.feedback  # 750 MB were made and touched
    assert _shared_memory_segments() - before == set()


# (d) the runner shares the judge's uid: it could prlimit the judge (memory 1.5 GB -> 300 MB, files -> 64).
PRLIMIT = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
class Limit(ctypes.Structure):
    _fields_ = [("cur", ctypes.c_uint64), ("max", ctypes.c_uint64)]
def prlimit(pid, resource, value):
    ok = libc.prlimit(pid, resource, ctypes.byref(Limit(value, value)), None) == 0
    return ok, 0 if ok else ctypes.get_errno()
judge = os.getppid()
judge_memory = prlimit(judge, 9, 300 << 20)  # RLIMIT_AS
judge_files = prlimit(judge, 7, 64)  # RLIMIT_NOFILE
own_files = prlimit(0, 7, 64)
"""


@pytest.mark.skipif(not cd.process_filter_available(), reason=f"no seccomp filter for {os.uname().machine}")
def test_the_runner_cannot_change_the_judges_limits():
    tests = [cd.AssertTest("assert judge_memory == (False, errno.EPERM)"),
             cd.AssertTest("assert judge_files == (False, errno.EPERM)"),
             cd.AssertTest("assert own_files == (True, 0)")]  # its own limits it may lower
    result = cd.run_tests(PRLIMIT, tests, _cfg())
    assert result.outcomes == ("pass",) * 3, result.feedback


# (d) 1000 files of 1 MB each put 1 GB in /tmp: only the size of one file was capped.
FILL_SCRATCH = """
import errno
written, full = 0, None
for i in range(1000):
    try:
        with open(f"f{i}", "wb") as f:
            f.write(b"x" * 1_000_000)
        written += 1_000_000
    except OSError as e:
        full = errno.errorcode[e.errno]
        break
"""


@pytest.mark.skipif(not cd.namespaces_available(), reason="'unshare --user --mount' is not usable here")
def test_the_scratch_directory_as_a_whole_is_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    tests = [cd.AssertTest("assert full == 'ENOSPC'"), cd.AssertTest("assert 8_000_000 <= written <= 16 << 20")]
    result = cd.run_tests(FILL_SCRATCH, tests, _cfg(scratch_mb=16))
    assert result.outcomes == ("pass", "pass"), result.feedback
    assert list(tmp_path.iterdir()) == []
    many = "made = 0\nwhile made < 5000:\n    open(f'e{made}', 'w').close()\n    made += 1\n"
    result = cd.run_tests(many, [cd.AssertTest("assert made == 5000")], _cfg(scratch_files=1000))
    assert result.outcomes == ("error",) and "No space left on device" in result.feedback, result.feedback


# (d) six tests of 4.8 s each under a 5 s limit took 29 s: no budget per response or per batch.
SLOW = "import time\ndef f(x):\n    time.sleep(2.5)\n    return x\n"
SLOW_TESTS = [cd.AssertTest(f"assert f({k}) == {k}") for k in range(6)]


def test_a_response_gets_its_budget_and_what_is_unchecked_scores_0():
    start = time.monotonic()
    result = cd.run_tests(SLOW, SLOW_TESTS, _cfg(timeout_s=3.0, response_budget_s=4.0))
    assert time.monotonic() - start < 4.0 + 3.0  # not 6 x 2.5 s
    assert result.outcomes == ("pass",) + ("not_run",) * 5 and result.unscored, result.feedback
    assert result.reward == 1 / 6 and "time budget ran out" in result.feedback
    io = cd.run_tests("import time\ntime.sleep(2.5)\nprint(1)", [cd.IOTest("", "1")] * 3,
                      _cfg(timeout_s=3.0, response_budget_s=4.0))
    assert io.outcomes == ("pass", "not_run", "not_run") and io.unscored, io.feedback
    assert not cd.run_tests(ADD_ONE, [cd.AssertTest("assert f(1) == 2")], _cfg()).unscored


ADD_ONE = "def f(x):\n    return x + 1\n"


def test_a_batch_gets_its_budget_and_what_is_unchecked_scores_0():
    responses = ["```python\n" + SLOW + "```"] * 3
    start = time.monotonic()
    results = cd.score_code_batch(responses, [SLOW_TESTS[:1]] * 3, _cfg(timeout_s=3.0, batch_budget_s=4.0))
    assert time.monotonic() - start < 4.0 + 3.0  # not 3 x 2.5 s
    assert [(r.reward, r.unscored) for r in results] == [(1.0, False), (0.0, True), (0.0, True)]


# The children run as `python -I child.py`: the package's modules come from its own directory only.
WHAT_THE_RUNNER_IMPORTS = """
import os, sys
os.makedirs("pipo_jax/tasks/code", exist_ok=True)  # a package of its own in the scratch directory
code = sys.modules["pipo_jax.tasks.code"]
paths = list(code.__path__)
reexports = hasattr(code, "run_tests")  # the package's __init__ never ran
on_path = [p for p in sys.path if p in ("", ".", os.getcwd()) or os.path.isdir(os.path.join(p, "pipo_jax"))]
"""


def test_the_children_import_the_package_from_its_directory_only():
    here = os.path.dirname(cd.__file__)
    tests = [cd.AssertTest(f"assert paths == [{here!r}]"), cd.AssertTest("assert reexports is False"),
             cd.AssertTest("assert on_path == []")]
    result = cd.run_tests(WHAT_THE_RUNNER_IMPORTS, tests, _cfg())
    assert result.outcomes == ("pass",) * 3, result.feedback
