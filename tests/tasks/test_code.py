"""Code sandbox: extraction, test specs, pass/fail/timeout/memory/crash/fork/network."""
import os
import socket
import threading
import time

import pytest

from pipo_jax.tasks import code as cd

CFG = cd.SandboxConfig(timeout_s=1.0, startup_s=5.0)
ADD_TESTS = [cd.AssertTest("assert add(1, 2) == 3"), cd.AssertTest("assert add(2, 2) == 5"),
             cd.AssertTest("assert add(0, 0) == 0")]
ADD = "def add(a, b):\n    return a + b\n"


# ---------------------------------------------------------------- extraction and specs

@pytest.mark.parametrize("text,expected", [
    ("Here:\n```python\nx = 1\n```\ndone", "x = 1\n"),
    ("```py\na\n```\nthen\n```python3\nb\n```", "b\n"),
    ("```python\nfirst\n```\n```\nplain\n```", "first\n"),  # a labelled block wins
    ("```\nplain\n```", "plain\n"),
    ("```bash\nls\n```", None),
    ("```python\ndef f():\n    return 1", "def f():\n    return 1"),  # truncated response
    ("no code", None),
    ("```python\n\n```", None),
])
def test_extract_python_code(text, expected):
    assert cd.extract_python_code(text) == expected


def test_tests_from_spec_formats_and_errors():
    assert cd.tests_from_spec(["assert f(1) == 2"]) == [cd.AssertTest("assert f(1) == 2")]
    assert cd.tests_from_spec('{"inputs": ["1 2\\n", ["3", "4"]], "outputs": ["3\\n", ["7"]]}') == [
        cd.IOTest("1 2\n", "3\n"), cd.IOTest("3\n4\n", "7\n")]
    assert cd.tests_from_spec([{"input": "x", "output": "y"}]) == [cd.IOTest("x", "y")]
    assert cd.tests_from_spec({"fn_name": "f", "inputs": [[1, 2], 3], "outputs": [[3], 4]}) == [
        cd.CallTest("f", (1, 2), [3]), cd.CallTest("f", (3,), 4)]
    with pytest.raises(ValueError, match="2 inputs but 1 outputs"):
        cd.tests_from_spec({"inputs": [1, 2], "outputs": [1]})
    with pytest.raises(ValueError, match="needs 'inputs' and 'outputs'"):
        cd.tests_from_spec({"input": []})
    with pytest.raises(ValueError, match="not JSON"):
        cd.tests_from_spec("{oops")
    with pytest.raises(ValueError, match="unrecognised"):
        cd.tests_from_spec([1, 2])


def test_same_comparison_rules():
    assert cd._same((1, 2), [1, 2])
    assert cd._same([[1, (2, 3)]], [[1, [2, 3]]])
    assert cd._same(0.1 + 0.2, 0.3)
    assert not cd._same(0.31, 0.3)
    assert cd._same(5, [5])  # APPS wraps single outputs in a list
    assert not cd._same([5], 5)
    assert not cd._same("1", 1)


# ---------------------------------------------------------------- assert / call tests

def test_partial_pass_reward_and_assert_feedback():
    r = cd.run_tests(ADD, ADD_TESTS, CFG)
    assert (r.reward, r.passed, r.total) == (pytest.approx(2 / 3), 2, 3)
    assert r.outcomes == ("pass", "fail", "pass")
    assert r.feedback == "Test 2 failed: assert add(2, 2) == 5 -- got 4"
    ok = cd.run_tests(ADD, [ADD_TESTS[0], ADD_TESTS[2]], CFG)
    assert (ok.reward, ok.feedback) == (1.0, "All tests passed.")


def test_plain_assert_message_and_multi_statement_test():
    tests = [cd.AssertTest("x = add(1, 1)\nassert x > 5, 'too small'"), cd.AssertTest("assert add(1, 1) in (2, 3)")]
    r = cd.run_tests(ADD, tests, CFG)
    assert r.outcomes == ("fail", "pass")
    assert r.feedback == "Test 1 failed: x = add(1, 1)\nassert x > 5, 'too small' -- too small"


def test_runtime_error_names_solution_line():
    r = cd.run_tests("def add(a, b):\n    return a + c\n", ADD_TESTS, CFG)
    assert r.outcomes == ("error",) * 3 and r.reward == 0.0
    assert r.feedback == "Test 1 raised NameError: name 'c' is not defined (solution line 2)"


def test_syntax_error_and_exit_in_solution():
    r = cd.run_tests("def add(a, b)\n    return a + b\n", ADD_TESTS, CFG)
    assert r.outcomes == ("error",) * 3
    assert r.feedback == "The solution itself raised SyntaxError: expected ':' (solution line 1) before any test ran."
    r = cd.run_tests("import sys\nsys.exit(0)\n", ADD_TESTS, CFG)
    assert r.feedback == "The solution itself raised SystemExit(0) before any test ran."


def test_timeout_in_one_test_does_not_stop_the_others():
    code = ADD + "def spin():\n    while True:\n        pass\n"
    r = cd.run_tests(code, [cd.AssertTest("assert spin() == 1"), cd.AssertTest("assert add(1, 1) == 2")], CFG)
    assert r.outcomes == ("timeout", "pass") and r.reward == 0.5
    assert r.feedback == "Test 1 timed out (limit 1 s)"


def test_timer_swallowing_program_is_killed_by_the_parent():
    code = ("import time\ndef add(a, b):\n    while True:\n        try:\n            time.sleep(100)\n"
            "        except BaseException:\n            pass\n")
    cfg = cd.SandboxConfig(timeout_s=0.5, startup_s=2.0)
    start = time.monotonic()
    r = cd.run_tests(code, ADD_TESTS[:2], cfg)
    assert time.monotonic() - start < 30
    assert r.outcomes == ("timeout", "not_run")
    assert r.feedback == "Test 1 timed out (limit 0.5 s)"


def test_top_level_infinite_loop():
    r = cd.run_tests("while True:\n    pass\n", ADD_TESTS, CFG)
    assert r.outcomes == ("timeout",) * 3
    assert r.feedback == "The solution itself timed out (limit 1 s) before any test ran."


def test_memory_hungry_program_gets_memory_error_and_recovers():
    code = ADD + "def hog():\n    return len(bytearray(8 * 2**30))\n"
    r = cd.run_tests(code, [cd.AssertTest("assert hog() == 1"), cd.AssertTest("assert add(1, 1) == 2")],
                     cd.SandboxConfig(timeout_s=2.0, memory_mb=512))
    assert r.outcomes == ("error", "pass")
    assert r.feedback == "Test 1 raised MemoryError (solution line 4)"


def test_crashing_programs():
    segv = cd.run_tests("import ctypes\ndef add(a, b):\n    return ctypes.string_at(0)\n", ADD_TESTS, CFG)
    assert segv.outcomes == ("crash", "not_run", "not_run")
    assert segv.feedback == "Test 1 crashed (SIGSEGV)"
    exits = cd.run_tests("import os\ndef add(a, b):\n    os._exit(3)\n", ADD_TESTS, CFG)
    assert exits.feedback == "Test 1 crashed (exited with status 3)"
    assert exits.reward == 0.0


def test_output_flood_hits_the_file_size_limit():
    code = "def add(a, b):\n    while True:\n        print('x' * 10000)\n"
    r = cd.run_tests(code, ADD_TESTS[:1], cd.SandboxConfig(timeout_s=5.0, max_output_bytes=100_000))
    assert r.outcomes == ("error",)
    assert r.feedback.startswith("Test 1 raised output limit exceeded")


def test_fork_bomb_is_blocked():
    code = "import os\ndef add(a, b):\n    while True:\n        os.fork()\n"
    r = cd.run_tests(code, ADD_TESTS[:1], CFG)
    assert r.feedback == "Test 1 raised PermissionError: os.fork is not allowed in the sandbox (solution line 4)"
    sub = cd.run_tests("import subprocess\ndef add(a, b):\n    subprocess.run(['true'])\n", ADD_TESTS[:1], CFG)
    assert "subprocess.Popen is not allowed" in sub.feedback


@pytest.mark.parametrize("network", ["audit", "namespace"])
def test_stray_child_processes_are_killed(network):
    """A child forked below the audit hook (via libc) dies with the run. The program
    passes only once the child has named itself (a pipe says so); afterwards no process
    of that name is left (the file system outside the scratch directory is closed to it,
    so /proc is how the test sees it). ``max_processes=0``: no process cap, so that as root
    (where the cap may be a seccomp filter allowing no process) the child can start."""
    if network == "namespace" and not cd.namespaces_available():
        pytest.skip("unshare with user/net/pid namespaces is not usable here")
    name = f"pipostray{os.getpid() % 100000}"
    code = (
        "import ctypes, os, time\n"
        "def add(a, b):\n"
        "    r, w = os.pipe()\n"
        "    libc = ctypes.CDLL(None)\n"
        "    if libc.fork() == 0:\n"
        f"        libc.prctl(15, {name.encode()!r}, 0, 0, 0)\n"
        "        os.write(w, b'x')\n"
        "        while True:\n"
        "            time.sleep(0.02)\n"
        "    return a + b if os.read(r, 1) == b'x' else -1\n")
    r = cd.run_tests(code, ADD_TESTS[:1], cd.SandboxConfig(timeout_s=5.0, network=network, max_processes=0,
                                                           allow_network=network == "audit"))
    assert r.outcomes == ("pass",)  # the stray child did run
    assert processes_named(name) == []  # and is gone


def processes_named(name: str) -> list[int]:
    """Pids whose /proc/<pid>/comm is `name`."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == name:
                    out.append(int(pid))
        except OSError:
            pass
    return out


def _listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    hits = []

    def accept():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not hits:
            try:
                conn, _ = srv.accept()
                hits.append(1)
                conn.close()
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    return srv, hits, t


def _connect_code(port):
    return ("import socket\n"
            "def add(a, b):\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
            "    return a + b\n")


def test_network_blocked_by_audit_hook_and_reachable_without_it():
    srv, hits, t = _listener()
    port = srv.getsockname()[1]
    blocked = cd.run_tests(_connect_code(port), ADD_TESTS[:1],
                           cd.SandboxConfig(timeout_s=3.0, network="audit", allow_network=True))
    assert blocked.outcomes == ("error",) and "PermissionError" in blocked.feedback
    assert hits == []
    # Control: with neither guard the same program does reach the listener.
    open_run = cd.run_tests(_connect_code(port), ADD_TESTS[:1],
                            cd.SandboxConfig(timeout_s=3.0, network="audit", audit_hook=False, allow_network=True))
    t.join()
    srv.close()
    assert open_run.outcomes == ("pass",) and hits == [1]


def test_network_namespace_without_audit_hook():
    if not cd.namespaces_available():
        pytest.skip("unshare with user/net/pid namespaces is not usable here")
    srv, hits, t = _listener()
    port = srv.getsockname()[1]
    r = cd.run_tests(_connect_code(port), ADD_TESTS[:1],
                     cd.SandboxConfig(timeout_s=3.0, network="namespace", audit_hook=False))
    srv.close()
    assert r.outcomes == ("error",) and "OSError" in r.feedback  # unreachable in the namespace
    assert hits == []


def test_solution_cannot_read_the_spec_from_stdin():
    code = "import sys\nLEAK = sys.stdin.read() + open(0).read()\n"
    r = cd.run_tests(code, [cd.AssertTest("assert LEAK == ''")], CFG)
    assert r.outcomes == ("pass",)


def test_call_tests_with_solution_class_and_wrapped_outputs():
    spec = {"fn_name": "twoSum", "inputs": [[[2, 7, 11], 9], [[1, 1], 3]], "outputs": [[[0, 1]], [[0, 2]]]}
    code = "class Solution:\n    def twoSum(self, nums, target):\n        return (0, 1)\n"
    r = cd.run_tests(code, cd.tests_from_spec(spec), CFG)
    assert r.outcomes == ("pass", "fail")
    assert r.feedback == "Test 2 failed: twoSum([1, 1], 3) returned (0, 1), expected [[0, 2]]"
    missing = cd.run_tests("x = 1\n", cd.tests_from_spec(spec), CFG)
    assert missing.feedback == "Test 1 raised NameError: no function or Solution method named 'twoSum'"


# ---------------------------------------------------------------- stdin/stdout tests

IO = [cd.IOTest("1 2\n", "3\n"), cd.IOTest("5 5\n", "10"), cd.IOTest("0 0\n", "0   \n\n")]


@pytest.mark.parametrize("code,outcomes", [
    ("a, b = map(int, input().split())\nprint(a + b)\n", ("pass", "pass", "pass")),
    ("import sys\nprint(sum(map(int, open(0).read().split())))\n", ("pass", "pass", "pass")),
    ("import sys\nprint(sum(map(int, sys.stdin.read().split())))\nsys.exit(0)\n", ("pass", "pass", "pass")),
    ("a, b = map(int, input().split())\nprint(a * b)\n", ("fail", "fail", "pass")),
    ("import sys\nsys.exit(2)\n", ("error", "error", "error")),
    ("if __name__ == '__main__':\n    print(sum(map(int, input().split())))\n", ("pass", "pass", "pass")),
])
def test_io_tests(code, outcomes):
    r = cd.run_tests(code, IO, CFG)
    assert r.outcomes == outcomes
    assert r.reward == pytest.approx(outcomes.count("pass") / 3)


def test_io_feedback_strings():
    r = cd.run_tests("a, b = map(int, input().split())\nprint(a * b)\n", IO, CFG)
    assert r.feedback == "Test 1 failed: input '1 2\\n': expected output '3\\n' but got '2\\n'"
    r = cd.run_tests("import sys\nsys.exit(2)\n", IO[:1], CFG)
    assert r.feedback == "Test 1 raised SystemExit(2)"
    r = cd.run_tests("while True:\n    pass\n", IO[:1], CFG)
    assert (r.outcomes, r.feedback) == (("timeout",), "Test 1 timed out (limit 1 s)")


# ---------------------------------------------------------------- response-level API

def test_score_code_and_batch():
    resp_ok = "Sure.\n```python\n" + ADD + "```"
    none = cd.score_code("I cannot write code.", ADD_TESTS, CFG)
    assert none == cd.CodeResult(0.0, 0, 3, "No ```python code block found.", ("not_run",) * 3)
    assert cd.score_code(resp_ok, ADD_TESTS, CFG).passed == 2
    batch = [resp_ok, "```python\ndef add(a, b):\n    return 0\n```", "nothing"]
    seq = cd.score_code_batch(batch, [ADD_TESTS] * 3, CFG)
    par = cd.score_code_batch(batch, [ADD_TESTS] * 3, cd.SandboxConfig(timeout_s=1.0, startup_s=5.0, max_workers=3))
    assert [r.passed for r in seq] == [2, 1, 0] and seq == par
    with pytest.raises(ValueError, match="2 responses but 1"):
        cd.score_code_batch(["a", "b"], [ADD_TESTS])


def test_input_validation():
    with pytest.raises(ValueError, match="at least one test"):
        cd.run_tests(ADD, [], CFG)
    with pytest.raises(ValueError, match="all IOTest"):
        cd.run_tests(ADD, [ADD_TESTS[0], IO[0]], CFG)
    with pytest.raises(ValueError, match="network"):
        cd.SandboxConfig(network="none")
    with pytest.raises(ValueError, match="memory_mb"):
        cd.SandboxConfig(memory_mb=1)
