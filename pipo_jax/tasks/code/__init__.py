"""Code task: run generated Python against tests in a limited subprocess.

Reward = fraction of tests passed; feedback = the first failing test's assertion,
error or limit. Three test kinds: `AssertTest` (a Python statement such as
``assert add(1, 2) == 3``, run after the solution, its names those of the solution), `CallTest`
(call ``fn_name(*args)`` and compare with ``expected``, TACO/APPS "fn_name" style)
and `IOTest` (feed ``stdin``, compare stdout, one fresh process per test).

Who is trusted (the boundary against reward hacking):
- The *judge* (``code.py --harness``, started by the trainer) holds the tests, the expected
  values and the report fd; it runs the tests' own code and makes every comparison. It
  runs no generated code.
- The *runner* (``code.py --runner``, started by the judge as a fresh interpreter, not a
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
  the solution's own classes is an error: they are not plain data.
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
  ``SandboxConfig.allow_unconfined`` (trainer: ``task.sandbox_allow_unconfined``).
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
  seconds, size of any file written (``max_output_bytes``, stdout included), no core
  dumps, and ``max_processes``.
- Network (kernel-enforced): it runs in new user + network + PID namespaces (``unshare``):
  no network interfaces but a downed loopback. Where ``unshare`` is unusable, or with
  ``network="audit"``, the sandbox refuses to run generated code (`SandboxUnavailable`)
  unless ``SandboxConfig.allow_network`` (trainer: ``task.sandbox_allow_network``).
- Python-level (``audit_hook=True``): an audit hook raises PermissionError on
  socket creation/connection, process creation (fork, exec, spawn, subprocess,
  os.system), os.kill and setrlimit. It stops honest mistakes and accidental fork
  bombs; code using ctypes can get past it, so it is not a security boundary.
- The tests and expected outputs are never written where the program can read them.
- Rlimits are set inside the runner rather than in ``preexec_fn``, which is unsafe
  when the caller has threads (a JAX trainer does).

Linux only (memfd, namespaces, seccomp on x86_64 / aarch64). This file is also the judge and the
runner: they run ``python -I code.py --harness`` / ``--runner`` (``-I`` keeps this directory off
``sys.path``), so they import only the standard library.
"""
from __future__ import annotations

import ast
import builtins
import copy
import ctypes
import dataclasses
import decimal
import errno
import fractions
import functools
import importlib
import importlib.util
import itertools
import json
import logging
import math
import numbers
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
_RECORD_SLACK_S = 2.0  # harness overhead allowed between a test's time limit and its record
_SUPERVISOR_EXIT_S = 5.0  # time the judge gets to kill the runner's tree at a deadline


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
    memory_mb: address-space limit of the runner (the judge gets 512 MiB more).
    max_output_bytes: largest file the runner may write (its stdout included).
    max_processes: how many processes / threads the program may add: RLIMIT_NPROC is
      set to the user's count at start plus this (Linux counts every process and thread
      of the user). Where that limit does not bind (root, or CAP_SYS_ADMIN / CAP_SYS_RESOURCE)
      a pids cgroup of this size where one can be made, else a seccomp filter that forbids
      the program any new process (threads stay allowed, bounded by ``memory_mb``).
      0 = none of these: RLIMIT_NPROC unchanged, no cgroup, no filter.
    network: "auto" or "namespace" (a network namespace; where ``unshare`` is unusable the
      sandbox refuses to run, `SandboxUnavailable`, unless ``allow_network``) or "audit"
      (no namespace: needs ``allow_network``).
    audit_hook: block sockets, process creation, kill and setrlimit in Python.
    python: interpreter that runs the generated code.
    max_workers: parallel runs in `score_code_batch`.
    allow_unconfined: run generated code even where the kernel offers no Landlock
      (then the file system is open to it; a warning is logged once).
    allow_network: run generated code without a network namespace (``network="audit"``, or
      where ``unshare`` is unusable): then only the audit hook, which ctypes gets past, keeps
      it off the network (trainer: ``task.sandbox_allow_network``).
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
    allow_network: bool = False

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
    """The sandbox cannot confine generated code here (no Landlock, no network namespace,
    no process bound) and the config does not allow running it anyway."""


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


def check_process_bound(config: SandboxConfig) -> str:
    """What caps the program's processes: "none" (``max_processes=0``), "nproc" (RLIMIT_NPROC),
    or, where that does not bind this user (root), "cgroup" (a pids cgroup, where one can be
    made) or "seccomp" (no process at all); raises `SandboxUnavailable` where none can."""
    if not config.max_processes:
        return "none"
    if not nproc_exempt():
        return "nproc"
    if pids_cgroup_parent() is not None:
        return "cgroup"
    if not process_filter_available():
        raise SandboxUnavailable(
            f"RLIMIT_NPROC does not bind this user (root), no pids cgroup can be made and there is no process "
            f"filter for {os.uname().machine}, so a fork bomb would be unbounded; set SandboxConfig(max_processes=0) "
            "to run without a process cap")
    return "seccomp"


_PIDS_OVERHEAD = 2  # tasks of the sandbox itself in its pids cgroup: the judge, the runner (and unshare)
_cgroup_ids = itertools.count()


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per hierarchy ("" is cgroup v2), from /proc/self/cgroup."""
    with open("/proc/self/cgroup") as f:
        parts = [line.rstrip("\n").split(":", 2) for line in f]
    return {p[1]: p[2] for p in parts if len(p) == 3}


@functools.lru_cache(maxsize=None)
def pids_cgroup_parent() -> str | None:
    """A cgroup directory below which this process can make pids cgroups (cgroup v1's pids
    hierarchy, or v2 with pids enabled for children; where cgroupfs is writable, e.g. root
    outside a container), or None."""
    try:
        own = _own_cgroups()
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    for fields in mounts:
        sep = fields.index("-")
        fstype, root, point, opts = fields[sep + 1], fields[3].rstrip("/"), fields[4], fields[sep + 3].split(",")
        if fstype == "cgroup" and "pids" in opts:
            path = next((p for c, p in own.items() if "pids" in c.split(",")), None)
        elif fstype == "cgroup2":
            path = own.get("")
        else:
            continue
        if path is None or not (path + "/").startswith(root + "/"):
            continue
        parent = os.path.join(point, path[len(root):].lstrip("/"))
        if _can_make_pids_cgroup(parent):
            return parent
    return None


_ENTER_CGROUP = 'echo $$ > "$0/cgroup.procs" && exec "$@"'  # sh -c: enter cgroup $0, become "$@"


def _can_make_pids_cgroup(parent: str) -> bool:
    """Whether a pids cgroup can be made below `parent` and a process can enter it."""
    try:
        path = _new_pids_cgroup(parent, 4)
    except OSError:
        return False
    try:
        entered = subprocess.run(["/bin/sh", "-c", _ENTER_CGROUP, path, "true"], capture_output=True, timeout=10)
        return entered.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        _remove_cgroup(path)


def _new_pids_cgroup(parent: str, limit: int) -> str:
    """A fresh cgroup below `parent` that holds at most `limit` tasks (processes and threads)."""
    path = os.path.join(parent, f"pipo_sandbox_{os.getpid()}_{next(_cgroup_ids)}")
    os.mkdir(path)
    try:
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(limit))
    except OSError:
        _remove_cgroup(path)
        raise
    return path


def _remove_cgroup(path: str) -> None:
    """Removes the (emptied) cgroup; its killed tasks may take a moment to leave it."""
    delay = 0.001
    for _ in range(40):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
    logger.warning("could not remove the sandbox's pids cgroup %s", path)


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


def check_network_isolation(config: SandboxConfig) -> bool:
    """True when generated code will run in its own network (and user, PID) namespace; False
    where it runs without one, which needs ``config.allow_network``; else raises
    `SandboxUnavailable`."""
    if config.network != "audit" and namespaces_available():
        return True
    if config.network == "namespace":
        raise SandboxUnavailable("SandboxConfig.network='namespace' but 'unshare --user --net --pid' is not "
                                 "usable here")
    if not config.allow_network:
        why = ("network='audit' runs it without a network namespace" if config.network == "audit" else
               "'unshare --user --net --pid' is not usable here, so there is no network namespace")
        raise SandboxUnavailable(
            f"the code sandbox cannot keep generated programs off the network: {why} (the audit hook alone "
            "is no boundary); refusing to run them. Set SandboxConfig(allow_network=True) (trainer: "
            "--config.task.sandbox_allow_network=true) to run them anyway")
    _warn_no_namespaces()
    return False


@functools.lru_cache(maxsize=None)
def _warn_no_namespaces() -> None:
    logger.warning("generated code runs without a network namespace: only the audit hook keeps it off the "
                   "network (allow_network=True)")


def nproc_exempt() -> bool:
    """Whether RLIMIT_NPROC does not bind this process's children: root, or CAP_SYS_ADMIN /
    CAP_SYS_RESOURCE in its effective set (Linux `copy_process`)."""
    if os.getuid() == 0:
        return True
    try:
        with open("/proc/self/status") as f:
            caps = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return False
    return bool(caps & (1 << 21 | 1 << 24))


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
    namespace before `unshare` returns), or SIGTERM the judge (it kills the runner's
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
    """Wait for the judge while it makes progress; then kill its whole process group.

    The judge has ``startup_s + timeout_s`` to start and define the solution, and
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
    confine, bound = check_confinement(config), check_process_bound(config)
    cmd = [config.python, "-I", "-X", "utf8", os.path.abspath(__file__), "--harness"]
    namespaced = check_network_isolation(config)
    if namespaced:
        cmd = [shutil.which("unshare"), *_UNSHARE_FLAGS, *cmd]
    cgroup = None
    if bound == "cgroup":
        try:
            cgroup = _new_pids_cgroup(pids_cgroup_parent(), config.max_processes + _PIDS_OVERHEAD + namespaced)
        except OSError as e:
            if not process_filter_available():
                raise SandboxUnavailable(f"could not make the sandbox's pids cgroup: {e}") from e
            bound = "seccomp"
    if cgroup is not None:  # the shell enters the cgroup, then becomes the sandbox: no task starts outside
        cmd = ["/bin/sh", "-c", _ENTER_CGROUP, cgroup, *cmd]
    spec = dict(spec, confine=confine, no_processes=bound == "seccomp")
    try:
        return _run_harness(spec, cmd, config, namespaced)
    finally:
        if cgroup is not None:
            _remove_cgroup(cgroup)


def _run_harness(spec: dict, cmd: list[str], config: SandboxConfig, namespaced: bool
                 ) -> tuple[list[dict], bytes, int, bool]:
    """Runs `cmd` (the judge) on `spec` in a fresh scratch directory; what `_launch` returns."""
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


def _ended_badly(rc: int | None, killed: bool, timeout_s: float, max_output_bytes: int) -> tuple[str, str]:
    """(outcome, message) for a process that stopped before reporting a test."""
    if killed:
        return "timeout", f"limit {timeout_s:g} s"
    if rc is not None and rc < 0:
        if -rc == signal.SIGXCPU:
            return "timeout", "CPU time limit"
        if -rc == signal.SIGXFSZ:
            return "crash", f"output limit of {max_output_bytes} bytes exceeded"
        try:
            return "crash", signal.Signals(-rc).name
        except ValueError:
            return "crash", f"signal {-rc}"
    return "crash", f"exited with status {rc}"


def _run_in_process_tests(code: str, tests: Sequence[Test], config: SandboxConfig
                          ) -> tuple[list[tuple[str, str]], tuple[str, str] | None]:
    """Assert/call tests, all in one judge and its runner.

    Returns ((outcome, message) per test, definition failure or None). Record -1 is
    defining the solution; if that fails every test gets its outcome. The judge reports
    the runner's end itself; a judge killed by the deadline during test k gives k that
    outcome, later tests "not_run".
    """
    spec = {"mode": "functions", "code": code, "tests": [_test_record(t) for t in tests],
            "limits": _limits(config, len(tests) + 1)}
    records, _, rc, killed = _launch(spec, config)
    by_index = {r["i"]: (r["outcome"], r["msg"]) for r in records}
    definition = by_index.get(-1) or _ended_badly(rc, killed, config.timeout_s, config.max_output_bytes)
    if definition[0] != "pass":
        return [definition] * len(tests), definition
    out: list[tuple[str, str]] = []
    for k in range(len(tests)):
        if k in by_index:
            out.append(by_index[k])
        elif k == len(by_index) - 1:  # the test that was running when the judge stopped
            out.append(_ended_badly(rc, killed, config.timeout_s, config.max_output_bytes))
        else:
            out.append(("not_run", "not run"))
    return out, None


def _run_io_test(code: str, test: IOTest, config: SandboxConfig) -> tuple[str, str]:
    spec = {"mode": "io", "code": code, "stdin": test.stdin, "limits": _limits(config, 1)}
    records, stdout_bytes, rc, killed = _launch(spec, config)
    if not records:
        return _ended_badly(rc, killed, config.timeout_s, config.max_output_bytes)
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
    return {"timeout_s": config.timeout_s, "startup_s": config.startup_s, "memory": config.memory_mb * 2**20,
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
    """SIGTERM to the judge: the parent's deadline passed."""


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


# seccomp (uapi <linux/seccomp.h>, <linux/filter.h>): the audit arch and process-creating
# syscalls of each supported machine; 32-bit (and x32) syscalls are refused altogether.
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_PROCESS_SYSCALLS = {"x86_64": {"clone": 56, "fork": 57, "vfork": 58, "clone3": 435},
                     "aarch64": {"clone": 220, "clone3": 435}}
_CLONE_THREAD = 0x00010000
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JSET_K, _BPF_RET_K = 0x20, 0x15, 0x45, 0x06
_SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def process_filter_available() -> bool:
    """Whether `_forbid_new_processes` knows this machine's syscall numbers."""
    return os.uname().machine in _AUDIT_ARCH


def _no_process_program(machine: str) -> list[tuple[int, int, int, int]]:
    """BPF: fork / vfork / clone without CLONE_THREAD fail with EAGAIN; clone3 (its flags are
    behind a pointer) with ENOSYS, so libc falls back to clone; other ABIs' syscalls with ENOSYS."""
    nrs = _PROCESS_SYSCALLS[machine]

    def deny(err):
        return (_BPF_RET_K, 0, 0, _SECCOMP_RET_ERRNO | err)

    prog = [(_BPF_LD_W_ABS, 0, 0, 4), (_BPF_JEQ_K, 1, 0, _AUDIT_ARCH[machine]), deny(errno.ENOSYS),
            (_BPF_LD_W_ABS, 0, 0, 0)]
    if machine == "x86_64":
        prog += [(_BPF_JSET_K, 0, 1, 0x40000000), deny(errno.ENOSYS)]  # the x32 ABI
    prog += [(_BPF_JEQ_K, 0, 1, nrs["clone3"]), deny(errno.ENOSYS)]
    for name in ("fork", "vfork"):
        if name in nrs:
            prog += [(_BPF_JEQ_K, 0, 1, nrs[name]), deny(errno.EAGAIN)]
    # clone: allowed only with CLONE_THREAD in its flags (args[0], low word at offset 16)
    prog += [(_BPF_JEQ_K, 0, 3, nrs["clone"]), (_BPF_LD_W_ABS, 0, 0, 16), (_BPF_JSET_K, 1, 0, _CLONE_THREAD),
             deny(errno.EAGAIN), (_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW)]
    return prog


def _forbid_new_processes() -> None:
    """Kernel-enforced: this process and its threads can start no process (threads stay
    allowed, bounded by the address-space limit). For users RLIMIT_NPROC does not bind (root)."""
    libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    prog = _no_process_program(os.uname().machine)
    insns = (_SockFilter * len(prog))(*[_SockFilter(*i) for i in prog])
    fprog = _SockFprog(len(prog), insns)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def _error_message(e: BaseException) -> str:
    line = ""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if frame.filename == "<solution>":
            line = f" (solution line {frame.lineno})"
            break
    if isinstance(e, OSError) and e.errno == errno.EFBIG:  # RLIMIT_FSIZE (Python ignores SIGXFSZ)
        return f"output limit exceeded: {e.strerror}{line}"
    try:
        detail = str(e)
    except Exception:  # a solution's exception whose __str__ fails
        detail = "<unprintable>"
    text = f"{type(e).__name__}: {detail}" if detail else type(e).__name__
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


def _safe_repr(x: Any) -> str:
    try:
        return repr(x)
    except Exception as e:  # a user __repr__ may itself fail
        return f"<unprintable {type(x).__name__}: {type(e).__name__}>"




# ----------------------------------------------------------------------------------
# Plain data across the judge / runner boundary (both sides)
# ----------------------------------------------------------------------------------

_MAX_DEPTH = 200  # nesting of one encoded value
_MAX_MESSAGE_BYTES = 1 << 24  # one runner reply


class NotPlain(TypeError):
    """A value with no plain-data encoding."""


def _encode(x: Any, other, depth: int = 0) -> list:
    """`x` as tagged JSON: None, bool, int, float, complex, Fraction, Decimal, str, bytes, list,
    tuple, set, frozenset, dict (subclasses and numpy values as their plain value); anything else is
    ``other(x)`` (a handle on the runner's side, an error on the judge's)."""
    if depth > _MAX_DEPTH:
        raise NotPlain(f"a value nested deeper than {_MAX_DEPTH} levels")

    def enc(v):
        return _encode(v, other, depth + 1)

    if x is None:
        return ["n"]
    if isinstance(x, bool):
        return ["b", bool(x)]
    if type(x).__module__ == "numpy" and hasattr(x, "tolist"):
        return enc(x.tolist())
    if isinstance(x, numbers.Integral):
        return ["i", format(int(x), "x")]  # hex: no int/str digit limit
    if isinstance(x, fractions.Fraction):
        return ["q", format(x.numerator, "x"), format(x.denominator, "x")]
    if isinstance(x, decimal.Decimal):
        return ["D", str(decimal.Decimal(x))]
    if isinstance(x, numbers.Real):
        return ["f", float(x).hex()]
    if isinstance(x, complex):
        return ["c", x.real.hex(), x.imag.hex()]
    if isinstance(x, str):
        return ["s", str.__str__(x)]
    if isinstance(x, (bytes, bytearray)):
        return ["y", bytes(x).hex()]
    for cls, tag in ((list, "l"), (tuple, "t"), (set, "S"), (frozenset, "F")):
        if isinstance(x, cls):
            return [tag, [enc(v) for v in cls.__iter__(x)]]
    if isinstance(x, dict):
        return ["d", [[enc(k), enc(v)] for k, v in dict.items(x)]]
    return other(x)


def _decode(v: Any, ref, depth: int = 0) -> Any:
    """The value `_encode` wrote, built from builtin types only (``ref`` decodes "h" / "r"
    entries); ValueError on anything malformed."""
    if depth > _MAX_DEPTH or not isinstance(v, list) or not v or not isinstance(v[0], str):
        raise ValueError("malformed value")
    tag, args = v[0], v[1:]

    def dec(w):
        return _decode(w, ref, depth + 1)

    def one(kind):
        if len(args) != 1 or not isinstance(args[0], kind):
            raise ValueError(f"malformed {tag!r} value")
        return args[0]

    if tag == "n" and not args:
        return None
    if tag == "b":
        return one(bool)
    if tag == "i":
        return int(one(str), 16)
    if tag == "f":
        return float.fromhex(one(str))
    if tag in ("c", "q") and len(args) == 2 and all(isinstance(a, str) for a in args):
        if tag == "c":
            return complex(float.fromhex(args[0]), float.fromhex(args[1]))
        return fractions.Fraction(int(args[0], 16), int(args[1], 16))
    if tag == "D":
        return decimal.Decimal(one(str))
    if tag == "s":
        return one(str)
    if tag == "y":
        return bytes.fromhex(one(str))
    builders = {"l": list, "t": tuple, "S": set, "F": frozenset}
    try:
        if tag in builders:
            return builders[tag](dec(w) for w in one(list))
        if tag == "d":
            pairs = one(list)
            if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise ValueError("malformed dict")
            return {dec(k): dec(w) for k, w in pairs}
    except TypeError as e:  # an unhashable set element or dict key
        raise ValueError(f"malformed {tag!r} value: {e}") from None
    return ref(v)


class _Broken(Exception):
    """The runner broke the protocol (garbage, an unknown reply, a reply over the size limit)."""


class _Pipe:
    """One JSON object per line over a pair of pipe fds."""

    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd, self.buf = read_fd, write_fd, bytearray()

    def send(self, obj: dict) -> None:
        data = memoryview((json.dumps(obj) + "\n").encode())
        while data:
            data = data[os.write(self.write_fd, data):]

    def recv(self, limit: float = _MAX_MESSAGE_BYTES) -> dict:
        """The next message; EOFError when the other side is gone."""
        scanned = 0
        while (end := self.buf.find(b"\n", scanned)) < 0:
            if len(self.buf) > limit:
                raise _Broken(f"a message over {limit} bytes")
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                raise EOFError
            scanned = len(self.buf)
            self.buf += chunk
        line, self.buf = bytes(self.buf[:end]), self.buf[end + 1:]
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise _Broken(f"unreadable message: {_clip(repr(line), 60)}") from e
        if not isinstance(msg, dict):
            raise _Broken("a message that is not an object")
        return msg


# ----------------------------------------------------------------------------------
# The runner: the only process that runs generated code. It holds the code and the
# arguments of the request in hand; never the tests, expected values or the report fd.
# ----------------------------------------------------------------------------------

def _on_alarm(signum, frame):
    raise _TestTimeout()


def _define(code: str, ns: dict, io_mode: bool, timeout_s: float) -> list | None:
    """Runs the solution in `ns`; None, or [outcome, message] when that failed."""
    try:
        compiled = compile(code, "<solution>", "exec")
        _timed(lambda: exec(compiled, ns), timeout_s)
    except _TestTimeout:
        return ["timeout", f"limit {timeout_s:g} s"]
    except SyntaxError as e:
        return ["error", f"SyntaxError: {e.msg} (solution line {e.lineno})"]
    except SystemExit as e:
        if not io_mode or e.code not in (None, 0):
            return ["error", f"SystemExit({e.code!r})"]
    except BaseException as e:  # anything the solution raises
        return ["error", _error_message(e)]
    finally:
        sys.stdout.flush()
    return None


class _Objects:
    """The runner's table of objects the judge holds handles to."""

    def __init__(self, ns: dict):
        self.ns, self.items = ns, []

    def handle(self, x: Any) -> list:
        self.items.append(x)
        return ["h", len(self.items) - 1, type(x).__name__]

    def ref(self, v: list) -> Any:
        if v[0] != "r" or len(v) != 2 or not isinstance(v[1], int) or not 0 <= v[1] < len(self.items):
            raise ValueError("malformed reference")
        return self.items[v[1]]

    def perform(self, req: dict) -> Any:
        """One operation of the judge's on the solution's objects."""
        op = req["op"]
        if op == "name":
            return self.ns[req["name"]]  # KeyError: not defined
        obj = self.items[req["ref"]]
        if op == "call":
            args = [_decode(a, self.ref) for a in req["args"]]
            kwargs = {k: _decode(a, self.ref) for k, a in req["kwargs"].items()}
            return obj(*args, **kwargs)
        if op == "getattr":
            return getattr(obj, req["name"])
        if op == "getitem":
            return obj[_decode(req["key"], self.ref)]
        return {"list": list, "len": len, "bool": bool, "str": str}[op](obj)


def _serve(objects: _Objects, req: dict) -> dict:
    """Performs `req` under its time budget; the reply: {"ok": encoded value} or
    {"err": [outcome, message, exception type]}."""
    try:
        return {"ok": _timed(lambda: _encode(objects.perform(req), objects.handle), req["budget"])}
    except _TestTimeout:
        return {"err": ["timeout", "", ""]}
    except KeyError as e:
        if req["op"] == "name":
            return {"err": ["unbound", "", ""]}
        return {"err": ["error", _error_message(e), type(e).__name__]}
    except BaseException as e:  # anything the solution raises, SystemExit included
        return {"err": ["error", _error_message(e), type(e).__name__]}


def _runner_main(request_fd: int, reply_fd: int) -> None:
    """Runner entry point: set-up from the judge, then limit and confine itself, define the
    solution and answer the judge's requests until the request pipe closes."""
    pipe = _Pipe(request_fd, reply_fd)
    setup = pipe.recv(math.inf)
    limits = setup["limits"]
    try:
        _set_limits(limits)
        if setup["confine"]:
            _landlock_confine(os.getcwd())
        if setup["no_processes"]:
            _forbid_new_processes()
    except OSError as e:  # never run the program unconfined by accident
        return pipe.send({"id": 0, "err": ["crash", f"sandbox set-up failed: {e}", ""]})
    signal.signal(signal.SIGALRM, _on_alarm)
    if limits["audit"]:
        sys.addaudithook(_audit)
    io_mode = setup["mode"] == "io"
    ns: dict[str, Any] = {"__name__": "__main__" if io_mode else "__solution__", "__builtins__": __builtins__}
    failed = _define(setup.pop("code"), ns, io_mode, limits["timeout_s"])
    pipe.send({"id": 0, "err": failed + [""]} if failed else {"id": 0, "ok": ["n"]})
    objects = _Objects(ns)
    while True:
        try:
            req = pipe.recv(math.inf)  # the judge's requests: any size
        except EOFError:
            os._exit(0)
        pipe.send(dict(_serve(objects, req), id=req["id"]))


# ----------------------------------------------------------------------------------
# The judge: holds the tests, the expected values and the report fd; runs the tests'
# own code, reaching the solution only through `_Remote` handles that carry plain data.
# ----------------------------------------------------------------------------------

_JUDGE_SLACK_S = 0.5  # how long past a test's limit the judge waits for a runner that ignores its timer


class _RunnerGone(BaseException):
    """The runner ended (or was killed) during a request; `outcome` says how. A BaseException,
    so a test's ``except Exception`` cannot turn a runner that exits into a pass."""

    def __init__(self, outcome: tuple[str, str]):
        super().__init__(outcome[1])
        self.outcome = outcome


class _Runner:
    """The runner process seen from the judge: requests, their deadlines, its end."""

    def __init__(self, limits: dict):
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        cmd = [sys.executable, "-I", "-X", "utf8", os.path.abspath(__file__), "--runner", str(request_r), str(reply_w)]
        # A fresh interpreter (not a fork of this one: nothing of the tests is in its memory);
        # it inherits stdin / stdout and the two pipe ends, never the report fd.
        self.proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, pass_fds=(request_r, reply_w))
        os.close(request_r)
        os.close(reply_w)
        self.pipe, self.limits, self.next_id = _Pipe(reply_r, request_w), limits, 0
        self.gone: tuple[str, str] | None = None

    def request(self, req: dict, budget_s: float) -> dict:
        """Sends `req`, returns its reply; raises `_RunnerGone` when the runner ends first."""
        if self.gone is not None:
            raise _RunnerGone(self.gone)
        req = dict(req, id=self.next_id, budget=max(budget_s, 1e-3))
        self.next_id += 1
        try:
            self.pipe.send(req)
            while (reply := self.pipe.recv()).get("id") != req["id"]:
                pass  # a late reply to a request given up on
            return reply
        except _TestTimeout:  # the runner ignored its own timer: end it
            self.end(("timeout", f"limit {self.limits['timeout_s']:g} s"))
            raise
        except (EOFError, BrokenPipeError):
            self.end(None)
            raise _RunnerGone(self.gone) from None
        except _Broken as e:
            self.end(("crash", f"the program broke the sandbox's protocol: {e}"))
            raise _RunnerGone(self.gone) from None

    def end(self, outcome: tuple[str, str] | None) -> None:
        """Kills the runner (no-op if gone); `outcome` (default: how it ended) marks it gone."""
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        rc = self.proc.wait()
        self.gone = outcome or _ended_badly(rc, False, self.limits["timeout_s"], self.limits["fsize"])


class _Remote:
    """An object of the solution's, in the runner. The tests may call it, read its attributes
    and items, iterate it, take its len / str / truth (the solution's own answer); they never
    compare it (==, <, in ...): a comparison must be of plain data, made here."""

    __slots__ = ("_judge", "_ref", "_type")

    def __init__(self, judge: "_Judge", ref: int, type_name: str):
        object.__setattr__(self, "_judge", judge)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_type", type_name)

    def _op(self, op: str, **kw) -> Any:
        return self._judge.op(dict(kw, op=op, ref=self._ref))

    def __call__(self, *args, **kwargs):
        return self._op("call", args=[self._judge.encode(a) for a in args],
                        kwargs={k: self._judge.encode(v) for k, v in kwargs.items()})

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._op("getattr", name=name)

    def __getitem__(self, key):
        return self._op("getitem", key=self._judge.encode(key))

    def __iter__(self):
        return iter(self._op("list"))

    def __len__(self):
        return self._op("len")

    def __bool__(self):
        return self._op("bool")

    def __str__(self):
        return self._op("str")

    def __repr__(self):
        return f"<{self._type} object of the solution>"

    def _compared(self, other):
        raise TypeError(f"the solution's {self._type} object is not plain data (None, bool, int, float, str, "
                        "bytes, list, tuple, dict, set), so the tests do not compare it")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _compared
    __hash__ = object.__hash__


class _Namespace(dict):
    """The tests' globals: builtins, and standard-library modules the tests use as modules
    (``math.isclose``), are the judge's own: a solution cannot redefine them for the tests.
    Any other name is fetched from the runner."""

    def __init__(self, judge: "_Judge", modules: set[str]):
        super().__init__(__name__="__test__", __builtins__=builtins)
        self.judge, self.modules = judge, modules

    def __missing__(self, name: str):
        if hasattr(builtins, name):
            raise KeyError(name)  # Python then looks in builtins
        if name in self.modules:
            value = importlib.import_module(name)
        else:
            value = self.judge.op({"op": "name", "name": name})  # KeyError when the solution has no `name`
        self[name] = value
        return value


def _modules_used(tests: list[dict]) -> set[str]:
    """Standard-library module names the assert tests use as modules (``name.attribute``)."""
    out = set()
    for test in tests:
        try:
            tree = ast.parse(test.get("source", ""))
        except SyntaxError:
            continue
        out |= {node.value.id for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name) and node.value.id in sys.stdlib_module_names}
    return {name for name in out if importlib.util.find_spec(name) is not None}


class _Judge:
    """Turns test code's operations on the solution into runner requests within the
    current test's time limit."""

    def __init__(self, runner: _Runner):
        self.runner, self.deadline = runner, math.inf

    def encode(self, x: Any) -> list:
        def other(v):
            if isinstance(v, _Remote):
                return ["r", v._ref]
            raise NotPlain(f"the test passes a {type(v).__name__} to the solution; only plain data "
                           "and the solution's own objects cross the sandbox boundary")
        return _encode(x, other)

    def op(self, req: dict) -> Any:
        reply = self.runner.request(req, self.deadline - time.monotonic())
        if "ok" in reply:
            try:
                return _decode(reply["ok"], self._handle)
            except (ValueError, TypeError, RecursionError, OverflowError) as e:
                self.runner.end(("crash", f"the program broke the sandbox's protocol: {e}"))
                raise _RunnerGone(self.runner.gone) from None
        outcome, msg, exc_type = (list(reply.get("err", [])) + ["", "", ""])[:3]
        if outcome == "timeout":
            raise _TestTimeout()
        if outcome == "unbound":
            raise KeyError(req.get("name"))
        raise _solution_error(str(exc_type), str(msg))

    def _handle(self, v: list) -> _Remote:
        if v[0] != "h" or len(v) != 3 or not isinstance(v[1], int) or not isinstance(v[2], str):
            raise ValueError("malformed handle")
        return _Remote(self, v[1], v[2])


def _solution_error(type_name: str, msg: str) -> Exception:
    """The exception the solution raised, as the builtin exception of that name where there
    is one (so a test's ``except ValueError`` works); `sandbox_msg` is the feedback text."""
    cls = getattr(builtins, type_name, None)
    e = None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            e = cls(msg)
        except Exception:
            e = None
    if e is None:
        e = RuntimeError(msg)
    e.sandbox_msg = _clip_text(msg)
    return e


def _run_assert(source: str, ns: _Namespace) -> tuple[str, str]:
    """An assert test, run here; ``assert a == b`` feedback names what `a` was."""
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


def _run_call(test: dict, ns: _Namespace) -> tuple[str, str]:
    name = test["fn_name"]
    fn = _solution_name(ns, name)
    if not isinstance(fn, _Remote) and isinstance(solution := _solution_name(ns, "Solution"), _Remote):
        fn = getattr(solution(), name, None)
    if not isinstance(fn, _Remote):
        return "error", f"NameError: no function or Solution method named {name!r}"
    got = fn(*copy.deepcopy(test["args"]))
    call = f"{name}({', '.join(_clip(_safe_repr(a), 40) for a in test['args'])})"
    if _holds_remote(got):
        return "fail", f"{call} returned {_clip(_safe_repr(got))}, which is not plain data"
    if _same(got, test["expected"]):
        return "pass", ""
    return "fail", f"{call} returned {_clip(_safe_repr(got))}, expected {_clip(_safe_repr(test['expected']))}"


def _solution_name(ns: _Namespace, name: str) -> Any:
    """What the solution bound to `name` (None if nothing), builtin names included."""
    try:
        return ns.judge.op({"op": "name", "name": name})
    except KeyError:
        return None


def _holds_remote(x: Any) -> bool:
    if isinstance(x, _Remote):
        return True
    if isinstance(x, dict):
        return any(_holds_remote(k) or _holds_remote(v) for k, v in x.items())
    return isinstance(x, (list, tuple, set, frozenset)) and any(_holds_remote(v) for v in x)


def _run_test(test: dict, ns: _Namespace) -> tuple[str, str]:
    """(outcome, message) of one test; the solution's errors are "error", with its message."""
    try:
        return _run_assert(test["source"], ns) if test["kind"] == "assert" else _run_call(test, ns)
    except (_TestTimeout, _Terminate):
        raise
    except _RunnerGone as e:
        return e.outcome
    except SyntaxError as e:
        return "error", f"SyntaxError in the test: {e.msg}"
    except BaseException as e:  # what the solution raised (relayed), or the test's own error
        return "error", getattr(e, "sandbox_msg", None) or _error_message(e)


def _judge_tests(spec: dict, runner: _Runner, report) -> None:
    """Defines the solution in the runner (record -1), then runs each test here (record k);
    after a runner's end the remaining tests are "not_run"."""
    limits = spec["limits"]
    timeout_s = limits["timeout_s"]
    judge = _Judge(runner)
    setup = {"op": "setup", "limits": limits, "confine": spec["confine"], "no_processes": spec["no_processes"],
             "mode": spec["mode"], "code": spec["code"]}
    try:
        reply = _timed(lambda: runner.request(setup, timeout_s), limits["startup_s"] + timeout_s + _JUDGE_SLACK_S)
    except _TestTimeout:
        return report(-1, "timeout", f"limit {timeout_s:g} s")
    except _RunnerGone as e:
        return report(-1, *e.outcome)
    if "ok" not in reply:
        outcome, msg = (list(reply.get("err", [])) + ["crash", ""])[:2]
        return report(-1, outcome if outcome in ("error", "timeout", "crash") else "crash", _clip_text(str(msg)))
    report(-1, "pass", "")
    tests = spec.get("tests", [])
    ns = _Namespace(judge, _modules_used(tests))
    for k, test in enumerate(tests):
        if runner.gone is not None:
            report(k, "not_run", "not run")
            continue
        judge.deadline = time.monotonic() + timeout_s
        try:
            outcome = _timed(lambda t=test: _run_test(t, ns), timeout_s + _JUDGE_SLACK_S)
        except _TestTimeout:
            outcome = ("timeout", f"limit {timeout_s:g} s")
        report(k, *outcome)


def _judge_main(report_fd: int) -> None:
    """Harness entry point (the judge): read the spec from stdin, start the runner, judge,
    kill whatever the runner left behind."""
    spec = json.loads(sys.stdin.read())
    stdin_fd = _memfd_with(spec.get("stdin", "").encode(), "stdin")
    os.dup2(stdin_fd, 0)  # the runner's stdin: the test's input, never the spec
    os.close(stdin_fd)

    def report(i: int, outcome: str, msg: str) -> None:
        os.write(report_fd, (json.dumps({"i": i, "outcome": outcome, "msg": msg}) + "\n").encode())

    namespaced = os.getpid() == 1  # PID 1 of a namespace: its end kills every process in it
    if not namespaced:
        _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGTERM, _on_terminate)
    signal.signal(signal.SIGALRM, _on_alarm)
    runner = None
    try:
        runner = _Runner(spec["limits"])
        judge_memory = spec["limits"]["memory"] + (512 << 20)  # decoded replies, the tests' own data
        resource.setrlimit(resource.RLIMIT_AS, (judge_memory, judge_memory))
        _judge_tests(spec, runner, report)
    except _Terminate:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if runner is not None and runner.gone is None:
            runner.end(("not_run", ""))
        if not namespaced:
            _kill_tree()
    os._exit(0)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--harness":
    _judge_main(int(sys.argv[2]))
elif __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--runner":
    _runner_main(int(sys.argv[2]), int(sys.argv[3]))
