"""Algorithms with and without PIPO over several seeds on the tiny task: mean +- std
curves (PNG) and a table of final held-out accuracy and area under the reward curve.

    python -m experiments.compare --config=configs/grpo.py:tiny --seeds=0,1,2 --out=runs/compare
    python -m experiments.compare --algorithms=grpo,sdpo,vpd --preset=tiny --seeds=0,1,2 --out=runs/compare_vpd

Every run of a seed starts from the same warmed-up base model and sees the same RNG
stream, so within an algorithm the difference is PIPO's verification step alone.
"""

from __future__ import annotations

import copy
import importlib
import json
import os

import numpy as np
from absl import flags
from ml_collections import config_flags

from experiments import cli
from experiments.runs import run, warmed_up_model

_CONFIG = config_flags.DEFINE_config_file("config", "configs/grpo.py:tiny", "run config file:preset")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "seeds")
_ALGORITHMS = flags.DEFINE_list("algorithms", [], "algorithms (configs/<name>.py) to compare; default: --config's")
_PRESET = flags.DEFINE_string("preset", "tiny", "preset of the --algorithms configs")
_OUT = flags.DEFINE_string("out", "runs/compare", "output directory")


def compare(configs: dict, seeds: list[int], out: str) -> dict:
    """Runs every config of `configs` ({name: config}) with PIPO off and on for each seed."""
    results: dict[str, list[dict]] = {}
    for seed in seeds:
        base = warmed_up_model(next(iter(configs.values())), seed, out)  # one base model for every arm
        for name, config in configs.items():
            for arm, enabled in (("", False), ("+PIPO", True)):
                c = copy.deepcopy(config)
                c.seed, c.pipo.enabled = seed, enabled
                c.checkpoint.resume = False
                label = name + arm
                results.setdefault(label, []).append(run(c, os.path.join(out, f"{label}_seed{seed}"), base))
    table = {label: {
        "final_accuracy_mean": float(np.mean([r["final_accuracy"] for r in rs])),
        "final_accuracy_std": float(np.std([r["final_accuracy"] for r in rs])),
        "reward_auc_mean": float(np.mean([r["reward_auc"] for r in rs])),
        "reward_auc_std": float(np.std([r["reward_auc"] for r in rs])),
        "initial_accuracy_mean": float(np.mean([r["initial_accuracy"] for r in rs])),
        "pi_steps_mean": float(np.mean([r["pi_steps"] for r in rs])),
    } for label, rs in results.items()}
    with open(os.path.join(out, "compare.json"), "w") as f:
        json.dump({"seeds": seeds, "table": table, "runs": results}, f, indent=2)
    plot(results, os.path.join(out, "compare.png"))
    return table


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for label, rs in results.items():
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
    lines = ["| run | initial acc | final acc (mean +- std) | reward AUC (mean +- std) | PI steps |",
             "| --- | --- | --- | --- | --- |"]
    for arm, t in table.items():
        lines.append(f"| {arm} | {t['initial_accuracy_mean']:.3f} | {t['final_accuracy_mean']:.3f} +- "
                     f"{t['final_accuracy_std']:.3f} | {t['reward_auc_mean']:.3f} +- {t['reward_auc_std']:.3f} | "
                     f"{t['pi_steps_mean']:.1f} |")
    return "\n".join(lines)


def main(argv):
    del argv
    os.makedirs(_OUT.value, exist_ok=True)
    if _ALGORITHMS.value:
        configs = {a: importlib.import_module(f"configs.{a}").get_config(_PRESET.value) for a in _ALGORITHMS.value}
    else:
        configs = {_CONFIG.value.algorithm: _CONFIG.value}
    table = compare(configs, [int(s) for s in _SEEDS.value], _OUT.value)
    print(format_table(table))
    print(f"wrote {os.path.join(_OUT.value, 'compare.png')} and compare.json")


if __name__ == "__main__":
    cli.run(main)
