"""Code task: run generated Python against tests in a limited subprocess.

Reward = fraction of tests passed; feedback = the first failing test's assertion,
error or limit. Three test kinds: `AssertTest` (a Python statement such as
``assert add(1, 2) == 3``, run after the solution in its namespace), `CallTest`
(call ``fn_name(*args)`` and compare with ``expected``, TACO/APPS "fn_name" style)
and `IOTest` (feed ``stdin``, compare stdout, one fresh process per test).

Isolation of the child (what is guaranteed):
- Kernel-enforced: it runs in a fresh session (the parent kills its whole process
  group on exit or timeout); wall-clock limits (``startup_s + timeout_s`` to start
  and define the solution, then ``timeout_s`` + 1 s per test, enforced by the parent
  even if the program swallows the in-process timer); rlimits set by the harness
  before any generated code runs: address space (``memory_mb``, so allocations fail
  with MemoryError), total CPU seconds, size of any file written
  (``max_output_bytes``, stdout included), no core dumps, and optionally
  ``max_processes``. With ``network="namespace"`` (or
  "auto" where ``unshare`` works) it runs in new user + network + PID namespaces:
  no network interfaces but a downed loopback, and killing the namespace's first
  process kills every process the program started.
- Python-level (``audit_hook=True``): an audit hook raises PermissionError on
  socket creation/connection, process creation (fork, exec, spawn, subprocess,
  os.system), os.kill and setrlimit. It stops honest mistakes and accidental fork
  bombs; code using ctypes can get past it, so it is not a security boundary.
- Not isolated: the file system (the program runs with the caller's permissions in
  a fresh temporary working directory that is deleted afterwards). The tests and
  expected outputs are never written where the program can read them.
- Rlimits are set inside the child rather than in ``preexec_fn``, which is unsafe
  when the caller has threads (a JAX trainer does).

Linux only (memfd, namespaces). This file is also the child's harness: the child runs ``python -I code.py --harness``
(``-I`` keeps this directory off ``sys.path``), so it imports only the standard library.
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import errno
import functools
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Union

logger = logging.getLogger(__name__)

_FEEDBACK_CHARS = 300
_RECORD_SLACK_S = 1.0  # harness overhead allowed between a test's time limit and its record


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
    max_processes: RLIMIT_NPROC of the child (0 = leave unchanged). Linux counts
      every process and thread of the user against it and ignores it for root.
    network: "auto" (namespace if available, else audit hook only), "namespace"
      (require unshare; error if unavailable) or "audit".
    audit_hook: block sockets, process creation, kill and setrlimit in Python.
    python: interpreter that runs the generated code.
    max_workers: parallel runs in `score_code_batch`.
    """

    timeout_s: float = 5.0
    startup_s: float = 10.0
    memory_mb: int = 1024
    max_output_bytes: int = 1 << 20
    max_processes: int = 0
    network: str = "auto"
    audit_hook: bool = True
    python: str = sys.executable
    max_workers: int = 1

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


def _wait_or_kill(proc: subprocess.Popen, config: SandboxConfig, progress_fd: int) -> bool:
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
    cmd = [config.python, "-I", "-X", "utf8", os.path.abspath(__file__), "--harness"]
    if _use_namespaces(config):
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
            killed = _wait_or_kill(proc, config, results_fd)
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


def _set_limits(limits: dict) -> None:
    import resource

    for res, value in ((resource.RLIMIT_AS, limits["memory"]), (resource.RLIMIT_CPU, limits["cpu_s"]),
                       (resource.RLIMIT_FSIZE, limits["fsize"]), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (value, value))
    if limits["nproc"]:
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["nproc"], limits["nproc"]))


def _error_message(e: BaseException) -> str:
    import traceback

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

    _set_limits(limits)
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
