"""Code task: run generated Python against tests in a limited subprocess.

Reward = fraction of tests passed; feedback = the first failing test's assertion,
error or limit. Three test kinds: `AssertTest` (a Python statement such as
``assert add(1, 2) == 3``, run after the solution in its namespace), `CallTest`
(call ``fn_name(*args)`` and compare with ``expected``, TACO/APPS "fn_name" style)
and `IOTest` (feed ``stdin``, compare stdout, one fresh process per test).

Isolation of the child (what is guaranteed):
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
  ``SandboxConfig.allow_unconfined`` (trainer: ``task.sandbox_allow_unconfined``).
- Processes (kernel-enforced): a supervisor process is the program's parent and its
  child subreaper (``PR_SET_CHILD_SUBREAPER``), so every descendant, however it
  detaches (``setsid``, double fork), stays below it and is SIGKILLed, until none is
  left, when the program ends or its time is up; ``RLIMIT_NPROC`` caps how many it can
  start (``max_processes``), so a fork bomb ends. With Landlock ABI >= 6 the program
  cannot signal (kill) anything outside its sandbox, the supervisor and the trainer
  included. Inside PID namespaces (below) the supervisor is PID 1 and the kernel kills
  the namespace with it.
- Kernel-enforced: it runs in a fresh session (the parent ends its supervisor, then
  kills its whole process group on exit or timeout); wall-clock limits (``startup_s + timeout_s`` to start
  and define the solution, then ``timeout_s`` + 1 s per test, enforced by the parent
  even if the program swallows the in-process timer); rlimits set by the harness
  before any generated code runs: address space (``memory_mb``, so allocations fail
  with MemoryError), total CPU seconds, size of any file written
  (``max_output_bytes``, stdout included), no core dumps, and ``max_processes``. With ``network="namespace"`` (or
  "auto" where ``unshare`` works) it runs in new user + network + PID namespaces:
  no network interfaces but a downed loopback, and killing the namespace's first
  process kills every process the program started.
- Python-level (``audit_hook=True``): an audit hook raises PermissionError on
  socket creation/connection, process creation (fork, exec, spawn, subprocess,
  os.system), os.kill and setrlimit. It stops honest mistakes and accidental fork
  bombs; code using ctypes can get past it, so it is not a security boundary.
- The tests and expected outputs are never written where the program can read them.
- Rlimits are set inside the child rather than in ``preexec_fn``, which is unsafe
  when the caller has threads (a JAX trainer does).

Linux only (memfd, namespaces). This file is also the child's harness: the child runs ``python -I code.py --harness``
(``-I`` keeps this directory off ``sys.path``), so it imports only the standard library.
"""
from __future__ import annotations

import ast
import copy
import ctypes
import dataclasses
import errno
import functools
import json
import logging
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Union

logger = logging.getLogger(__name__)

_FEEDBACK_CHARS = 300
_RECORD_SLACK_S = 1.0  # harness overhead allowed between a test's time limit and its record
_SUPERVISOR_EXIT_S = 5.0  # time the supervisor gets to kill the program's tree at a deadline


@dataclasses.dataclass(frozen=True)
class AssertTest:
    """A Python statement run after the solution, e.g. ``assert f(2) == 4``."""

    source: str


@dataclasses.dataclass(frozen=True)
class CallTest:
    """``fn_name(*args) == expected`` (a ``Solution().fn_name`` method is used if no
    top-level function exists; tuples compare equal to lists, floats to 1e-9, and a
    one-element list ``expected`` also matches its element, as in APPS/TACO).
    ``args`` and ``expected`` must be JSON values."""

    fn_name: str
    args: tuple
    expected: Any


@dataclasses.dataclass(frozen=True)
class IOTest:
    """Run the program with ``stdin``; stdout must equal ``expected_stdout`` up to
    trailing whitespace on each line and trailing blank lines."""

    stdin: str
    expected_stdout: str


Test = Union[AssertTest, CallTest, IOTest]


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """Limits for one run.

    timeout_s: wall-clock seconds per test (and for defining the solution).
    startup_s: extra wall-clock seconds for interpreter start-up per process.
    memory_mb: address-space limit of the child.
    max_output_bytes: largest file the child may write (its stdout included).
    max_processes: how many processes / threads the program may add: RLIMIT_NPROC is
      set to the user's count at start plus this (Linux counts every process and thread
      of the user, and ignores the limit for root); 0 = leave RLIMIT_NPROC unchanged.
    network: "auto" (namespace if available, else audit hook only), "namespace"
      (require unshare; error if unavailable) or "audit".
    audit_hook: block sockets, process creation, kill and setrlimit in Python.
    python: interpreter that runs the generated code.
    max_workers: parallel runs in `score_code_batch`.
    allow_unconfined: run generated code even where the kernel offers no Landlock
      (then the file system is open to it; a warning is logged once).
    """

    timeout_s: float = 5.0
    startup_s: float = 10.0
    memory_mb: int = 1024
    max_output_bytes: int = 1 << 20
    max_processes: int = 64
    network: str = "auto"
    audit_hook: bool = True
    python: str = sys.executable
    max_workers: int = 1
    allow_unconfined: bool = False

    def __post_init__(self):
        if self.network not in ("auto", "namespace", "audit"):
            raise ValueError(f"SandboxConfig.network must be 'auto', 'namespace' or 'audit', got {self.network!r}")
        if not (self.timeout_s > 0 and self.startup_s > 0):
            raise ValueError("SandboxConfig.timeout_s and startup_s must be > 0")
        if self.memory_mb < 16 or self.max_output_bytes < 1 or self.max_processes < 0 or self.max_workers < 1:
            raise ValueError("SandboxConfig: memory_mb >= 16, max_output_bytes >= 1, max_processes >= 0, "
                             "max_workers >= 1 required")


@dataclasses.dataclass(frozen=True)
class CodeResult:
    """reward = passed / total; outcomes[i] in pass/fail/error/timeout/crash/not_run."""

    reward: float
    passed: int
    total: int
    feedback: str
    outcomes: tuple[str, ...]


# ----------------------------------------------------------------------------------
# Extraction and test parsing
# ----------------------------------------------------------------------------------

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


def extract_python_code(text: str) -> str | None:
    """Code of the last ```python (or ```py / ```python3) block; else the last
    unlabelled ``` block; None if there is none. An unclosed final block (truncated
    response) runs to the end of the text."""
    python_blocks, plain_blocks = [], []
    for m in _FENCE_RE.finditer(text):
        lang = m.group(1).lower()
        if lang in ("python", "py", "python3"):
            python_blocks.append(m.group(2))
        elif lang == "":
            plain_blocks.append(m.group(2))
    blocks = python_blocks or plain_blocks
    if not blocks or not blocks[-1].strip():
        return None
    return blocks[-1]


def tests_from_spec(spec: Any) -> list[Test]:
    """Tests from a dataset field.

    Accepts a list of assert statements (MBPP/HumanEval style), a list of
    ``{"input", "output"}`` dicts, or an APPS/TACO ``input_output`` dict (or its JSON
    string) ``{"inputs": [...], "outputs": [...], "fn_name"?: str}``; with ``fn_name``
    each input is the argument list of a call. Raises ValueError on anything else.
    """
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise ValueError(f"test spec is a string but not JSON: {e}") from e
    if isinstance(spec, dict):
        if "inputs" not in spec or "outputs" not in spec:
            raise ValueError(f"test spec dict needs 'inputs' and 'outputs', got keys {sorted(spec)}")
        ins, outs = spec["inputs"], spec["outputs"]
        if len(ins) != len(outs):
            raise ValueError(f"test spec has {len(ins)} inputs but {len(outs)} outputs")
        if spec.get("fn_name"):
            return [CallTest(spec["fn_name"], tuple(a) if isinstance(a, list) else (a,), o)
                    for a, o in zip(ins, outs, strict=True)]
        return [IOTest(_joined(i), _joined(o)) for i, o in zip(ins, outs, strict=True)]
    if isinstance(spec, list) and spec:
        if all(isinstance(t, str) for t in spec):
            return [AssertTest(t) for t in spec]
        if all(isinstance(t, dict) and "input" in t and "output" in t for t in spec):
            return [IOTest(_joined(t["input"]), _joined(t["output"])) for t in spec]
    raise ValueError(f"unrecognised test spec: {str(spec)[:200]!r}")


def _joined(x: Any) -> str:
    return "\n".join(map(str, x)) + "\n" if isinstance(x, list) else str(x)


# ----------------------------------------------------------------------------------
# Landlock (used by both sides; standard library only)
# ----------------------------------------------------------------------------------

# Linux uapi <linux/landlock.h>; the syscall numbers are the same on every architecture.
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
# All file-system rights an ABI knows: 13 in ABI 1, then REFER (2), TRUNCATE (3), IOCTL_DEV (5).
_FS_RIGHTS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
# The rights a rule on a file (not a directory) may hold: EXECUTE, WRITE, READ, TRUNCATE, IOCTL_DEV.
_FS_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | (1 << 14) | (1 << 15)
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI >= 6
_PR_SET_NO_NEW_PRIVS, _PR_SET_CHILD_SUBREAPER = 38, 36


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # struct landlock_path_beneath_attr is packed
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


@functools.lru_cache(maxsize=None)
def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none: before Linux 5.13, not built in, or disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    abi = _libc().syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                          ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    return max(int(abi), 0)


class SandboxUnavailable(RuntimeError):
    """The kernel cannot confine generated code's file system access (no Landlock)."""


def check_confinement(config: SandboxConfig) -> bool:
    """True when generated code will run confined; raises `SandboxUnavailable` where the
    kernel has no Landlock and ``config.allow_unconfined`` is off."""
    if landlock_abi() >= 1:
        return True
    if not config.allow_unconfined:
        raise SandboxUnavailable(
            "this kernel offers no Landlock, so the code sandbox cannot keep generated programs out of the file "
            "system; refusing to run them. Set SandboxConfig(allow_unconfined=True) (trainer: "
            "--config.task.sandbox_allow_unconfined=true) to run them with your permissions anyway")
    _warn_unconfined()
    return False


@functools.lru_cache(maxsize=None)
def _warn_unconfined() -> None:
    logger.warning("no Landlock on this kernel: generated code runs with this user's file system access "
                   "(allow_unconfined=True)")


# ----------------------------------------------------------------------------------
# Parent side
# ----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def namespaces_available() -> bool:
    """Whether ``unshare`` can give a child new user, network and PID namespaces."""
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        r = subprocess.run([exe, *_UNSHARE_FLAGS, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


_UNSHARE_FLAGS = ("--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--")


def _use_namespaces(config: SandboxConfig) -> bool:
    if config.network == "audit":
        return False
    if namespaces_available():
        return True
    if config.network == "namespace":
        raise RuntimeError("SandboxConfig.network='namespace' but 'unshare --user --net --pid' is not usable here")
    _warn_no_namespaces()
    return False


@functools.lru_cache(maxsize=None)
def _warn_no_namespaces() -> None:
    logger.warning("unshare is not usable; generated code is kept off the network by the audit hook only")


def _memfd_with(data: bytes, name: str) -> int:
    fd = os.memfd_create(name)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_all(fd: int, limit: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks, size = [], 0
    while size < limit and (chunk := os.read(fd, min(1 << 16, limit - size))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _child_of(pid: int) -> int | None:
    """A child process of `pid` (from /proc), or None."""
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    return int(name)
        except (OSError, IndexError, ValueError):
            continue
    return None


def _end_program(proc: subprocess.Popen, namespaced: bool) -> None:
    """At a deadline: SIGKILL the namespace's first process (the kernel then kills the whole
    namespace before `unshare` returns), or SIGTERM the supervisor (it kills the program's
    tree, then exits); waits for that."""
    try:
        target = _child_of(proc.pid) if namespaced else None
        if target is not None:
            os.kill(target, signal.SIGKILL)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=_SUPERVISOR_EXIT_S)
    except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
        pass


def _wait_or_kill(proc: subprocess.Popen, config: SandboxConfig, progress_fd: int, namespaced: bool) -> bool:
    """Wait for the child while it makes progress; then kill its whole process group.

    The child has ``startup_s + timeout_s`` to start and define the solution, and
    ``timeout_s + _RECORD_SLACK_S`` after each result record it writes to
    ``progress_fd`` for the next one. Waits with WNOWAIT so an exited leader keeps
    its pid (and group id) reserved until the group is killed. Returns True when a
    deadline killed the child.
    """
    deadline = time.monotonic() + config.startup_s + config.timeout_s
    delay, killed, seen = 0.001, False, 0
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
        now = time.monotonic()
        size = os.fstat(progress_fd).st_size
        if size != seen:
            seen, deadline, delay = size, now + config.timeout_s + _RECORD_SLACK_S, 0.001
        if now >= deadline:
            killed = True
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.02)
    if killed:
        _end_program(proc, namespaced)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    return killed


def _launch(spec: dict, config: SandboxConfig) -> tuple[list[dict], bytes, int, bool]:
    """Run the harness once in a fresh working directory.

    The spec (code, tests, limits) arrives on an anonymous memfd as stdin, which the
    harness reads and then replaces; result records go to another memfd; nothing the
    program could read or overwrite is on disk. Returns (records, stdout, return
    code, killed_by_deadline).
    """
    spec = dict(spec, confine=check_confinement(config))
    cmd = [config.python, "-I", "-X", "utf8", os.path.abspath(__file__), "--harness"]
    namespaced = _use_namespaces(config)
    if namespaced:
        cmd = [shutil.which("unshare"), *_UNSHARE_FLAGS, *cmd]
    spec_fd = _memfd_with(json.dumps(spec).encode(), "spec")
    results_fd = os.memfd_create("results")
    stdout_fd = os.memfd_create("stdout")
    try:
        with tempfile.TemporaryDirectory(prefix="pipo_code_") as workdir:
            env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
                   "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            proc = subprocess.Popen(cmd + [str(results_fd)], stdin=spec_fd, stdout=stdout_fd,
                                    stderr=subprocess.DEVNULL, cwd=workdir, env=env,
                                    start_new_session=True, pass_fds=(results_fd,))
            killed = _wait_or_kill(proc, config, results_fd, namespaced)
        records = []
        for line in _read_all(results_fd, 1 << 24).decode("utf-8", errors="replace").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a record cut short by the kill
        stdout = _read_all(stdout_fd, config.max_output_bytes + 1)
    finally:
        for fd in (spec_fd, results_fd, stdout_fd):
            os.close(fd)
    return records, stdout, proc.returncode, killed


def _ended_badly(rc: int | None, killed: bool, config: SandboxConfig) -> tuple[str, str]:
    """(outcome, message) for a child that stopped before reporting a test."""
    if killed:
        return "timeout", f"limit {config.timeout_s:g} s"
    if rc is not None and rc < 0:
        if -rc == signal.SIGXCPU:
            return "timeout", "CPU time limit"
        if -rc == signal.SIGXFSZ:
            return "crash", f"output limit of {config.max_output_bytes} bytes exceeded"
        try:
            return "crash", signal.Signals(-rc).name
        except ValueError:
            return "crash", f"signal {-rc}"
    return "crash", f"exited with status {rc}"


def _run_in_process_tests(code: str, tests: Sequence[Test], config: SandboxConfig
                          ) -> tuple[list[tuple[str, str]], tuple[str, str] | None]:
    """Assert/call tests, all in one child.

    Returns ((outcome, message) per test, definition failure or None). Record -1 is
    defining the solution; if that fails every test gets its outcome. A child that
    dies or is killed during test k gives k that outcome, later tests "not_run".
    """
    spec = {"mode": "functions", "code": code, "tests": [_test_record(t) for t in tests],
            "limits": _limits(config, len(tests) + 1)}
    records, _, rc, killed = _launch(spec, config)
    by_index = {r["i"]: (r["outcome"], r["msg"]) for r in records}
    definition = by_index.get(-1) or _ended_badly(rc, killed, config)
    if definition[0] != "pass":
        return [definition] * len(tests), definition
    out: list[tuple[str, str]] = []
    for k in range(len(tests)):
        if k in by_index:
            out.append(by_index[k])
        elif k == len(by_index) - 1:  # the test that was running when the child stopped
            out.append(_ended_badly(rc, killed, config))
        else:
            out.append(("not_run", "not run"))
    return out, None


def _run_io_test(code: str, test: IOTest, config: SandboxConfig) -> tuple[str, str]:
    spec = {"mode": "io", "code": code, "stdin": test.stdin, "limits": _limits(config, 1)}
    records, stdout_bytes, rc, killed = _launch(spec, config)
    if not records:
        return _ended_badly(rc, killed, config)
    outcome, msg = records[-1]["outcome"], records[-1]["msg"]
    if outcome != "pass":
        return outcome, msg
    stdout = stdout_bytes.decode("utf-8", errors="replace")
    if _normalise_output(stdout) == _normalise_output(test.expected_stdout):
        return "pass", ""
    return "fail", (f"input {_clip(repr(test.stdin))}: expected output {_clip(repr(test.expected_stdout))} "
                    f"but got {_clip(repr(stdout))}")


def _normalise_output(s: str) -> str:
    return "\n".join(line.rstrip() for line in s.strip("\n").split("\n")).rstrip()


def _clip(text: str, n: int = 100) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _test_record(t: Test) -> dict:
    if isinstance(t, AssertTest):
        return {"kind": "assert", "source": t.source}
    if isinstance(t, CallTest):
        return {"kind": "call", "fn_name": t.fn_name, "args": list(t.args), "expected": t.expected}
    raise TypeError(f"not a test: {t!r}")


def _limits(config: SandboxConfig, n_slots: int) -> dict:
    return {"timeout_s": config.timeout_s, "memory": config.memory_mb * 2**20,
            "cpu_s": math.ceil(config.startup_s + config.timeout_s * n_slots) + 1,
            "fsize": config.max_output_bytes, "nproc": config.max_processes, "audit": config.audit_hook}


def _describe(outcome: str, msg: str) -> str:
    if outcome == "fail":
        return f"failed: {msg}"
    if outcome == "error":
        return f"raised {msg}"
    return f"{'timed out' if outcome == 'timeout' else 'crashed'} ({msg})"


def run_tests(code: str, tests: Sequence[Test], config: SandboxConfig = SandboxConfig()) -> CodeResult:
    """Run ``code`` against ``tests``; never raises for anything the code does."""
    if not tests:
        raise ValueError("run_tests needs at least one test")
    n_io = sum(isinstance(t, IOTest) for t in tests)
    if n_io not in (0, len(tests)):
        raise ValueError("a test list must be all IOTest or all AssertTest/CallTest")
    definition_failure = None
    if n_io:
        outcomes = [_run_io_test(code, t, config) for t in tests]
    else:
        outcomes, definition_failure = _run_in_process_tests(code, tests, config)
    passed = sum(o == "pass" for o, _ in outcomes)
    if definition_failure is not None:
        feedback = "The solution itself " + _describe(*definition_failure) + " before any test ran."
    else:
        first_bad = next(((k, o) for k, o in enumerate(outcomes) if o[0] != "pass"), None)
        feedback = "All tests passed." if first_bad is None else (
            f"Test {first_bad[0] + 1} " + _describe(*first_bad[1]))
    return CodeResult(passed / len(tests), passed, len(tests), _clip_text(feedback), tuple(o for o, _ in outcomes))


def _clip_text(s: str) -> str:
    return s if len(s) <= _FEEDBACK_CHARS else s[: _FEEDBACK_CHARS - 3] + "..."


def score_code(response: str, tests: Sequence[Test], config: SandboxConfig = SandboxConfig()) -> CodeResult:
    """Extract the last ```python block of ``response`` and run it against ``tests``."""
    code = extract_python_code(response)
    if code is None:
        return CodeResult(0.0, 0, len(tests), "No ```python code block found.", ("not_run",) * len(tests))
    return run_tests(code, tests, config)


def score_code_batch(responses: Sequence[str], tests: Sequence[Sequence[Test]],
                     config: SandboxConfig = SandboxConfig()) -> list[CodeResult]:
    """`score_code` over a batch, ``config.max_workers`` runs at a time."""
    if len(responses) != len(tests):
        raise ValueError(f"score_code_batch: {len(responses)} responses but {len(tests)} test lists")
    if config.max_workers == 1:
        return [score_code(r, t, config) for r, t in zip(responses, tests, strict=True)]
    with ThreadPoolExecutor(config.max_workers) as pool:
        return list(pool.map(lambda rt: score_code(rt[0], rt[1], config), zip(responses, tests, strict=True)))


# ----------------------------------------------------------------------------------
# Child side (the harness). Standard library only; runs as a script.
# ----------------------------------------------------------------------------------

class _TestTimeout(BaseException):
    """Raised by the per-test timer; BaseException so `except Exception` misses it."""


_BLOCKED_EVENTS = frozenset({
    "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
    "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
    "os.fork", "os.forkpty", "os.system", "os.exec", "os.spawn", "os.posix_spawn",
    "subprocess.Popen", "os.kill", "os.killpg", "resource.setrlimit", "pty.spawn",
})


def _audit(event: str, args: tuple) -> None:
    if event in _BLOCKED_EVENTS:
        raise PermissionError(f"{event} is not allowed in the sandbox")


def _user_tasks() -> int:
    """Processes and threads of this real uid now (what RLIMIT_NPROC counts), from /proc."""
    uid, n = os.getuid(), 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:  # gone meanwhile
            continue
        if int(fields.get("Uid", "-1 ").split()[0]) == uid:
            n += int(fields.get("Threads", "1"))
    return n


def _set_limits(limits: dict) -> None:
    for res, value in ((resource.RLIMIT_AS, limits["memory"]), (resource.RLIMIT_CPU, limits["cpu_s"]),
                       (resource.RLIMIT_FSIZE, limits["fsize"]), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (value, value))
    if limits["nproc"]:
        nproc = _user_tasks() + limits["nproc"]
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _readable_roots() -> list[str]:
    """What the program may read (and execute): the interpreter's installation and the
    system libraries, never /etc, /proc, home directories or the caller's working tree."""
    paths = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths |= {os.path.realpath(p) for p in list(paths)}
    paths |= {"/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib", "/usr/share/zoneinfo"}
    return sorted(p for p in paths if os.path.isdir(p))


def _landlock_confine(scratch: str) -> None:
    """Restricts this process and everything it starts: read + execute below
    `_readable_roots()`, everything below `scratch`, /dev/null read + write, nothing else;
    with ABI >= 6 also no signals to and no abstract unix sockets of processes outside."""
    libc = _libc()
    abi = landlock_abi()
    fs_rights = _FS_RIGHTS_BY_ABI[max(k for k in _FS_RIGHTS_BY_ABI if k <= abi)]
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    # struct landlock_ruleset_attr {u64 handled_access_fs, handled_access_net, scoped}: pass the
    # fields this ABI knows (network rights are not handled: `network` / the audit hook do that).
    attr = (ctypes.c_uint64 * 3)(fs_rights, 0, scoped)
    size = 24 if abi >= 6 else 8
    ruleset = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    read_exec = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
    rules = [(p, read_exec) for p in _readable_roots()] + [(scratch, fs_rights)]
    rules += [("/dev/null", _FS_READ_FILE | _FS_WRITE_FILE)]
    try:
        for path, rights in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                if not os.path.isdir(path):
                    rights &= _FS_FILE_RIGHTS
                rule = _PathBeneath(rights & fs_rights, fd)
                if libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset),
                                ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}) failed")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)


class _Terminate(BaseException):
    """SIGTERM to the supervisor: the parent's deadline passed."""


def _on_terminate(signum, frame):
    raise _Terminate()


def _descendants(root: int) -> tuple[list[int], bool]:
    """(live descendants of `root`, whether any zombie child waits to be reaped), from /proc."""
    parent, zombie = {}, set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)"
        except OSError:
            continue
        parent[int(name)] = int(fields[1])
        if fields[0] in ("Z", "X"):
            zombie.add(int(name))
    found, frontier = [], [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        frontier += kids
    return [p for p in found if p not in zombie], any(parent.get(z) == root for z in zombie)


def _reap() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def _kill_tree() -> None:
    """SIGKILLs every live descendant of this process until none is left (the subreaper
    inherits each orphan, so none escapes the scan); reaps them."""
    while True:
        _reap()
        live, _ = _descendants(os.getpid())
        if not live:
            _reap()
            return
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _supervise() -> None:
    """Forks the program's process; this one becomes its supervisor (child subreaper),
    waits for it, kills whatever it left behind and exits with its status. Returns only
    in the program's process. In a PID namespace the program is PID 1 itself: when it
    ends, the kernel kills every process of the namespace."""
    if os.getpid() == 1:
        return
    _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGTERM, _on_terminate)
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        return
    status = None
    try:
        while status is None:
            try:
                _, status = os.waitpid(pid, 0)
            except ChildProcessError:
                break
    except _Terminate:
        os.kill(pid, signal.SIGKILL)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _kill_tree()
    code = os.waitstatus_to_exitcode(status) if status is not None else -signal.SIGKILL
    if code < 0:  # the program died of a signal: so does its supervisor (the parent reads rc < 0)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


def _error_message(e: BaseException) -> str:
    line = ""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if frame.filename == "<solution>":
            line = f" (solution line {frame.lineno})"
            break
    if isinstance(e, OSError) and e.errno == errno.EFBIG:  # RLIMIT_FSIZE (Python ignores SIGXFSZ)
        return f"output limit exceeded: {e.strerror}{line}"
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return _clip_text(text + line)


def _timed(fn, timeout_s: float):
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _same(got: Any, expected: Any) -> bool:
    def plain(x):
        if isinstance(x, (tuple, list)):
            return [plain(v) for v in x]
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return x

    got, expected = plain(got), plain(expected)
    if got == expected:
        return True
    if isinstance(got, float) or isinstance(expected, float):
        try:
            return math.isclose(float(got), float(expected), rel_tol=1e-9, abs_tol=1e-9)
        except (TypeError, ValueError):
            return False
    return isinstance(expected, list) and len(expected) == 1 and got == expected[0]


def _run_assert(source: str, ns: dict) -> tuple[str, str]:
    tree = ast.parse(source, "<test>", "exec")
    stmt = tree.body[0] if len(tree.body) == 1 else None
    if (isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare) and len(stmt.test.ops) == 1
            and isinstance(stmt.test.ops[0], ast.Eq)):
        lhs = eval(compile(ast.Expression(stmt.test.left), "<test>", "eval"), ns)
        rhs = eval(compile(ast.Expression(stmt.test.comparators[0]), "<test>", "eval"), ns)
        if lhs == rhs:
            return "pass", ""
        return "fail", f"{source.strip()} -- got {_clip(_safe_repr(lhs))}"
    try:
        exec(compile(tree, "<test>", "exec"), ns)
    except AssertionError as e:
        return "fail", source.strip() + (f" -- {e}" if str(e) else "")
    return "pass", ""


def _safe_repr(x: Any) -> str:
    try:
        return repr(x)
    except Exception as e:  # a user __repr__ may itself fail
        return f"<unprintable {type(x).__name__}: {type(e).__name__}>"


def _run_call(test: dict, ns: dict) -> tuple[str, str]:
    name = test["fn_name"]
    fn = ns.get(name)
    if not callable(fn) and callable(ns.get("Solution")):
        fn = getattr(ns["Solution"](), name, None)
    if not callable(fn):
        return "error", f"NameError: no function or Solution method named {name!r}"
    got = fn(*copy.deepcopy(test["args"]))
    if _same(got, test["expected"]):
        return "pass", ""
    call = f"{name}({', '.join(_clip(_safe_repr(a), 40) for a in test['args'])})"
    return "fail", f"{call} returned {_clip(_safe_repr(got))}, expected {_clip(_safe_repr(test['expected']))}"


def _harness_main(report_fd: int) -> None:
    """Child entry point: read the spec from stdin, limit itself, run, report records."""
    spec = json.loads(sys.stdin.read())
    limits, timeout_s = spec["limits"], spec["limits"]["timeout_s"]
    stdin_fd = _memfd_with(spec.get("stdin", "").encode(), "stdin")
    os.dup2(stdin_fd, 0)  # the spec is gone from fd 0 before any generated code runs
    os.close(stdin_fd)
    sys.stdin = open(0, encoding="utf-8", closefd=False)

    def report(i: int, outcome: str, msg: str) -> None:
        os.write(report_fd, (json.dumps({"i": i, "outcome": outcome, "msg": msg}) + "\n").encode())

    def on_alarm(signum, frame):
        raise _TestTimeout()

    _supervise()  # from here on: the program's process
    _set_limits(limits)
    if spec["confine"]:
        try:
            _landlock_confine(os.getcwd())
        except OSError as e:  # never run the program unconfined by accident
            return report(-1, "crash", f"sandbox set-up failed: {e}")
    signal.signal(signal.SIGALRM, on_alarm)
    if limits["audit"]:
        sys.addaudithook(_audit)
    io_mode = spec["mode"] == "io"
    ns: dict[str, Any] = {"__name__": "__main__" if io_mode else "__solution__", "__builtins__": __builtins__}
    try:
        code = compile(spec["code"], "<solution>", "exec")
        _timed(lambda: exec(code, ns), timeout_s)
    except _TestTimeout:
        return report(-1, "timeout", f"limit {timeout_s:g} s")
    except SyntaxError as e:
        return report(-1, "error", f"SyntaxError: {e.msg} (solution line {e.lineno})")
    except SystemExit as e:
        if not io_mode or e.code not in (None, 0):
            return report(-1, "error", f"SystemExit({e.code!r})")
    except BaseException as e:  # anything the solution raises
        return report(-1, "error", _error_message(e))
    finally:
        sys.stdout.flush()
    report(-1, "pass", "")
    for k, test in enumerate(spec.get("tests", [])):
        try:
            if test["kind"] == "assert":
                outcome = _timed(lambda t=test: _run_assert(t["source"], ns), timeout_s)
            else:
                outcome = _timed(lambda t=test: _run_call(t, ns), timeout_s)
        except _TestTimeout:
            outcome = ("timeout", f"limit {timeout_s:g} s")
        except SyntaxError as e:
            outcome = ("error", f"SyntaxError in the test: {e.msg}")
        except BaseException as e:  # anything the solution raises, SystemExit included
            outcome = ("error", _error_message(e))
        report(k, *outcome)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--harness":
    _harness_main(int(sys.argv[2]))
