"""Fixtures of the sharded runs: the scenario on one device (in this process, once per test
process) and, in subprocesses so that their XLA flags / jax.distributed never touch this test
session, the 8-simulated-device worker (`mesh_run`, tests/parallel/test_sharded_training.py) and
the two-process worker pair (`multiprocess_run`, tests/parallel/test_multiprocess.py). Each
module fixture starts its subprocesses first and runs the reference while they work."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from pipo_jax.rl import loop
from tests.parallel import scenario
from tests.xla_flags import xla_flags

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 1800  # generous: compiles on a loaded 2-core machine are slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _launch(args: list[str], log: Path, compilation_cache: bool = True) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["XLA_FLAGS"] = xla_flags()  # each worker adds its device count
    if not compilation_cache:
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, "-m", *args], cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)


def _wait(procs: dict[str, tuple[subprocess.Popen, Path]], deadline: float) -> None:
    failures = []
    for name, (proc, log) in procs.items():
        try:
            rc = proc.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "timeout"
        if rc != 0:
            failures.append(f"--- {name} exited with {rc}; log tail:\n{log.read_text()[-4000:]}")
    if failures:
        pytest.fail("\n".join(failures))


@pytest.fixture(scope="session")
def reference() -> tuple[dict, dict]:
    """(run_summary, metrics) of the scenario's iterations on one device: what every sharded run
    is compared with."""
    spec, state = scenario.initial_state()
    state, metrics = loop.scan_chunk(spec, state, scenario.ITERATIONS)
    state, metrics = jax.device_get((state, metrics))
    return scenario.run_summary(state, metrics), {k: np.asarray(v) for k, v in metrics.items()}


def _reference_beside(procs: dict, request) -> tuple[dict, dict]:
    """The reference (computed while `procs` run, unless this process has it), then the procs' end."""
    deadline = time.monotonic() + TIMEOUT_S
    try:
        ref = request.getfixturevalue("reference")
    except BaseException:
        for proc, _ in procs.values():
            proc.kill()
        raise
    _wait(procs, deadline)
    return ref


# XLA:CPU aborts a process whose simulated devices deadlock in a collective (device threads
# starved on a 2-core machine: some wait at one rendezvous while others never get there); the
# abort names the rendezvous. Seen on the 8-device worker beside the other test worker's load.
XLA_CPU_RENDEZVOUS_ABORT = "Termination timeout for"


@pytest.fixture(scope="module")
def mesh_run(tmp_path_factory, request) -> tuple[Path, tuple[dict, dict]]:
    """(outputs of tests.parallel.mesh_worker, reference). A worker that XLA:CPU aborted in a
    collective deadlock of its simulated devices is run once more, compiling afresh (its log
    kept); any other failure, or a second abort, fails."""
    out = tmp_path_factory.mktemp("mesh_worker")
    for attempt in (1, 2):
        log = out / ("log.txt" if attempt == 1 else "log.retry.txt")
        # the retry also compiles afresh (a changed condition; the deadlock's cause is not known)
        procs = {"mesh_worker": (_launch(["tests.parallel.mesh_worker", str(out)], log, compilation_cache=attempt == 1),
                                 log)}
        try:
            return out, _reference_beside(procs, request)
        except pytest.fail.Exception:
            if attempt == 2 or XLA_CPU_RENDEZVOUS_ABORT not in log.read_text():
                raise
            print(f"mesh_worker: XLA:CPU collective deadlock (log {log}); running it once more", file=sys.stderr)


@pytest.fixture(scope="module")
def multiprocess_run(tmp_path_factory, request) -> tuple[Path, tuple[dict, dict]]:
    """(outputs of tests.parallel.multiprocess_worker's process 0, reference)."""
    out = tmp_path_factory.mktemp("multiprocess_worker")
    port = str(_free_port())
    procs = {}
    for pid in ("0", "1"):
        log = out / f"log{pid}.txt"
        # No persistent compilation cache for the two processes: with programs loaded from a warm
        # cache their gloo collectives hung (both processes idle in the first device-to-host copy,
        # seen on jax 0.10.2), while compiling cold completes in about a minute.
        procs[f"process {pid}"] = (_launch(["tests.parallel.multiprocess_worker", port, pid, str(out)], log,
                                           compilation_cache=False), log)
    return out, _reference_beside(procs, request)
