"""A process that runs the experiments' scripts as `python -m <module> <args>` (or `python <path>`)
would, each in a child forked from it after it imported their dependencies once.

A script's own start is mostly imports (jax, orbax, transformers, flax: ~3 s, more on a loaded
2-core machine) before its first line of work; the suite starts scripts some 70 times, most of them
to check a one-line error. `tests/scripts.py:run_script` starts one server per environment and
sends it a request a line (JSON: argv, cwd, the environment, the files for stdin / stdout / stderr);
the server forks, the child runs the script as `__main__` in a process of its own and exits with the
script's exit status, and the server answers the child's pid, then its exit status.

What differs from a fresh interpreter: the modules below are imported already (a script's own
module is not: it runs from its source as `__main__`, so its absl flags are defined once, in the
child), and at its end the child joins its threads and runs its exit handlers as the interpreter
would, then leaves without tearing its modules down (that teardown took about a second a run).
The server imports without starting any JAX backend (no XLA threads exist at the fork; OpenBLAS's
pool is fork-safe), and the environment variables JAX reads at import (`JAX_*`) are those the
server started with: `run_script` starts a server per distinct value of them.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import runpy
import sys
import threading
import traceback

# Never a script (a module defining absl flags at import): it would define them twice.
PRELOAD = ("numpy", "absl.app", "jax", "jax.numpy", "flax", "optax", "orbax.checkpoint", "ml_collections",
           "transformers", "safetensors", "matplotlib.pyplot", "experiments.cli", "experiments.conversation",
           "experiments.provenance", "experiments.runs", "experiments.stats")


def _preload() -> None:
    """PRELOAD and every module of `pipo_jax` (one that cannot be imported, e.g. for want of an extra,
    is left to the script, which reports it as it would)."""
    import pkgutil

    import pipo_jax

    names = [*PRELOAD, *(m.name for m in pkgutil.walk_packages(pipo_jax.__path__, "pipo_jax."))]
    for name in names:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - as above
            pass


def _run_child(request: dict) -> None:
    """In the forked child: the script with its argv, cwd, environment and stdio; never returns."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, mode in ((0, request["stdin"], os.O_RDONLY), (1, request["stdout"], os.O_WRONLY),
                           (2, request["stderr"], os.O_WRONLY)):
        target = os.open(path, mode)
        os.dup2(target, fd)
        os.close(target)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    argv = request["argv"]
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:  # as the interpreter reports it: None 0, an int itself, else printed and 1
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - an uncaught exception: its traceback and status 1, as python does
        traceback.print_exc()
        code = 1
    threading._shutdown()  # as at the interpreter's exit: the script's non-daemon threads joined,
    atexit._run_exitfuncs()  # its exit handlers run (logging's flush among them) ...
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # ... but without tearing down the thousands of modules imported (seconds)


def serve() -> None:
    _preload()
    # What the server holds is frozen out of the collections: a child's collections then neither walk
    # nor write to the inherited objects, whose pages stay shared instead of being copied on write
    # (a micro training run: ~2.4 s against ~2.7 s).
    gc.collect()
    gc.freeze()
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_child(request)
        print(pid, flush=True)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)


if __name__ == "__main__":
    serve()
