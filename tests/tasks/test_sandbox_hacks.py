"""The code sandbox's known reward hacks, each as the program a policy could
write, each scoring 0 now. Before the judge / runner split each of the three scored 1.0 on
these very tests, including ``add(2, 2) == 5``, which no correct program passes: (a) forged
"pass" records on the report fd, then ``os._exit(0)``; (b) an object whose ``__eq__`` is
always True; (c) walking ``sys._getframe`` up to the harness to read the tests and expected
values. Honest programs still score what they earn. Also: a fork bomb as root is bounded, and
a run without a network namespace is refused unless ``allow_network``."""

import os
import re
import time
from decimal import Decimal
from fractions import Fraction

import pytest

from pipo_jax.tasks import code as cd
from tests.tasks.test_code import processes_named
from tests.typed import task_of

SANDBOX_REFUSAL_TESTED = True  # tests/conftest.py: the network refusal is tested here

NO_LANDLOCK = cd.landlock_abi() == 0
ASSERTS = [cd.AssertTest("assert add(1, 2) == 3"), cd.AssertTest("assert add(2, 2) == 5")]
CALLS = [cd.CallTest("add", (1, 2), 3), cd.CallTest("add", (2, 2), 5)]
ADD = "def add(a, b):\n    return a + b\n"


def _cfg(**kw) -> cd.SandboxConfig:
    kw.setdefault("allow_network", not cd.namespaces_available())
    return cd.SandboxConfig(timeout_s=3.0, startup_s=10.0, allow_unconfined=NO_LANDLOCK, **kw)


# (a) forge "pass" records on every fd the program holds (the old report fd among them), exit.
FORGE = """
import json, os
for fd in range(3, 64):
    for i in range(-1, 64):
        try:
            os.write(fd, (json.dumps({"i": i, "outcome": "pass", "msg": ""}) + "\\n").encode())
        except OSError:
            break
os._exit(0)
"""

# (b) an answer equal to everything.
ALWAYS_EQUAL = """
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
def add(a, b):
    return Anything()
"""

# (c) read the tests and expected values from the harness's frames (its spec: a dict with "tests").
FRAME_WALK = """
import ast, sys
def add(a, b):
    f = sys._getframe(1)
    while f is not None:
        for value in list(f.f_locals.values()) + list(f.f_globals.values()):
            tests = value.get("tests") if isinstance(value, dict) else None
            for t in tests if isinstance(tests, list) else ():
                if not isinstance(t, dict):
                    continue
                if t.get("kind") == "call" and list(t.get("args")) == [a, b]:
                    return t["expected"]
                if t.get("kind") == "assert":
                    test = ast.parse(t["source"]).body[0].test
                    if [ast.literal_eval(x) for x in test.left.args] == [a, b]:
                        return ast.literal_eval(test.comparators[0])
        f = f.f_back
    return None
"""


@pytest.mark.parametrize("tests", [ASSERTS, CALLS], ids=["assert", "call"])
@pytest.mark.parametrize("program", [FORGE, ALWAYS_EQUAL, FRAME_WALK], ids=["forged_records", "always_equal",
                                                                           "frame_walk"])
def test_each_reward_hack_scores_zero(program, tests):
    r = cd.run_tests(program, tests, _cfg())
    assert r.reward == 0.0 and "pass" not in r.outcomes, r


@pytest.mark.parametrize("tests", [ASSERTS, CALLS], ids=["assert", "call"])
def test_the_honest_program_scores_what_it_earns(tests):
    r = cd.run_tests(ADD, tests, _cfg())
    assert (r.reward, r.outcomes) == (0.5, ("pass", "fail"))


def test_what_each_hack_is_told():
    forged = cd.run_tests(FORGE, ASSERTS, _cfg())
    assert forged.feedback == "The solution itself crashed (exited with status 0) before any test ran."
    equal = cd.run_tests(ALWAYS_EQUAL, ASSERTS + CALLS, _cfg())
    assert equal.outcomes == ("error", "error", "fail", "fail")
    assert equal.feedback.startswith("Test 1 raised TypeError: the solution's Anything object is not plain data")
    walk = cd.run_tests(FRAME_WALK, CALLS, _cfg())
    assert walk.feedback == "Test 1 failed: add(1, 2) returned None, expected 3"


GC_SEARCH = """
import gc, re, sys
def guess(prefix):
    seen, todo = set(), [o for o in gc.get_objects() if isinstance(o, (dict, list, tuple))]
    f = sys._getframe(1)
    while f is not None:
        todo += [f.f_locals, f.f_globals, f.f_code.co_consts]
        f = f.f_back
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, str):
            found = [s for s in re.findall(re.escape(prefix) + r"[0-9]+", o)]
            if found:
                return found[0]
        elif isinstance(o, dict):
            todo += list(o.values())
        elif isinstance(o, (list, tuple)):
            todo += list(o)
    return "not found"
"""


def test_the_expected_values_are_nowhere_in_the_runners_memory():
    """Every container the garbage collector knows of in the runner, every frame above the
    call, searched through for an expected value (a string that appears nowhere else): none
    is there. (In the harness before the split this search found them.)"""
    tests = [cd.CallTest("guess", ("pipo-secret-",), "pipo-secret-4711"),
             cd.AssertTest("assert guess('pipo-secret-') == 'pipo-secret-2718'")]
    r = cd.run_tests(GC_SEARCH, tests, _cfg())
    assert r.outcomes == ("fail", "fail")
    assert r.feedback == "Test 1 failed: guess('pipo-secret-') returned 'not found', expected 'pipo-secret-4711'"


@pytest.mark.parametrize("program,test", [
    # the test's builtins are the judge's: a solution's `set` does not reach it
    ("set = lambda *a: 0\ndef pairs(n):\n    return 0\n", "assert set(pairs(4)) == set([(1, 3), (2, 2)])"),
    # a standard-library module name is the judge's module, whatever the solution bound to it
    ("class M:\n    isclose = staticmethod(lambda *a, **k: True)\nmath = M()\ndef area(r):\n    return 0\n",
     "assert math.isclose(area(2), 12.566, rel_tol=1e-3)"),
    # `in` compares plain data here, never the solution's __contains__
    ("class C:\n    def __contains__(self, x):\n        return True\ndef pairs(n):\n    return C()\n",
     "assert (1, 3) in pairs(4)"),
    # nor its ordering
    ("class C:\n    def __lt__(self, x):\n        return True\n    __gt__ = __lt__\ndef area(r):\n    return C()\n",
     "assert 12.5 < area(2) < 12.6"),
])
def test_a_solution_cannot_redefine_what_the_tests_compare_with(program, test):
    r = cd.run_tests(program, [cd.AssertTest(test)], _cfg())
    assert r.outcomes != ("pass",), r


HONEST = """
import math
from collections import Counter

def pairs(n):
    return [(a, n - a) for a in range(1, n // 2 + 1)]

def area(r):
    return math.pi * r * r

def gen(n):
    yield from range(n)

def div(a, b):
    return a / b

def fact(n):
    return math.prod(range(1, n + 1))

def odd():
    return {(1, 2): b"\\x00\\xff", "inf": float("inf"), "f": frozenset({1})}

def letters(s):
    return Counter(s)

def string(n):
    return str(n)

class Stack:
    def __init__(self):
        self.items = []
    def push(self, x):
        self.items.append(x)
    def pop(self):
        return self.items.pop()
    def __len__(self):
        return len(self.items)
    def __str__(self):
        return "Stack" + str(self.items)
"""


@pytest.mark.parametrize("test", [
    "assert set(pairs(4)) == {(1, 3), (2, 2)}",
    "assert pairs(4) == [(1, 3), (2, 2)]",
    "assert math.isclose(area(2), 12.566, rel_tol=1e-3)",
    "assert 12.5 < area(2) < 12.6",
    "assert (1, 3) in pairs(4)",
    "assert list(gen(3)) == [0, 1, 2] and sum(x * x for x in gen(3)) == 5",
    "try:\n    div(1, 0)\nexcept ZeroDivisionError:\n    pass\nelse:\n    assert False",
    "assert fact(30) == 265252859812191058636308480000000",
    "assert odd() == {(1, 2): b'\\x00\\xff', 'inf': float('inf'), 'f': frozenset({1})}",
    "assert letters('abca') == {'a': 2, 'b': 1, 'c': 1}",
    "s = Stack()\ns.push(1)\ns.push(2)\nassert s.pop() == 2 and len(s) == 1 and str(s) == 'Stack[1]'",
    "assert all(div(2 * i, 2) == i for i in range(1, 4))",
    "assert string(5) == '5'",  # the solution's function named like a standard-library module
    # HumanEval's form: a check function of the test's own, given the solution's function
    "METADATA = {'author': 'x'}\n\ndef check(candidate):\n    assert candidate(4) == [(1, 3), (2, 2)]\n"
    "    assert abs(area(1) - 3.14159) < 1e-5\n\ncheck(pairs)",
])
def test_honest_solutions_pass_every_kind_of_assert_test(test):
    r = cd.run_tests(HONEST, [cd.AssertTest(test)], _cfg())
    assert r.outcomes == ("pass",), r.feedback


def test_numpy_fraction_and_decimal_answers_arrive_as_their_values():
    code = ("import numpy as np\nfrom fractions import Fraction\nfrom decimal import Decimal\n"
            "def f():\n    return [np.int64(3), np.float64(0.5), np.arange(2), Fraction(1, 3), Decimal('0.1')]\n")
    tests = [cd.AssertTest("from fractions import Fraction\nfrom decimal import Decimal\n"
                           "assert f() == [3, 0.5, [0, 1], Fraction(1, 3), Decimal('0.1')]"),
             cd.CallTest("f", (), [3, 0.5, [0, 1], 1 / 3, 0.1])]
    r = cd.run_tests(code, tests, _cfg())
    assert r.outcomes == ("pass", "fail"), r.feedback  # the Fraction 1/3 is not the float 1/3: types arrive intact


def test_a_solution_error_is_the_tests_error_and_partial_scores_are_fractions():
    tests = [cd.AssertTest("assert div(4, 2) == 2"), cd.AssertTest("assert div(1, 0) == 0"),
             cd.CallTest("div", (9, 3), 3), cd.CallTest("fact", (5,), 121)]
    r = cd.run_tests(HONEST, tests, _cfg())
    assert (r.reward, r.outcomes) == (0.5, ("pass", "error", "pass", "fail"))
    assert r.feedback == "Test 2 raised ZeroDivisionError: division by zero (solution line 15)"


def test_plain_data_round_trips_and_nothing_else_decodes():
    value = [None, True, -(2**200), 0.1, float("inf"), 1j, Fraction(1, 3), Decimal("0.1"), "é", b"\x00", (1, [2]),
             {3}, frozenset({4}), {(1, 2): {"k": None}}]
    def refuse(v):
        raise ValueError("a handle")
    encoded = cd._encode(value, lambda x: (_ for _ in ()).throw(cd.NotPlain(type(x).__name__)))
    decoded = cd._decode(encoded, refuse)
    assert decoded == value and [type(v) for v in decoded] == [type(v) for v in value]
    nan = cd._decode(cd._encode(float("nan"), None), refuse)
    assert nan != nan
    with pytest.raises(cd.NotPlain):
        cd._encode([object()], lambda x: (_ for _ in ()).throw(cd.NotPlain("object")))
    for bad in (["i", 5], ["i", "zz"], ["l", "x"], ["d", [[1]]], ["S", [["l", []]]], ["x"], [], "n",
                ["h", 0, "T"], ["s"], ["f", "nope"]):
        with pytest.raises(ValueError):
            cd._decode(bad, refuse)


BOUNDS = ["as configured"] + (["seccomp"] if cd.check_process_bound(cd.SandboxConfig()) == "cgroup" else [])


def _bomb(name: str, start: str) -> str:
    """A program that starts up to 300 processes or threads (``start``: a statement that is
    true when one started), each pausing forever, and returns how many it got. The loop stops
    at 300, so a broken bound cannot hurt the machine."""
    return ("import ctypes\n"
            "def bomb():\n"
            "    libc = ctypes.CDLL(None)\n"
            "    pause = ctypes.cast(libc.pause, ctypes.c_void_p)\n"
            "    attr = ctypes.create_string_buffer(128)\n"
            "    libc.pthread_attr_init(attr)\n"
            "    libc.pthread_attr_setstacksize(attr, ctypes.c_size_t(1 << 16))\n"
            "    n = 0\n"
            "    while n < 300:\n"
            f"        if not ({start}):\n"
            "            break\n"
            "        n += 1\n"
            "    return n\n"
            "def child():\n"
            "    pid = ctypes.CDLL(None).fork()\n"
            "    if pid == 0:\n"
            f"        ctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)\n"
            "        while True:\n"
            "            ctypes.CDLL(None).pause()\n"
            "    return pid > 0\n")


def _started(code: str, config: cd.SandboxConfig) -> int:
    start = time.monotonic()
    r = cd.run_tests(code, [cd.CallTest("bomb", (), 300)], config)
    assert time.monotonic() - start < config.startup_s + 2 * config.timeout_s
    assert r.outcomes == ("fail",), r.feedback
    return int(re.search(r"returned (\d+)", r.feedback).group(1))


@pytest.mark.parametrize("bound", BOUNDS)
def test_a_fork_bomb_is_bounded(bound, monkeypatch):
    """A ctypes fork loop (the audit hook does not see it) that wants 300 processes: it gets at
    most ``max_processes``: RLIMIT_NPROC, or where Linux ignores that (root) a pids cgroup, or
    where none can be made ("seccomp": as in a container) none at all. The run ends in time,
    every process it made is gone, and so is the cgroup."""
    if bound == "seccomp":
        monkeypatch.setattr(cd, "pids_cgroup_parent", lambda: None)
    name = f"pipofb{os.getpid() % 100000}"
    config = _cfg(max_processes=16, audit_hook=False)
    forks = _started(_bomb(name, "child()"), config)
    assert forks == 0 if cd.check_process_bound(config) == "seccomp" else 0 < forks <= 16
    assert processes_named(name) == []
    parent = cd.pids_cgroup_parent()
    assert parent is None or not [d for d in os.listdir(parent) if d.startswith(f"pipo_sandbox_{os.getpid()}_")]


def test_as_root_with_no_way_to_bound_processes_the_sandbox_refuses(monkeypatch):
    monkeypatch.setattr(cd, "nproc_exempt", lambda: True)
    monkeypatch.setattr(cd, "pids_cgroup_parent", lambda: None)
    assert cd.check_process_bound(_cfg()) == "seccomp"
    assert cd.check_process_bound(_cfg(max_processes=0)) == "none"
    monkeypatch.setattr(cd, "process_filter_available", lambda: False)  # as on a machine it has no numbers for
    with pytest.raises(cd.SandboxUnavailable, match=r"a fork bomb would be unbounded; set .*max_processes=0"):
        cd.run_tests(ADD, ASSERTS[:1], _cfg())
    assert cd.run_tests(ADD, ASSERTS[:1], _cfg(max_processes=0)).outcomes == ("pass",)


@pytest.mark.skipif(cd.check_process_bound(cd.SandboxConfig()) not in ("nproc", "cgroup"),
                    reason="as root without a pids cgroup threads are bounded by the memory limit only")
def test_a_thread_bomb_is_bounded():
    """Threads with 64 KiB stacks, started through libc: RLIMIT_NPROC and a pids cgroup count
    threads too."""
    start = "libc.pthread_create(ctypes.byref(ctypes.c_ulong()), attr, pause, None) == 0"
    assert 0 < _started(_bomb("unused", start), _cfg(max_processes=16, audit_hook=False)) <= 16


@pytest.mark.skipif(not cd.nproc_exempt(), reason="the seccomp filter is used where RLIMIT_NPROC does not bind")
def test_as_root_threads_still_work():
    """The competitive-programming idiom of a deep recursion in a thread with a big stack."""
    code = ("import sys, threading\n"
            "def depth(n):\n"
            "    return 0 if n == 0 else 1 + depth(n - 1)\n"
            "def deep(n):\n"
            "    sys.setrecursionlimit(n + 100)\n"
            "    threading.stack_size(64 << 20)\n"
            "    out = []\n"
            "    t = threading.Thread(target=lambda: out.append(depth(n)))\n"
            "    t.start()\n"
            "    t.join()\n"
            "    return out[0]\n")
    r = cd.run_tests(code, [cd.CallTest("deep", (20000,), 20000)], _cfg())
    assert r.outcomes == ("pass",), r.feedback


def test_no_network_namespace_is_refused_unless_allowed(monkeypatch):
    monkeypatch.setattr(cd, "namespaces_available", lambda: False)  # as where unshare is unusable
    tests = ASSERTS[:1]
    with pytest.raises(cd.SandboxUnavailable, match=r"off the network: 'unshare.*allow_network=True"):
        cd.run_tests(ADD, tests, _cfg(allow_network=False))
    with pytest.raises(cd.SandboxUnavailable, match="network='namespace' but"):
        cd.run_tests(ADD, tests, _cfg(network="namespace", allow_network=True))
    assert cd.run_tests(ADD, tests, _cfg(allow_network=True)).outcomes == ("pass",)


def test_the_audit_mode_needs_allow_network():
    with pytest.raises(cd.SandboxUnavailable, match=r"network='audit' runs it without a network namespace"):
        cd.run_tests(ADD, ASSERTS[:1], _cfg(network="audit", allow_network=False))
    assert cd.run_tests(ADD, ASSERTS[:1], _cfg(network="audit", allow_network=True)).outcomes == ("pass",)


def test_a_code_task_without_network_namespaces_is_a_config_error(monkeypatch):
    from configs import grpo
    from pipo_jax.rl.spec import ConfigError

    monkeypatch.setattr(cd, "namespaces_available", lambda: False)
    c = grpo.get_config("micro")
    c.task.name, c.model.path, c.task.dataset.path = "code", "/nonexistent", "x.jsonl"
    c.log.jit_loop, c.warmup.enabled, c.rollout.max_new_tokens = False, False, 16
    c.task.code.sandbox_allow_unconfined = NO_LANDLOCK
    with pytest.raises(ConfigError, match=r"config\.task\.code\.sandbox_allow_network: the code sandbox cannot keep"):
        task_of(c)  # before any file is read
    c.task.code.sandbox_allow_network = True
    with pytest.raises(ConfigError) as e:
        task_of(c)  # past the sandbox checks, to the missing tokenizer
    assert "sandbox" not in str(e.value)


def test_a_runner_that_exits_is_no_exception_a_test_can_catch():
    """A test that expects an exception (``except Exception``): exiting the process instead
    is a crash, never the awaited exception."""
    test = cd.AssertTest("try:\n    add(-1, 0)\nexcept Exception:\n    pass\nelse:\n    assert False")
    exits = cd.run_tests("import os\ndef add(a, b):\n    os._exit(0)\n", [test], _cfg())
    assert (exits.outcomes, exits.feedback) == (("crash",), "Test 1 crashed (exited with status 0)")
    raises = cd.run_tests("def add(a, b):\n    raise ValueError('negative')\n", [test], _cfg())
    assert raises.outcomes == ("pass",)


def test_the_program_holds_no_fd_but_stdio_and_its_two_pipes():
    """The channel the results come from (the judge's report fd) is not among the runner's
    fds: besides stdin / stdout / stderr it holds the judge's request and reply pipes only."""
    code = ("import os, stat\n"
            "def fds():\n"
            "    out = []\n"
            "    for fd in range(3, 1024):\n"
            "        try:\n"
            "            out.append(stat.S_ISFIFO(os.fstat(fd).st_mode))\n"
            "        except OSError:\n"
            "            pass\n"
            "    return out\n")
    r = cd.run_tests(code, [cd.CallTest("fds", (), [True, True])], _cfg())
    assert r.outcomes == ("pass",), r.feedback


def test_an_exception_that_cannot_be_printed_is_an_error_and_the_run_goes_on():
    code = ("class E(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\n"
            "def add(a, b):\n    if a < 0:\n        raise E()\n    return a + b\n")
    r = cd.run_tests(code, [cd.AssertTest("assert add(-1, 2) == 1"), cd.AssertTest("assert add(1, 2) == 3")], _cfg())
    assert (r.outcomes, r.feedback) == (("error", "pass"), "Test 1 raised E: <unprintable> (solution line 6)")
