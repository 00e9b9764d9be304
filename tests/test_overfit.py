"""The train / held-out gap (experiments/overfit.py) and where the tables report it: compare's table and
summary, the reasoning-gym study's table (from stored curves, old JSONs included)."""

import json
import math

import numpy as np

from experiments import compare, overfit, reproduce, runs


def test_heldout_auc_is_the_mean_after_the_base():
    assert overfit.heldout_auc([0, 20, 40], [0.9, 0.25, 0.75]) == 0.5  # the base's 0.9 left out
    assert math.isnan(overfit.heldout_auc([0], [0.5]))


def test_rise_averages_each_end():
    assert overfit.rise([0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 4.0]) == (0.0, 3.0)  # 2 points each end
    assert overfit.rise([0.2, 0.5]) == (0.2, 0.5)


def test_the_flag_on_a_run_that_learned_its_training_questions():
    """The issue's lcm run: reward 0.43 -> 0.74 over 200 iterations, held-out accuracy 0.13 -> 0.16."""
    reward = np.linspace(0.43, 0.74, 200)
    heldout = np.linspace(0.13, 0.16, 11)
    start, end = overfit.rise(reward)
    h0, h1 = overfit.rise(heldout)
    assert overfit.heldout_gap_flag(reward, heldout) == (
        f"training reward rose {start:.2f} -> {end:.2f} ({end - start:+.2f}) while held-out accuracy went "
        f"{h0:.2f} -> {h1:.2f} ({h1 - h0:+.2f}): the policy learned its training questions more than the task")
    # held-out accuracy rising by a quarter of the reward's rise or more: no flag
    rise = end - start
    assert overfit.heldout_gap_flag(reward, np.linspace(0.13, 0.13 + 1.3 * overfit.HELDOUT_SHARE * rise, 11)) is None
    assert overfit.heldout_gap_flag(reward, np.linspace(0.13, 0.13 + 0.7 * overfit.HELDOUT_SHARE * rise, 11))
    # a reward that barely rises, or falls: no flag, whatever held-out accuracy does
    assert overfit.heldout_gap_flag(np.linspace(0.4, 0.45, 200), heldout) is None
    assert overfit.heldout_gap_flag(reward[::-1], heldout) is None
    assert overfit.heldout_gap_flag([0.5], heldout) is None and overfit.heldout_gap_flag(reward, [0.1]) is None


def _run(seed, reward, accuracy):
    return {"seed": seed, "steps": list(range(1, len(reward) + 1)), "reward": list(reward),
            "acc_steps": [0, len(reward) // 2, len(reward)], "accuracy": list(accuracy),
            "initial_accuracy": accuracy[0], "final_accuracy": accuracy[-1], "reward_auc": float(np.mean(reward)),
            "pi_steps": 0}


def test_compare_reports_heldout_auc_and_flags_beside_reward_auc():
    up = np.linspace(0.3, 0.7, 10)
    results = {"grpo": [_run(0, up, [0.2, 0.21, 0.2]), _run(1, up, [0.2, 0.4, 0.6])],
               "grpo+PIPO": [_run(0, up, [0.2, 0.3, 0.5]), _run(1, up, [0.2, 0.5, 0.7])]}
    summary = compare.summarise(results, ["grpo"])
    grpo = summary["arms"]["grpo"]
    assert np.isclose(grpo["heldout_auc_mean"], np.mean([(0.21 + 0.2) / 2, (0.4 + 0.6) / 2]))
    assert grpo["gap_flags"][0].startswith("training reward rose") and grpo["gap_flags"][1] is None
    assert summary["arms"]["grpo+PIPO"]["gap_flags"] == [None, None]
    assert np.allclose(summary["pipo_minus_base"]["grpo"]["heldout_auc"]["diffs"], [0.4 - 0.205, 0.6 - 0.5])
    table = compare.format_table({"summary": summary})
    assert "| training-reward AUC | held-out acc AUC | seeds whose training reward rose without held-out accuracy |" \
        in table.splitlines()[0]
    assert table.splitlines()[2].endswith(f"| {np.mean(up):.3f} | {grpo['heldout_auc_mean']:.3f} | 1/2 |")
    assert table.splitlines()[3].endswith("| - |")


def test_the_rg_study_table_computes_both_aucs_from_the_stored_curves():
    records = [json.loads((reproduce.RESULTS / "rg_study" / f"{d.name}.json").read_text())
               for d in reproduce.rg_study.DATASETS]
    text = reproduce.render_rg_study(records)
    first = records[0]
    runs = first["runs"]["grpo"]
    auc = np.mean([overfit.heldout_auc(r["acc_steps"], r["accuracy"]) for r in runs])
    assert reproduce.rg_study.DATASETS[0].name == "chain_sum"
    row = next(line for line in text.splitlines() if line.startswith("| `chain_sum` (arithmetic) | grpo |"))
    assert row.endswith(f"| {first['summary']['arms']['grpo']['reward_auc_mean']:.3f} | {auc:.3f} | - |")


def test_a_runs_summary_holds_both_aucs_and_the_flag(tmp_path):
    """`experiments/runs.py:summarise` (the sweep's per-run figures) from a metrics.jsonl."""
    rows = [{"step": 0, "heldout_accuracy": 0.13}]
    rows += [{"step": i, "reward_mean": 0.43 + 0.31 * (i - 1) / 9} for i in range(1, 11)]
    rows[5]["heldout_accuracy"], rows[10]["heldout_accuracy"] = 0.15, 0.16
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = runs.summarise(str(tmp_path))
    assert out["acc_steps"] == [0, 5, 10] and np.isclose(out["heldout_auc"], (0.15 + 0.16) / 2)
    assert np.isclose(out["reward_auc"], 0.43 + 0.31 / 2)
    assert out["gap_flag"] == overfit.heldout_gap_flag(out["reward"], [0.13, 0.15, 0.16]) is not None
