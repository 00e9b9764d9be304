"""The runner: the only process that runs generated code. It holds the code and the arguments
of the request in hand; never the tests, expected values or the report fd. Started by the
judge as ``python -I child.py --runner``; standard library only."""
from __future__ import annotations

import math
import os
import signal
import sys
import threading
from typing import Any

from pipo_jax.tasks.code import sandbox
from pipo_jax.tasks.code.feedback import _error_message
from pipo_jax.tasks.code.protocol import _Pipe, _decode, _encode
from pipo_jax.tasks.code.timer import _TestTimeout, _on_alarm, _timed


_BLOCKED_EVENTS = frozenset({
    "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
    "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
    "os.fork", "os.forkpty", "os.system", "os.exec", "os.spawn", "os.posix_spawn",
    "subprocess.Popen", "os.kill", "os.killpg", "resource.setrlimit", "pty.spawn",
})


def _audit(event: str, args: tuple) -> None:
    if event in _BLOCKED_EVENTS:
        raise PermissionError(f"{event} is not allowed in the sandbox")


def _join_threads() -> None:
    """Waits, as the interpreter does at exit, for every non-daemon thread the program started
    (also those its threads start)."""
    while alive := [t for t in threading.enumerate()
                    if t is not threading.main_thread() and not t.daemon and t.is_alive()]:
        for t in alive:
            t.join()


def _run_program(compiled, ns: dict, io_mode: bool) -> None:
    """Executes the solution; an IO program (a whole program) also until its threads end, the
    time its output takes, as when it runs alone (within the same time limit)."""
    if not io_mode:
        return exec(compiled, ns)
    try:
        exec(compiled, ns)
    except SystemExit:
        _join_threads()
        raise
    _join_threads()


def _define(code: str, ns: dict, io_mode: bool, timeout_s: float) -> list | None:
    """Runs the solution in `ns`; None, or [outcome, message] when that failed."""
    try:
        compiled = compile(code, "<solution>", "exec")
        _timed(lambda: _run_program(compiled, ns, io_mode), timeout_s)
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
    # SIGKILL when the judge ends, however: outside namespaces nothing else would end a runner
    # whose judge was killed (a judge gone before this line closes the pipe: recv ends it)
    sandbox._libc().prctl(sandbox._PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    pipe = _Pipe(request_fd, reply_fd)
    setup = pipe.recv(math.inf)
    limits = setup["limits"]
    try:
        sandbox._set_limits(limits)
        if setup["confine"]:
            sandbox._landlock_confine(os.getcwd())
        if setup["no_processes"] or sandbox.process_filter_available():
            sandbox._install_filter(setup["no_processes"])
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
