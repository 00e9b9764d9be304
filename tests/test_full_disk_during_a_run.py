"""A disk that fills during a run (a real tmpfs, filled while `python -m experiments.train` runs) never
hangs it: the metrics and TensorBoard writes fail in one warning line each and training goes on; space
back before the next checkpoint, the run finishes; a checkpoint the disk refuses stops the run with one
line naming what was kept (exit status 2), and what was kept is whole."""

import os
import re
import subprocess
import sys
import time

import pytest

from pipo_jax.run import integrity, observe
from pipo_jax.run.checkpoint import TMP_SUFFIX, saved_steps
from tests import disk

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _start(workdir, stderr_path, iterations, every):
    cmd = [sys.executable, "-m", "experiments.train", "--config=configs/grpo.py:micro", "--config.pipo.enabled=true",
           "--config.warmup.enabled=false", f"--config.iterations={iterations}", "--config.log.every=1",
           f"--config.checkpoint.every={every}", "--config.checkpoint.export_hf=false", "--config.log.progress=false",
           "--config.log.tensorboard=true", "--config.log.plots=true", f"--workdir={workdir}"]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(stderr_path, "w"), text=True)


def _wait(proc, condition, what, timeout=300):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return
        assert proc.poll() is None, f"the run ended (status {proc.returncode}) before {what}"
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"not {what} within {timeout}s")


def _finished(proc, timeout):
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the run hung on a full disk (still running {timeout}s later)") from None


def _lines(path):
    return [line for line in open(path).read().splitlines() if line.strip()]


def _failed_writes(lines):
    return [line for line in lines if "a write failed" in line]


@pytest.mark.slow  # one micro run to its third checkpoint (~20 s on a loaded 2-core CPU)
def test_a_checkpoint_the_full_disk_refuses_stops_the_run_in_one_line_naming_what_was_kept(tmp_path):
    with disk.tmpfs(tmp_path / "fs", "32m") as fs:
        run, ckpt = fs / "run", fs / "run" / "checkpoints"
        proc = _start(run, tmp_path / "stderr", iterations=100_000, every=4)
        _wait(proc, lambda: 4 in saved_steps(str(ckpt)), "checkpoint 4 saved")
        disk.fill(fs)
        status = _finished(proc, timeout=180)
        lines = _lines(tmp_path / "stderr")
        errors = [line for line in lines if line.startswith("error: ")]
        assert status == 2 and len(errors) == 1 and not any("Traceback" in line for line in lines), lines[-20:]
        kept = saved_steps(str(ckpt))
        assert 4 in kept
        assert re.fullmatch(rf"error: {ckpt}/\d+: no space left on device \(checkpoints "
                            rf"{re.escape(str(kept))} in {ckpt} kept; the files written before are unchanged\); free "
                            r"space or make it writable, then rerun the same command to resume", errors[0]), errors[0]
        assert not [n for n in os.listdir(ckpt) if TMP_SUFFIX in n]  # no partial step
        for s in kept:  # whole: every file as its integrity record says
            assert integrity.verify(str(ckpt / str(s)), s) is True
        assert len(_failed_writes(lines)) <= 2  # metrics.jsonl, TensorBoard: once each, never per step
        assert not [n for n in os.listdir(run) if n.endswith(".png")]  # a run the disk stopped draws no plots
        steps = [r["step"] for r in observe.read_metrics(str(run / "metrics.jsonl"))]
        assert steps == list(range(len(steps)))  # whole rows, none torn


@pytest.mark.slow  # one micro run of 600 iterations (~1 min on a loaded 2-core CPU)
def test_a_full_disk_between_checkpoints_is_a_warning_and_the_run_finishes_once_space_is_back(tmp_path):
    with disk.tmpfs(tmp_path / "fs", "32m") as fs:
        run, metrics, err = fs / "run", str(fs / "run" / "metrics.jsonl"), tmp_path / "stderr"
        iterations = 600  # one checkpoint, at the end
        proc = _start(run, err, iterations=iterations, every=10 * iterations)
        _wait(proc, lambda: len(observe.read_metrics(metrics)) > 5, "5 iterations logged")
        filler = disk.fill(fs)
        _wait(proc, lambda: len(_failed_writes(_lines(err))) == 2, "both writers failed")
        filler.unlink()
        status = _finished(proc, timeout=300)
        lines = _lines(err)
        assert status == 0, lines[-20:]
        events = [str(p) for p in (run / "tensorboard").glob("events.out.tfevents.*")]
        assert len(events) == 1
        # Each writer once, in either order (which one meets the full page first varies).
        assert sorted(line.split("] ", 1)[1].split(": a write failed")[0] for line in _failed_writes(lines)) == sorted(
            [metrics, events[0]])
        back = [line for line in lines if "written again" in line]
        assert len(back) == 2, lines[-20:]
        dropped = int(re.search(r"written again; (\d+) rows", back[0]).group(1))
        steps = [r["step"] for r in observe.read_metrics(metrics)]
        assert dropped > 0 and len(steps) == iterations + 1 - dropped and steps[-1] == iterations
        assert saved_steps(str(run / "checkpoints")) == [iterations]
        assert (run / "reward.png").exists()
