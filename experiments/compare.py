"""An algorithm with and without PIPO over several seeds on the tiny task: mean +- std
curves (PNG) and a table of final held-out accuracy and area under the reward curve.

    python -m experiments.compare --config=configs/grpo.py:tiny --seeds=0,1,2 --out=runs/compare

Both arms of a seed start from the same warmed-up base model and see the same RNG
stream, so the difference is PIPO's verification step alone.
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
from absl import app, flags
from ml_collections import config_flags

from experiments.runs import run, warmed_up_model

_CONFIG = config_flags.DEFINE_config_file("config", "configs/grpo.py:tiny", "run config file:preset")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "seeds")
_OUT = flags.DEFINE_string("out", "runs/compare", "output directory")


def compare(config, seeds: list[int], out: str) -> dict:
    results: dict[str, list[dict]] = {"baseline": [], "pipo": []}
    for seed in seeds:
        base = warmed_up_model(config, seed, out)
        for arm, enabled in (("baseline", False), ("pipo", True)):
            c = copy.deepcopy(config)
            c.seed, c.pipo.enabled = seed, enabled
            c.checkpoint.resume = False
            results[arm].append(run(c, os.path.join(out, f"{arm}_seed{seed}"), base))
    table = {arm: {
        "final_accuracy_mean": float(np.mean([r["final_accuracy"] for r in rs])),
        "final_accuracy_std": float(np.std([r["final_accuracy"] for r in rs])),
        "reward_auc_mean": float(np.mean([r["reward_auc"] for r in rs])),
        "reward_auc_std": float(np.std([r["reward_auc"] for r in rs])),
        "initial_accuracy_mean": float(np.mean([r["initial_accuracy"] for r in rs])),
        "pi_steps_mean": float(np.mean([r["pi_steps"] for r in rs])),
    } for arm, rs in results.items()}
    with open(os.path.join(out, "compare.json"), "w") as f:
        json.dump({"algorithm": config.algorithm, "seeds": seeds, "table": table, "runs": results}, f, indent=2)
    plot(results, config.algorithm, os.path.join(out, "compare.png"))
    return table


def plot(results: dict, algorithm: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for arm, rs in results.items():
        label = f"{algorithm}+PIPO" if arm == "pipo" else algorithm
        for ax, xk, yk in ((axes[0], "steps", "reward"), (axes[1], "acc_steps", "accuracy")):
            n = min(len(r[yk]) for r in rs)
            x = np.asarray(rs[0][xk][:n])
            y = np.asarray([r[yk][:n] for r in rs])
            ax.plot(x, y.mean(0), label=label)
            ax.fill_between(x, y.mean(0) - y.std(0), y.mean(0) + y.std(0), alpha=0.25)
    axes[0].set_title("batch reward (mean +- std over seeds)")
    axes[1].set_title("held-out accuracy (mean +- std over seeds)")
    for ax in axes:
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_table(table: dict) -> str:
    lines = ["| arm | initial acc | final acc (mean +- std) | reward AUC (mean +- std) | PI steps |",
             "| --- | --- | --- | --- | --- |"]
    for arm, t in table.items():
        lines.append(f"| {arm} | {t['initial_accuracy_mean']:.3f} | {t['final_accuracy_mean']:.3f} +- "
                     f"{t['final_accuracy_std']:.3f} | {t['reward_auc_mean']:.3f} +- {t['reward_auc_std']:.3f} | "
                     f"{t['pi_steps_mean']:.1f} |")
    return "\n".join(lines)


def main(argv):
    del argv
    os.makedirs(_OUT.value, exist_ok=True)
    table = compare(_CONFIG.value, [int(s) for s in _SEEDS.value], _OUT.value)
    print(format_table(table))
    print(f"wrote {os.path.join(_OUT.value, 'compare.png')} and compare.json")


if __name__ == "__main__":
    app.run(main)
