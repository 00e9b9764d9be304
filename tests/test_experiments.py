"""The experiment scripts end to end on the micro preset: compare (PIPO off / on per seed,
PNG + JSON table) and sweep (a lam x K grid with a baseline)."""

import json
import os
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
    """The lam x K flags: each lam a PIPO point, the PIPO-off point the baseline; points of one jit-static
    spec one program (a group), the groups side by side in their own processes (--workers=2), each group's
    members one after another (--members=map, which the group processes are given too)."""
    out = run_module("experiments.sweep", "--config=configs/grpo.py:micro", "--seeds=0,1", "--lams=0.1,0.5",
                     "--windows=2", "--config.iterations=2", "--workers=2", "--members=map", f"--out={tmp_path}")
    record = json.loads((tmp_path / "sweep.json").read_text())
    assert record["members"] == "map"
    for name in os.listdir(tmp_path / "groups"):
        stored = json.loads((tmp_path / "groups" / name).read_text())["points"]
        assert {e["members"] for e in stored.values()} == {"map"}
    assert all("one after another: --members=map" in (tmp_path / "logs" / f"group{g}.log").read_text() for g in (0, 1))
    labels = ["pipo.enabled=True,pipo.lam=0.1,pipo.window=2", "pipo.enabled=True,pipo.lam=0.5,pipo.window=2",
              "pipo.enabled=false"]
    assert [p["name"] for p in record["points"]] == [f"{lab}/seed{s}" for lab in labels for s in (0, 1)]
    # lam is data (rl/hyper.py): both PIPO points share one program; PIPO off is another
    assert record["groups"] == [[f"{lab}/seed{s}" for lab in labels[:2] for s in (0, 1)],
                                [f"{labels[2]}/seed0", f"{labels[2]}/seed1"]]
    assert record["baseline"] == "pipo.enabled=false" and record["swept_keys"] == ["pipo.lam"]
    for p in record["points"]:
        assert 0 <= p["metrics"]["final_accuracy"] <= 1 and p["group_timing"]["size"] == (2 if p["group"] else 4)
        assert p["label"] != "pipo.enabled=false" or p["result"]["pi_steps"] == 0  # PIPO off takes no PI step
    # against the base config (micro: PIPO off, lam 0.1, K 2, seed 0): only what the point changes
    assert record["points"][1]["config_diff"] == {"pipo.enabled": [False, True], "seed": [0, 1]}
    assert record["points"][2]["config_diff"] == {"pipo.enabled": [False, True], "pipo.lam": [0.1, 0.5]}
    vs = record["summary"]["vs_baseline"]["final_accuracy"]
    assert sorted(vs) == labels[:2] and all(v["n"] == 2 and v["seeds"] == [0, 1] for v in vs.values())
    assert sorted(os.listdir(tmp_path / "logs")) == ["group0.log", "group1.log"]
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert f"| {labels[0]} | 2 |" in out and "(baseline) |" in out
