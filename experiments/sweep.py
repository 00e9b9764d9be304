"""A grid over seeds, PIPO's lam and window K on the tiny task (or any config).

    python -m experiments.sweep --config=configs/grpo.py:tiny --seeds=0,1 --lams=0.05,0.1,0.2 --windows=4,8

Every grid point runs with PIPO enabled from the seed's shared warmed-up base model;
`--baseline` adds the PIPO-off run per seed. Writes sweep.json and prints a table.
"""

from __future__ import annotations

import copy
import itertools
import json
import os

from absl import flags
from ml_collections import config_flags

from experiments import cli
from experiments.runs import run, warmed_up_model

_CONFIG = config_flags.DEFINE_config_file("config", "configs/grpo.py:tiny", "run config file:preset")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "seeds")
_LAMS = flags.DEFINE_list("lams", ["0.1"], "pipo.lam values")
_WINDOWS = flags.DEFINE_list("windows", ["8"], "pipo.window (K) values")
_BASELINE = flags.DEFINE_bool("baseline", True, "also run PIPO off for each seed")
_OUT = flags.DEFINE_string("out", "runs/sweep", "output directory")


def grid(seeds, lams, windows, baseline: bool) -> list[dict]:
    points = [{"seed": s, "pipo": True, "lam": lam, "window": k} for s, lam, k in itertools.product(seeds, lams, windows)]
    if baseline:
        points += [{"seed": s, "pipo": False, "lam": None, "window": None} for s in seeds]
    return points


def main(argv):
    del argv
    points = grid(cli.parse_list("seeds", _SEEDS.value, int), cli.parse_list("lams", _LAMS.value, float),
                  cli.parse_list("windows", _WINDOWS.value, int), _BASELINE.value)
    os.makedirs(_OUT.value, exist_ok=True)
    rows = []
    for pt in points:
        c = copy.deepcopy(_CONFIG.value)
        c.seed, c.pipo.enabled = pt["seed"], pt["pipo"]
        if pt["pipo"]:
            c.pipo.lam, c.pipo.window = pt["lam"], pt["window"]
        name = f"seed{pt['seed']}_" + (f"lam{pt['lam']}_K{pt['window']}" if pt["pipo"] else "baseline")
        result = run(c, os.path.join(_OUT.value, name), warmed_up_model(c, pt["seed"], _OUT.value))
        rows.append(dict(pt, name=name, final_accuracy=result["final_accuracy"], reward_auc=result["reward_auc"],
                         pi_steps=result["pi_steps"]))
        print(f"{name}: final acc {result['final_accuracy']:.3f}, reward AUC {result['reward_auc']:.3f}")
    with open(os.path.join(_OUT.value, "sweep.json"), "w") as f:
        json.dump(rows, f, indent=2)
    print("| run | final acc | reward AUC | PI steps |\n| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['name']} | {r['final_accuracy']:.3f} | {r['reward_auc']:.3f} | {r['pi_steps']} |")


if __name__ == "__main__":
    cli.run(main)
