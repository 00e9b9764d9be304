"""`run_script`: `subprocess.run([sys.executable, *argv], capture_output=True, text=True)` for the
experiments' scripts, each run in a child of a server that imported their dependencies once
(`tests/script_server.py`), a few seconds sooner per run than a fresh interpreter.

One server per test process and per value of the environment variables JAX reads at import
(`JAX_*`); the servers end with the test process (their stdin closes).
"""

from __future__ import annotations

import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


class _Server:
    def __init__(self, env: dict[str, str]):
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.script_server"], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        if self._line(600) != "ready":
            raise RuntimeError(f"tests.script_server did not start (status {self.proc.poll()})")

    def _line(self, timeout_s: float | None) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            raise TimeoutError
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"tests.script_server ended (status {self.proc.poll()})")
        return line.strip()

    def run(self, argv: list[str], cwd: str, env: dict[str, str], stdin: str, stdout: str, stderr: str,
            timeout_s: float) -> int:
        request = dict(argv=argv, cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr)
        self.proc.stdin.write(json.dumps(request) + "\n")
        pid = int(self._line(60))
        try:
            return int(self._line(timeout_s))
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            self._line(60)
            raise subprocess.TimeoutExpired(argv, timeout_s) from None


_SERVERS: dict[tuple, _Server] = {}


def _server(env: dict[str, str]) -> _Server:
    key = tuple(sorted((k, v) for k, v in env.items() if k.startswith("JAX_")))
    if key not in _SERVERS or _SERVERS[key].proc.poll() is not None:
        _SERVERS[key] = _Server(env)
    return _SERVERS[key]


def run_script(*argv: str, env: dict[str, str] | None = None, cwd: str | os.PathLike = ROOT,
               input: str = "", timeout: float = 300) -> subprocess.CompletedProcess:
    """`python *argv` (`"-m", module, ...` or a script's path, ...) with stdout and stderr captured as
    text; raises `subprocess.TimeoutExpired` after `timeout` seconds (the run killed)."""
    env = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory(prefix="script_") as tmp:
        paths = [os.path.join(tmp, name) for name in ("stdin", "stdout", "stderr")]
        pathlib.Path(paths[0]).write_text(input)
        for path in paths[1:]:
            pathlib.Path(path).touch()
        code = _server(env).run(list(argv), os.fspath(cwd), env, *paths, timeout_s=timeout)
        out, err = (pathlib.Path(p).read_text(errors="replace") for p in paths[1:])
    return subprocess.CompletedProcess([sys.executable, *argv], code, out, err)
