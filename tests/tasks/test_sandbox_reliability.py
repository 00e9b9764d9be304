"""The code sandbox under faults a long RL run meets: a whole (IO) program is scored on what it
printed once it ends, however it ends; memory held outside the address space (memfds, pipes)
counts against the limit and open files are capped; a trainer killed mid-scoring takes its
sandbox with it, and what it left is removed by the next run."""

import os
import pathlib
import subprocess
import sys
import tempfile
import time

import pytest

from pipo_jax.tasks import code as cd
from tests.tasks.test_code import processes_named

ROOT = pathlib.Path(__file__).resolve().parents[2]

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


# ---------------------------------------------------------------- memory outside the address space, open files

MEMFDS = """
import ctypes, os
def hold(mib, via):
    fds = []
    for _ in range(mib // 16):  # memfds of 16 MiB, written with write(): in no address space
        fd = os.memfd_create("x") if via == "os" else ctypes.CDLL(None, use_errno=True).memfd_create(b"x", 0)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "memfd_create")
        for _ in range(16):
            os.write(fd, b"\\1" * (1 << 20))
        fds.append(fd)
    return len(fds) * 16
"""


@pytest.mark.skipif(not cd.process_filter_available(), reason="no seccomp filter for this machine")
@pytest.mark.parametrize("via", ["os", "ctypes"])
def test_a_program_holding_memfds_beyond_its_memory_limit_is_refused(via):
    """256 MiB in memfds under memory_mb=64 (each file below max_output_bytes): memfd_create fails."""
    config = _cfg(memory_mb=64, max_output_bytes=64 << 20, audit_hook=False)
    r = cd.run_tests(MEMFDS, [cd.AssertTest(f"assert hold(256, {via!r}) == 256")], config)
    assert (r.reward, r.outcomes) == (0.0, ("error",)), r.feedback
    assert r.feedback.startswith("Test 1 raised PermissionError: [Errno 1] "), r.feedback  # EPERM


FORKED_HOLDERS = """
import os, select, time
def holders(n, mib):
    r, w = os.pipe()
    for _ in range(n):
        if os.fork() == 0:  # each child has memory_mb of address space of its own
            block = b"\\1" * (mib << 20)
            os.write(w, b"+")
            time.sleep(30)
            os._exit(0)
    held, end = 0, time.monotonic() + 4
    while held < n and select.select([r], [], [], max(end - time.monotonic(), 0))[0]:
        held += len(os.read(r, n))
    return held
"""
SHARED_MEMORY = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
def segments(count, mib):
    made = 0
    for _ in range(count):  # each touched, then detached: in no address space
        addr = libc.shmat(libc.shmget(0, mib << 20, 0o1600), None, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            break
        ctypes.memset(addr, 1, mib << 20)
        libc.shmdt(ctypes.c_void_p(addr))
        made += 1
    return made
"""
NEEDS_MEMORY_CGROUP = pytest.mark.skipif(cd.memory_cgroup_parent() is None,
                                         reason="no memory cgroup can be made here (not root, or a container)")


@NEEDS_MEMORY_CGROUP
def test_memory_in_processes_and_shared_memory_counts_against_the_limit():
    """Where a memory cgroup can be made the whole sandbox is capped (memory_mb=64: 64 + 16 scratch
    + 1 output + 96 judge MiB): 8 forked children x 40 MiB, or 5 SysV segments x 300 MiB (1.5 GiB
    at the default memory_mb), do not fit; half as much, within the cap, does."""
    small = _cfg(memory_mb=64, scratch_mb=16, audit_hook=False)
    assert cd.run_tests(FORKED_HOLDERS, [cd.AssertTest("assert holders(2, 40) == 2")], small).outcomes == ("pass",)
    capped = cd.run_tests(FORKED_HOLDERS, [cd.AssertTest("assert holders(8, 40) == 8")], small)
    assert capped.reward == 0.0 and capped.outcomes != ("pass",), capped.feedback
    if cd.namespaces_available():  # SysV shared memory of a run dies with its IPC namespace
        default = _cfg(audit_hook=False)
        pinned = cd.run_tests(SHARED_MEMORY, [cd.AssertTest("assert segments(5, 300) == 5")], default)
        assert pinned.reward == 0.0 and pinned.outcomes != ("pass",), pinned.feedback
        fits = cd.run_tests(SHARED_MEMORY, [cd.AssertTest("assert segments(2, 300) == 2")], default)
        assert fits.outcomes == ("pass",), fits.feedback


PIPES = """
import os
def pipes():
    held = []
    try:
        while len(held) < 10_000:
            held += os.pipe()  # each pipe can pin up to 1 MiB of kernel memory (F_SETPIPE_SZ)
    except OSError as e:
        assert e.errno == 24, e  # EMFILE
    return len(held)
"""


def test_open_files_are_capped():
    assert cd.run_tests(PIPES, [cd.AssertTest("assert 48 <= pipes() < 64")], _cfg()).outcomes == ("pass",)
    wider = _cfg(max_open_files=256)
    assert cd.run_tests(PIPES, [cd.AssertTest("assert 240 <= pipes() < 256")], wider).outcomes == ("pass",)
    with pytest.raises(ValueError, match="max_open_files must be >= 16"):
        _cfg(max_open_files=8)


# ---------------------------------------------------------------- a trainer killed mid-scoring

SPINNER = """
import ctypes, time
ctypes.CDLL(None).prctl(15, b"{name}")  # PR_SET_NAME: the runner is found by its name
def spin():
    while True:
        time.sleep(0.01)
"""
TRAINER = """
import sys
from pipo_jax.tasks import code as cd
config = cd.SandboxConfig(timeout_s=float(sys.argv[1]), startup_s=10.0, network={network!r}, allow_network={net},
                          allow_unconfined={ll})
print(cd.run_tests(sys.argv[2], [cd.AssertTest(sys.argv[3])], config).outcomes, flush=True)
"""
MODES = ["audit"] + (["namespace"] if cd.namespaces_available() else [])  # the judge as PID 1 of namespaces, or not


def _trainer(timeout_s: float, program: str, test: str, network: str) -> subprocess.Popen:
    script = TRAINER.format(network="audit" if network == "audit" else "auto", ll=NO_LANDLOCK,
                            net=network == "audit" or not cd.namespaces_available())
    return subprocess.Popen([sys.executable, "-c", script, str(timeout_s), program, test], stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)


def _descendants(pid: int) -> set[int]:
    parent = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = set(), [pid]
    while frontier:
        top = frontier.pop()
        kids = [c for c, p in parent.items() if p == top]
        found.update(kids)
        frontier += kids
    return found


def _leftovers(pid: int) -> list[str]:
    """The cgroups and scratch directories of trainer `pid`."""
    places = [tempfile.gettempdir()] + [p for p in (cd.pids_cgroup_parent(), cd.memory_cgroup_parent()) if p]
    return sorted(os.path.join(place, n) for place in set(places) for n in os.listdir(place)
                  if n.startswith((f"pipo_sandbox_{pid}_", f"pipo_code_pid{pid}_")))


def _wait_for(condition, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("network", MODES)
def test_a_killed_trainer_takes_its_sandbox_along_and_the_next_run_removes_what_it_left(network):
    name = f"pipo{network[0]}{os.getpid() % 100000}"  # one per mode: nothing of another run matches
    trainer = _trainer(60.0, SPINNER.replace("{name}", name), "assert spin() == 1", network)
    try:
        assert _wait_for(lambda: processes_named(name), 30.0), "the program never started"
        sandbox = _descendants(trainer.pid)
        left = _leftovers(trainer.pid)
        assert len(sandbox) >= 2 and any(os.path.basename(p).startswith("pipo_code_") for p in left), (sandbox, left)
        assert len(left) == 1 + len({p for p in (cd.pids_cgroup_parent(), cd.memory_cgroup_parent()) if p})
    finally:
        trainer.kill()  # SIGKILL: no finally, no atexit of the trainer runs
        trainer.wait()
    # the judge sees the trainer's end on its lifeline and ends the sandbox (the program had 60 s left)
    assert _wait_for(lambda: not (_alive(sandbox) or processes_named(name)), 3.0), _alive(sandbox)
    assert _leftovers(trainer.pid) == left  # nothing of the dead trainer removed its cgroups, its scratch dir
    nxt = _trainer(3.0, "def add(a, b):\n    return a + b\n", "assert add(1, 2) == 3", network)
    assert nxt.communicate(timeout=60)[0].strip() == "('pass',)"
    assert _leftovers(trainer.pid) == []


def _alive(pids: set[int]) -> list[int]:
    return [p for p in pids if cd.sandbox._pid_alive(p)]
