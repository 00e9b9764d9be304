"""The judge: holds the tests, the expected values and the report fd; runs the tests' own code,
reaching the solution only through `_Remote` handles that carry plain data. Started by the
trainer as ``python -I child.py --harness``; standard library only."""
from __future__ import annotations

import ast
import builtins
import copy
import importlib
import importlib.util
import json
import math
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from pipo_jax.tasks.code import sandbox
from pipo_jax.tasks.code.child_script import CHILD_SCRIPT
from pipo_jax.tasks.code.feedback import _clip, _clip_text, _ended_badly, _error_message, _safe_repr
from pipo_jax.tasks.code.names import unimported_helpers, unimported_message
from pipo_jax.tasks.code.protocol import NotPlain, _Broken, _decode, _encode, _memfd_with, _Pipe
from pipo_jax.tasks.code.timer import _on_alarm, _on_terminate, _Terminate, _TestTimeout, _timed


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
        cmd = [sys.executable, "-I", "-X", "utf8", CHILD_SCRIPT, "--runner", str(request_r), str(reply_w)]
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


class SolutionError(Exception):
    """An exception of the solution's, relayed where the builtin of its name would steer the
    test instead of failing it (`_CONTROL_FLOW`, and what is no Exception: SystemExit,
    KeyboardInterrupt, GeneratorExit): to the test it is an ordinary error."""


# Exceptions the interpreter takes for the end of an iteration: relayed as such, a StopIteration
# ends the test's ``map`` or ``any`` early (``all(map(f, xs))`` holds, whatever `f` returns).
_CONTROL_FLOW = (StopIteration, StopAsyncIteration)


def _solution_error(type_name: str, msg: str) -> Exception:
    """The exception the solution raised, as the builtin exception of that name where that is
    an ordinary error (so a test's ``except ValueError`` works), else a `SolutionError`;
    `sandbox_msg` is the feedback text."""
    cls = getattr(builtins, type_name, None)
    e = None
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, _CONTROL_FLOW):
        try:
            e = cls(msg)
        except Exception:
            e = None
    if e is None:
        e = SolutionError(msg)
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
        if spec["mode"] == "io" and runner.proc.returncode == 0:  # a whole program that ended with os._exit(0)
            return report(-1, "pass", "")
        return report(-1, *e.outcome)
    if "ok" not in reply:
        outcome, msg = (list(reply.get("err", [])) + ["crash", ""])[:2]
        return report(-1, outcome if outcome in ("error", "timeout", "crash") else "crash", _clip_text(str(msg)))
    report(-1, "pass", "")
    tests = spec.get("tests", [])
    ns = _Namespace(judge, _modules_used(tests))
    refused = dict(unimported_helpers([t.get("source", "") for t in tests]))
    for k, test in enumerate(tests):
        if runner.gone is not None:
            report(k, "not_run", "not run")
            continue
        if k in refused:
            report(k, "error", _clip_text(unimported_message(k, refused[k])))
            continue
        judge.deadline = time.monotonic() + timeout_s
        try:
            outcome = _timed(lambda t=test: _run_test(t, ns), timeout_s + _JUDGE_SLACK_S)
        except _TestTimeout:
            outcome = ("timeout", f"limit {timeout_s:g} s")
        report(k, *outcome)


def _end_with_the_trainer(fd: int, namespaced: bool) -> None:
    """Ends the sandbox when the trainer ends, however (SIGKILL, OOM): `fd` is the read end of a
    pipe whose write end only the trainer holds, so a read returns b"" once it is gone. Then
    the runner's tree is killed (in namespaces: the judge's end, as PID 1, kills it)."""
    def watch():
        try:
            while os.read(fd, 1 << 10):
                pass
        except OSError:
            pass
        if not namespaced:
            sandbox._kill_tree()
        os._exit(0)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()


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
    if spec.get("lifeline") is not None:
        _end_with_the_trainer(spec["lifeline"], namespaced)
    if spec.get("scratch"):
        try:
            sandbox._mount_scratch(os.getcwd(), *spec["scratch"])
        except OSError as e:  # never run the program with its scratch space unbounded by accident
            report(-1, "crash", f"sandbox set-up failed: {e}")
            os._exit(0)
    if not namespaced:
        sandbox._libc().prctl(sandbox._PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
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
            sandbox._kill_tree()
    os._exit(0)


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
