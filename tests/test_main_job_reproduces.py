"""The README's main job, rerun for seed 0 exactly as a user runs it, gives the README's row, and learns.

XLA:CPU's code (and so float rounding, and so the whole RL trajectory: 1200 warm-up steps, then 100
iterations) depends on the CPU. The table holds one record per CPU it was measured on
(`experiments/reproduce.py:MAIN_JOB_RUNS`: the CPU model, its vector extensions where recorded, and the
cores the process may use, which size XLA:CPU's thread pool and its split of a matmul); on such a CPU the
rerun equals its record's row to the last digit. On another CPU a rerun is one more draw
from the spread between seeds, which is wide: seed 0 gives a base of 0.441 and 0.818 after RL on the
Intel Xeon, 0.307 and 0.570 on the AMD EPYC, whose seeds 1-4 end at 0.83-0.90 (the Intel Xeon's seeds:
0.78-0.90), so no closeness to a row is asserted there. Anywhere, the run learns: a partial solver at
the start, a gain after RL, and a warm-up that taught the model to read the SDPO / VPD teacher contexts
(a change that breaks the task, warm-up, losses, sampler or optimizer fails here). ~3 minutes of CPU
time.
"""

import os
import subprocess

import pytest

from experiments import reproduce
from experiments.main_job_seeds import seed_command, seed_result
from pipo_jax.run import observe


@pytest.mark.slow
def test_seed_0_of_the_main_job_gives_the_readme_row(tmp_path):
    table = reproduce.TABLES["main_job"]
    here = [rec for run, rec in zip(table.runs, reproduce.load_records(table)) if run.made_here()]
    workdir = str(tmp_path / "seed0")
    # The user's environment: not the test processes' XLA flags (LLVM level 0 changes the last bits).
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(seed_command(0, workdir, []), cwd=reproduce.ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = seed_result(workdir)
    assert got["acc_steps"] == [0, 20, 40, 60, 80, 100]
    if here:
        row = next(r for r in here[0]["runs"] if r["seed"] == 0)
        assert got["acc_steps"] == row["acc_steps"]
        assert (got["initial_accuracy"], got["accuracy"], got["final_accuracy"]) == \
            (row["initial_accuracy"], row["accuracy"], row["final_accuracy"])
    # It learns, on any CPU: a partial solver leaves room, RL gains, the teacher reads its contexts.
    assert 0.3 <= got["initial_accuracy"] <= 0.6 and got["final_accuracy"] >= got["initial_accuracy"] + 0.1
    first = observe.read_metrics(os.path.join(workdir, "metrics.jsonl"))[0]
    for kind in ("solution", "feedback"):
        assert first[f"warmup_teacher_{kind}_accuracy"] >= first["warmup_accuracy"] + 0.15
