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
from tests.xla_flags import SHARDED_WORKER_TERMINATE_S, sharded_subprocess_env

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 1800  # generous: compiles on a loaded 2-core machine are slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _launch(args: list[str], log: Path, terminate_timeout_s: int | None = None) -> subprocess.Popen:
    # each worker adds its device count; no persistent compilation cache (tests/xla_flags.py)
    env = sharded_subprocess_env(terminate_timeout_s=terminate_timeout_s,
                                 PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
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


@pytest.fixture(scope="module")
def mesh_run(tmp_path_factory, request) -> tuple[Path, tuple[dict, dict]]:
    """(outputs of tests.parallel.mesh_worker, reference). A collective that some devices never reach
    is aborted by XLA:CPU after `SHARDED_WORKER_TERMINATE_S` and fails the test (no second run)."""
    out = tmp_path_factory.mktemp("mesh_worker")
    log = out / "log.txt"
    proc = _launch(["tests.parallel.mesh_worker", str(out)], log, SHARDED_WORKER_TERMINATE_S)
    return out, _reference_beside({"mesh_worker": (proc, log)}, request)


@pytest.fixture(scope="module")
def multiprocess_run(tmp_path_factory, request) -> tuple[Path, tuple[dict, dict]]:
    """(outputs of tests.parallel.multiprocess_worker's process 0, reference)."""
    out = tmp_path_factory.mktemp("multiprocess_worker")
    port = str(_free_port())
    procs = {}
    for pid in ("0", "1"):
        log = out / f"log{pid}.txt"
        procs[f"process {pid}"] = (_launch(["tests.parallel.multiprocess_worker", port, pid, str(out)], log), log)
    return out, _reference_beside(procs, request)
