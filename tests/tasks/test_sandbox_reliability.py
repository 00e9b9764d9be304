"""The code sandbox under faults a long RL run meets: a whole (IO) program is scored on what it
printed once it ends, however it ends; memory held outside the address space (memfds, pipes)
counts against the limit and open files are capped; a trainer killed mid-scoring takes its
sandbox with it, and what it left is removed by the next run."""

import pytest

from pipo_jax.tasks import code as cd

NO_LANDLOCK = cd.landlock_abi() == 0
IO = [cd.IOTest("1 2\n", "3\n"), cd.IOTest("20 22\n", "42\n")]


def _cfg(**kw) -> cd.SandboxConfig:
    kw.setdefault("allow_network", not cd.namespaces_available())
    kw.setdefault("timeout_s", 3.0)
    return cd.SandboxConfig(startup_s=10.0, allow_unconfined=NO_LANDLOCK, **kw)


# ---------------------------------------------------------------- an IO program ends as it ends

THREAD_PRINTS = """
import threading, time
def work(line):
    time.sleep(0.3)  # the module has long returned by now
    print(sum(map(int, line.split())))
threading.Thread(target=work, args=(input(),)).start()
"""
NESTED_THREADS = """
import threading, time
def inner(n):
    time.sleep(0.2)
    print(n)
def outer(n):
    time.sleep(0.1)
    threading.Thread(target=inner, args=(n,)).start()
threading.Thread(target=outer, args=(sum(map(int, input().split())),)).start()
"""
EXITS_AFTER_FLUSH = """
import os, sys
print(sum(map(int, input().split())))
sys.stdout.flush()
os._exit(0)
"""
EXIT_IN_THREAD_AFTER_SYS_EXIT = """
import sys, threading, time
def work(n):
    time.sleep(0.2)
    print(n)
threading.Thread(target=work, args=(sum(map(int, input().split())),)).start()
sys.exit(0)
"""


@pytest.mark.parametrize("program", [THREAD_PRINTS, NESTED_THREADS, EXITS_AFTER_FLUSH, EXIT_IN_THREAD_AFTER_SYS_EXIT],
                         ids=["thread_prints", "nested_threads", "os_exit_0", "sys_exit_then_thread"])
def test_a_correct_program_scores_what_it_printed_however_it_ends(program):
    r = cd.run_tests(program, IO, _cfg())
    assert (r.reward, r.outcomes) == (1.0, ("pass", "pass")), r.feedback


def test_what_an_io_program_ends_with_still_counts():
    wrong = cd.run_tests(THREAD_PRINTS.replace("sum(map(int, line.split()))", "len(line.split())"), IO, _cfg())
    assert wrong.outcomes == ("fail", "fail")
    assert wrong.feedback == "Test 1 failed: input '1 2\\n': expected output '3\\n' but got '2\\n'"
    status3 = cd.run_tests(EXITS_AFTER_FLUSH.replace("_exit(0)", "_exit(3)"), IO[:1], _cfg())
    assert (status3.outcomes, status3.feedback) == (("crash",), "Test 1 crashed (exited with status 3)")
    unflushed = cd.run_tests("import os\nprint(3)\nos._exit(0)\n", IO[:1], _cfg())  # its output was never written
    assert unflushed.outcomes == ("fail",)
    endless = cd.run_tests("import threading\nthreading.Thread(target=lambda: [0 for _ in iter(int, 1)]).start()\n",
                           IO[:1], _cfg(timeout_s=1.0))
    assert (endless.outcomes, endless.feedback) == (("timeout",), "Test 1 timed out (limit 1 s)")
