"""The main job's console as a user sees it (`python -m experiments.train`): a fresh run and its
resume never go longer than the heartbeat's period (plus what a loaded machine adds) without a
line, and the lines say what runs: building the task, the warm-up, the base model's evaluation, the
RL program, the resume. The heartbeat's period is set short (1 s) so that the test is about the
mechanism, not the machine's speed (the default is 10 s: `log.heartbeat_s`)."""

import datetime
import re

import pytest

from tests.scripts import run_script

PERIOD_S = 1.0
SLACK_S = 7.0  # a shared machine's stall between two lines; the bound stays under the claimed ~10 s
# absl's line prefix: I1207 11:49:45.884252 <thread> file.py:line]
ABSL_LINE = re.compile(r"^[IWE](\d{4}) (\d\d:\d\d:\d\d\.\d+) +\d+ ([\w.]+):\d+\] (.*)$")


def _lines(stderr):
    """(seconds since midnight, file, message) of each absl line of `stderr`."""
    out = []
    for line in stderr.splitlines():
        m = ABSL_LINE.match(line.split("\r")[-1])
        if m:
            t = datetime.datetime.strptime(m.group(2), "%H:%M:%S.%f")
            out.append((t.hour * 3600 + t.minute * 60 + t.second + t.microsecond / 1e6, m.group(3), m.group(4)))
    return out


def _largest_gap(lines):
    times = [t for t, _, _ in lines]
    return max((b - a) % 86400 for a, b in zip(times, times[1:]))


def _train(workdir, iterations):
    out = run_script("-m", "experiments.train", "--config=configs/grpo.py:micro", f"--workdir={workdir}",
                     f"--config.iterations={iterations}", "--config.checkpoint.export_hf=false",
                     "--config.log.progress=true", f"--config.log.heartbeat_s={PERIOD_S}", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return _lines(out.stderr)


@pytest.mark.slow  # the micro trainer twice, in fresh processes
def test_a_run_and_its_resume_are_never_silent(tmp_path):
    fresh = _train(tmp_path, 2)
    said = [message for _, _, message in fresh]
    for start in ("JAX compilation cache: ", "warm-up: up to 2 supervised steps",
                  "evaluating the base model (iteration 0)", "RL: iteration 1, the first chunk builds"):
        assert any(m.startswith(start) for m in said), (start, said)
    assert any(m.startswith("still in the warm-up (") for m in said), said  # its programs take seconds to build
    assert _largest_gap(fresh) < PERIOD_S + SLACK_S, fresh

    resumed = _train(tmp_path, 3)  # the workdir's checkpoint of iteration 2
    said = [message for _, _, message in resumed]
    assert any(m.startswith("resuming: restoring the newest readable checkpoint") for m in said), said
    assert any(m.startswith("RL: iteration 3, the first chunk builds") for m in said), said
    assert _largest_gap(resumed) < PERIOD_S + SLACK_S, resumed
