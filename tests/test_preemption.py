"""The main job under a cluster's signals, as a user runs it (`python -m experiments.train`):
SIGTERM saves a checkpoint and exits 143 with one line; a second run on the same workdir
meanwhile exits 2 naming the first; SIGKILL at any point loses at most one checkpoint
interval, and the rerun resumes with the killed attempt's metrics kept up to its step."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pipo_jax.run import observe
from pipo_jax.run.checkpoint import saved_steps
from tests import compilation_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EVERY = 4


def _command(workdir, iterations):
    return [sys.executable, "-m", "experiments.train", "--config=configs/grpo.py:micro", "--config.pipo.enabled=true",
            f"--config.iterations={iterations}", "--config.log.every=1", f"--config.checkpoint.every={EVERY}",
            "--config.checkpoint.export_hf=false", f"--workdir={workdir}"]


def _start(workdir, iterations=400):
    return subprocess.Popen(_command(workdir, iterations), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _run(workdir, iterations):
    return subprocess.run(_command(workdir, iterations), cwd=ROOT, capture_output=True, text=True, timeout=600)


def _logged_steps(workdir):
    return [r["step"] for r in observe.read_metrics(os.path.join(workdir, "metrics.jsonl"))]


def _wait_for_step(proc, workdir, step, timeout=300):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        if max(_logged_steps(workdir), default=-1) >= step:
            return
        time.sleep(0.2)
    _kill(proc)
    raise AssertionError(f"no metrics row at step {step} within {timeout}s")


def _kill(proc):
    """SIGKILL, then the shared compilation cache's repair (the run may have died mid-write)."""
    proc.kill()
    proc.communicate()
    compilation_cache.repair(compilation_cache.shared_dir())


def _stderr_lines(text):
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.slow  # three runs of the main job's script
def test_sigterm_saves_and_exits_143_and_a_second_run_is_refused(tmp_path):
    workdir = str(tmp_path / "run")
    first = _start(workdir)
    _wait_for_step(first, workdir, 2)
    second = _run(workdir, 400)  # the first still runs: refused, one line naming it
    assert second.returncode == 2, second.stderr[-3000:]
    lines = _stderr_lines(second.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"is in use by another run: pid {first.pid} " in \
        lines[0], second.stderr[-3000:]
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 143, err[-3000:]
    last = _stderr_lines(err)[-1]
    assert last.startswith("stopped: stopped by SIGTERM at iteration "), last
    stopped_at = int(last.split("at iteration ")[1].split(",")[0])
    assert max(saved_steps(os.path.join(workdir, "checkpoints"))) == stopped_at
    assert _logged_steps(workdir) == list(range(stopped_at + 1))
    assert not os.path.exists(os.path.join(workdir, ".lock"))
    # The rerun resumes at the saved step and continues the same metrics file.
    done = _run(workdir, stopped_at + 2)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.load(open(os.path.join(workdir, "summary.json")))["resumed_from"] == stopped_at
    assert _logged_steps(workdir) == list(range(stopped_at + 3))


@pytest.mark.slow  # two runs of the main job's script
def test_sigkill_loses_at_most_the_iterations_since_the_last_finished_save(tmp_path):
    """Saves are asynchronous, and orbax starts one only once the previous one has finished. A kill
    therefore loses the iterations since the last started save (fewer than EVERY), plus one
    interval when that save was still being written. The rerun recomputes at most 2 * EVERY
    iterations. Row s is the state after s iterations (row 0: before the first) and the save of
    step s starts after row s is written, so the worst case is exactly 2 * EVERY: row 12 written,
    the save of step 12 waiting for that of step 8, step 4 the newest finished. (It failed once
    against the bound EVERY: the save of step 8 was in flight when row 9 was logged.)"""
    workdir = str(tmp_path / "run")
    first = _start(workdir)
    _wait_for_step(first, workdir, 2 * EVERY + 1)
    _kill(first)
    logged = max(_logged_steps(workdir))  # rows 0..logged: logged iterations done
    newest = max(saved_steps(os.path.join(workdir, "checkpoints")))
    assert newest % EVERY == 0 and newest <= logged, (logged, newest)
    assert logged - newest <= 2 * EVERY, (logged, newest)  # the rows past `newest` are recomputed
    done = _run(workdir, logged + 1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.load(open(os.path.join(workdir, "summary.json")))["resumed_from"] == newest
    assert _logged_steps(workdir) == list(range(logged + 2))  # one row a step: none twice, none missing
    superseded = [r["step"] for r in map(json.loads, open(os.path.join(workdir, "metrics.superseded.jsonl")))
                  if "step" in r]  # (and a line torn by the kill, if it landed mid-write)
    assert superseded == list(range(newest + 1, logged + 1))  # the killed attempt's rows past the checkpoint
