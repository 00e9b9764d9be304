"""The experiment scripts end to end on the micro preset: compare (PIPO off / on per seed,
PNG + JSON table) and sweep (a lam x K grid with a baseline)."""

import json
import pathlib

import pytest

from tests.scripts import run_script

pytestmark = pytest.mark.slow  # each script runs the micro trainer end to end in a fresh JAX process

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_module(*args):
    res = run_script("-m", *args)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_compare_writes_table_and_plot(tmp_path):
    out = run_module("experiments.compare", "--algorithms=grpo", "--preset=micro", "--seeds=0,1", f"--out={tmp_path}",
                     "--set=eval.heldout_samples=2")
    result = json.loads((tmp_path / "compare.json").read_text())
    arms = result["summary"]["arms"]
    assert sorted(arms) == ["grpo", "grpo+PIPO"] and result["seeds"] == [0, 1]
    assert arms["grpo"]["pi_steps_mean"] == 0  # PIPO off never takes a PI step
    # Both arms of a seed start from the same warmed-up base model, so they start equal.
    for off, on in zip(result["runs"]["grpo"], result["runs"]["grpo+PIPO"]):
        assert off["initial_accuracy"] == on["initial_accuracy"] and off["seed"] == on["seed"]
    paired = result["summary"]["pipo_minus_base"]["grpo"]["final_accuracy"]
    diffs = [b["final_accuracy"] - a["final_accuracy"] for a, b in zip(result["runs"]["grpo"], result["runs"]["grpo+PIPO"])]
    assert paired["diffs"] == diffs and 0 <= paired["wilcoxon_p"] <= 1
    run = result["runs"]["grpo+PIPO"][0]
    assert len(run["reward"]) == len(run["steps"]) == 3
    # held-out pass@1 at the rollout temperature beside the greedy accuracy, at every evaluation
    assert len(run["pass_at_1"]) == len(run["accuracy"]) and run["final_pass_at_1"] == run["pass_at_1"][-1]
    assert all(0 <= x <= 1 for x in run["pass_at_1"]) and "final_pass_at_1_mean" in arms["grpo"]
    assert len(result["summary"]["pipo_minus_base"]["grpo"]["final_pass_at_1"]["diffs"]) == 2
    assert result["commit"] and result["cpu_model"] and result["versions"]["jax"]
    assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"
    assert "| grpo+PIPO |" in out


def test_sweep_runs_the_grid_and_baseline(tmp_path):
    out = run_module("experiments.sweep", "--config=configs/grpo.py:micro", "--seeds=0", "--lams=0.1,0.5",
                     "--windows=2", f"--out={tmp_path}")
    rows = json.loads((tmp_path / "sweep.json").read_text())
    assert [r["name"] for r in rows] == ["seed0_lam0.1_K2", "seed0_lam0.5_K2", "seed0_baseline"]
    assert rows[-1]["pi_steps"] == 0 and not rows[-1]["pipo"]
    for r in rows:
        assert 0 <= r["final_accuracy"] <= 1
        assert (tmp_path / r["name"] / "metrics.jsonl").exists()
    assert "| seed0_baseline |" in out
