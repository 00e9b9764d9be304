"""Code task: run generated Python against tests in a limited subprocess.

Reward = fraction of tests passed; feedback = the first failing test's assertion,
error or limit. Three test kinds: `AssertTest` (a Python statement such as
``assert add(1, 2) == 3``, run after the solution, its names those of the solution), `CallTest`
(call ``fn_name(*args)`` and compare with ``expected``, TACO/APPS "fn_name" style)
and `IOTest` (feed ``stdin``, compare stdout, one fresh process per test).

Who is trusted (the boundary against reward hacking):
- The *judge* (``child.py --harness``, started by the trainer) holds the tests, the expected
  values and the report fd; it runs the tests' own code and makes every comparison. It
  runs no generated code.
- The *runner* (``child.py --runner``, started by the judge as a fresh interpreter, not a
  fork: nothing of the tests is in its memory, so ``sys._getframe`` walks and
  ``gc.get_objects()`` find none) is the only process that runs generated code. It
  inherits stdin, stdout and two pipes to the judge, never the report fd, and holds
  the solution and the request in hand: call its function with these arguments, read
  this attribute or item, list / len / str / bool of this object.
- Only plain data crosses: None, bool, int, float, complex, Fraction, Decimal, str, bytes,
  list, tuple, set, frozenset, dict (`_encode`; numpy values as their plain value), decoded by the
  judge into builtin types only, never unpickled. Any other object stays in the runner
  and the judge holds a handle (`_Remote`) that tests may call, index, iterate and
  print but never compare: ``==``, ``<``, ``in`` ... run on plain data in the judge,
  so an answer's own ``__eq__`` is never consulted. A test's builtins, and the
  standard-library modules it uses as modules (``math.isclose``), are the judge's (a
  solution that redefines ``set`` or binds ``math`` to something else changes nothing
  for the tests); its other names (the function under test, a class, a constant) are
  the solution's: a value the tests take from such a name is the solution's answer (a
  plain one is copied when a test first reads it). A test that compares instances of
  the solution's own classes is an error: they are not plain data. A name of the
  solution's that a test applies to the solution's results (``isclose(area(2), x)``
  without importing ``isclose``) would let it judge its own answer: `tests_from_spec`
  refuses such a row and the judge reports such a test as an error (`names`).
- An exception of the solution's reaches the test as the builtin of its name only where
  that is an ordinary error; StopIteration, StopAsyncIteration and non-Exceptions
  (SystemExit ...) arrive as `judge.SolutionError`, never as the end of the test's ``map``.
- What the runner can still decide is its own answers: the values it sends back. It
  can exit, crash, hang or send garbage, each a failed test ("crash" / "timeout"),
  never a pass; exiting is no exception a test's ``except Exception`` can catch.
- IO tests: the trainer itself compares the program's captured stdout.
- The boundary rests on Landlock: it denies the runner ``ptrace`` of, and ``/proc``
  access to, the judge (and, ABI >= 6, signals to it). Under ``allow_unconfined`` a
  runner of the same user could read or write the judge's memory, so the reward
  cannot be trusted against an adversarial policy there.

Isolation of the runner (what is guaranteed):
- File system (kernel-enforced, Landlock): the program can read the Python installation
  and the system libraries (``/usr/lib``, ``/lib`` ...) and read and write only its
  fresh scratch working directory (deleted afterwards); ``/etc``, ``/proc``, home
  directories and the working tree are closed to it (PermissionError). Landlock is
  used because it is the Linux kernel's own, maintained sandbox for unprivileged
  processes: it needs no root, no setuid helper (bubblewrap needs unprivileged user
  namespaces, which many clusters switch off) and no syscall list to keep in step
  with libc (seccomp filters syscalls, not paths). It is three syscalls, called here
  through ctypes. Where the kernel has no Landlock (before Linux 5.13, or disabled)
  the sandbox refuses to run generated code (`SandboxUnavailable`) unless
  ``SandboxConfig.allow_unconfined`` (trainer: ``task.code.sandbox_allow_unconfined``).
- Processes (kernel-enforced): the judge is the runner's parent and its child subreaper
  (``PR_SET_CHILD_SUBREAPER``), so every descendant, however it detaches (``setsid``,
  double fork), stays below it and is SIGKILLed, until none is left, when the program
  ends or its time is up. ``RLIMIT_NPROC`` caps how many processes and threads it can
  start (``max_processes``), so a fork bomb ends. Where Linux does not apply that limit
  (root, common in containers, or CAP_SYS_ADMIN / CAP_SYS_RESOURCE) a fresh pids cgroup
  (``pids.max``; where cgroupfs is writable) caps processes and threads alike; where no
  cgroup can be made a seccomp filter forbids the runner any new process (threads stay
  allowed, bounded then only by ``memory_mb``: each needs a stack).
  With Landlock ABI >= 6 the program cannot signal (kill) anything outside its sandbox,
  the judge and the trainer included. Inside PID namespaces (below) the judge is PID 1
  and the kernel kills the namespace with it.
- Kernel-enforced: it runs in a fresh session (the parent ends the judge, then kills the
  whole process group on exit or timeout); wall-clock limits (``startup_s + timeout_s``
  to start and define the solution, then ``timeout_s`` per test: the runner's in-process
  timer, and the judge kills a runner that swallows it; the parent in turn ends a judge
  that stops reporting); rlimits set by the runner before any generated code runs:
  address space (``memory_mb``, so allocations fail with MemoryError), total CPU
  seconds, size of any file written (``max_output_bytes``, stdout included), open files
  (``max_open_files``), no core dumps, and ``max_processes``. Where a memory cgroup can be
  made the whole sandbox (processes, SysV shared memory, tmpfs, pipes) is capped at
  ``memory_mb + scratch_mb`` plus the output and the judge's share (`launch.sandbox_memory_bytes`).
- Its end: the judge ends the sandbox when the trainer dies (a pipe only the trainer holds
  closes), the runner dies with the judge (``PR_SET_PDEATHSIG``), and a process's first run
  removes the cgroups and scratch directories of trainers that died (`launch.remove_leftovers`).
- Network (kernel-enforced): it runs in new user + network + PID namespaces (``unshare``):
  no network interfaces but a downed loopback; and IPC + mount namespaces: SysV shared memory
  dies with the run, and the scratch directory is a tmpfs of ``scratch_mb`` / ``scratch_files``
  (outside namespaces only ``max_output_bytes`` per file bounds it). A seccomp filter
  (x86_64, aarch64) denies the runner ``prlimit`` of any other process, the judge included,
  and ``memfd_create`` (memory no rlimit counts).
  Where ``unshare`` is unusable, or with
  ``network="audit"``, the sandbox refuses to run generated code (`SandboxUnavailable`)
  unless ``SandboxConfig.allow_network`` (trainer: ``task.code.sandbox_allow_network``).
- Python-level (``audit_hook=True``): an audit hook raises PermissionError on
  socket creation/connection, process creation (fork, exec, spawn, subprocess,
  os.system), os.kill and setrlimit. It stops honest mistakes and accidental fork
  bombs; code using ctypes can get past it, so it is not a security boundary.
- The tests and expected outputs are never written where the program can read them.
- Time: ``response_budget_s`` per response and ``batch_budget_s`` per `score_code_batch`
  call bound the wall clock whatever the per-test limits allow; unchecked tests score 0
  (``CodeResult.unscored``). The scratch directory is removed without recursion
  (`launch.remove_tree`), however deep the program made it.
- Rlimits are set inside the runner rather than in ``preexec_fn``, which is unsafe
  when the caller has threads (a JAX trainer does).

Linux only (memfd, namespaces, seccomp on x86_64 / aarch64). The judge and the runner run
``python -I child.py --harness`` / ``--runner``: ``-I`` keeps this directory, the working
directory and the environment off ``sys.path``, and `child` makes this directory the only place
of the package's modules, which import only the standard library.

Modules: `kinds` (the test kinds, `tests_from_spec`), `names` (whose a test's names are),
`config` (`SandboxConfig`), `extract` (the response's program), `scoring` (`run_tests`,
`score_code`, `score_code_batch`), `launch` (the trainer's side of one run), `sandbox`
(Landlock, namespaces, cgroups, seccomp, rlimits), `protocol` (the plain-data codec and
pipes), `judge` and `runner` (the two children's mains), `child` (their entry script; its path is
`child_script.CHILD_SCRIPT`, apart so that the judge need not import it), `timer`, `feedback`.
"""
from __future__ import annotations

import sys
import types

from pipo_jax.tasks.code import sandbox
from pipo_jax.tasks.code.config import SandboxConfig
from pipo_jax.tasks.code.extract import extract_python_code
from pipo_jax.tasks.code.judge import _same
from pipo_jax.tasks.code.kinds import AssertTest, CallTest, IOTest, Test, tests_from_spec
from pipo_jax.tasks.code.protocol import NotPlain, _decode, _encode
from pipo_jax.tasks.code.sandbox import (SandboxUnavailable, _libc, check_confinement, check_network_isolation,
                                         check_process_bound, landlock_abi, memory_cgroup_parent,
                                         namespaces_available, nproc_exempt, pids_cgroup_parent,
                                         process_filter_available)
from pipo_jax.tasks.code.scoring import CodeResult, run_tests, score_code, score_code_batch

__all__ = ["AssertTest", "CallTest", "CodeResult", "IOTest", "NotPlain", "SandboxConfig", "SandboxUnavailable", "Test",
           "check_confinement", "check_network_isolation", "check_process_bound", "extract_python_code",
           "landlock_abi", "memory_cgroup_parent", "namespaces_available", "nproc_exempt", "pids_cgroup_parent",
           "process_filter_available",
           "run_tests", "score_code", "score_code_batch", "tests_from_spec"]

# The sandbox's host checks, which the package's own modules call as ``sandbox.name``.
_FORWARDED = frozenset({"check_confinement", "check_network_isolation", "check_process_bound", "landlock_abi",
                        "memory_cgroup_parent", "namespaces_available", "nproc_exempt", "pids_cgroup_parent",
                        "process_filter_available"})


class _Package(types.ModuleType):
    """Setting one of `_FORWARDED` here (``monkeypatch.setattr(code, "landlock_abi", ...)``, as
    tests do to act out another machine) sets it in `sandbox` too, where the package's calls see it."""

    def __setattr__(self, name, value):
        if name in _FORWARDED:
            setattr(sandbox, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
