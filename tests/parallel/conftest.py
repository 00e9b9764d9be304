"""Session fixture: the scenario on one device (in this process) and, concurrently, the
8-simulated-device worker and the two-process worker pair (each its own subprocess, so
their XLA flags / jax.distributed never touch this test session)."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.parallel import scenario

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 1800  # generous: compiles on a loaded 2-core machine are slow


@dataclasses.dataclass
class Runs:
    reference: dict  # run_summary of the single-device run
    reference_metrics: dict
    mesh_dir: Path  # outputs of tests.parallel.mesh_worker
    multiprocess_dir: Path  # outputs of tests.parallel.multiprocess_worker (process 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _launch(args: list[str], log: Path, compilation_cache: bool = True) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("XLA_FLAGS", None)
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
def runs(tmp_path_factory) -> Runs:
    mesh_dir = tmp_path_factory.mktemp("mesh_worker")
    mp_dir = tmp_path_factory.mktemp("multiprocess_worker")
    port = str(_free_port())
    procs = {"mesh_worker": (_launch(["tests.parallel.mesh_worker", str(mesh_dir)], mesh_dir / "log.txt"),
                             mesh_dir / "log.txt")}
    for pid in ("0", "1"):
        log = mp_dir / f"log{pid}.txt"
        # No persistent compilation cache for the two processes: with programs loaded from a warm
        # cache their gloo collectives hung (both processes idle in the first device-to-host copy,
        # seen on jax 0.10.2), while compiling cold completes in about a minute.
        procs[f"process {pid}"] = (_launch(["tests.parallel.multiprocess_worker", port, pid, str(mp_dir)], log,
                                           compilation_cache=False), log)
    deadline = time.monotonic() + TIMEOUT_S
    try:
        from pipo_jax.rl import loop

        spec, state = scenario.initial_state()
        state, metrics = loop.scan_chunk(spec, state, scenario.ITERATIONS)
        state, metrics = jax.device_get((state, metrics))
        reference = scenario.run_summary(state, metrics)
    except BaseException:
        for proc, _ in procs.values():
            proc.kill()
        raise
    _wait(procs, deadline)
    return Runs(reference, {k: np.asarray(v) for k, v in metrics.items()}, mesh_dir, mp_dir)
