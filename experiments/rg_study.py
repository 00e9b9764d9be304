"""The reasoning-gym study, chosen before any of its runs: ten datasets from four of the library's
categories, one recipe for all, GRPO with and without PIPO, three seeds each.

    python -m experiments.rg_study --list                 # the datasets, their configs and commands
    python -m experiments.rg_study --datasets=gcd,lcm     # run some (all by default), one compare each

Each dataset's config only sizes its problems to the character model (prompts <= 48 characters once
the text all questions share is cut off, answers <= 8); rows that still do not fit are dropped and
counted (`task.reasoning_gym.overlong=drop`). Everything else is `RECIPE`, the same for every dataset.
Each run is `experiments.compare` (both arms from the same per-seed base model) and writes
`<out>/<dataset>/compare.json`, copied to `experiments/results/rg_study/<dataset>.json`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

from absl import flags

from experiments import cli

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags, defined when it runs (its module is imported beside other commands' by tests)."""
    flags.DEFINE_bool("list", False, "print the datasets, their configs and the commands; run nothing")
    flags.DEFINE_list("datasets", [], "the datasets to run (default: all of DATASETS)")
    flags.DEFINE_string("out", "runs/rg_study", "where the compare runs go (one folder per dataset)")

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "rg_study")


@dataclasses.dataclass(frozen=True)
class Dataset:
    name: str  # reasoning-gym's dataset name
    category: str  # its module in the library (reasoning_gym.<category>)
    config: dict  # its own config: problem sizes only


DATASETS = (
    Dataset("chain_sum", "arithmetic", {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1}),
    Dataset("basic_arithmetic", "arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}),
    Dataset("gcd", "arithmetic", {"min_numbers": 2, "max_numbers": 2, "min_value": 1, "max_value": 50}),
    Dataset("products", "arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}),
    Dataset("count_bits", "arithmetic", {}),
    Dataset("spell_backward", "algorithmic", {"min_word_len": 3, "max_word_len": 5}),
    Dataset("base_conversion", "algorithmic", {"min_base": 2, "max_base": 10, "min_value": 0, "max_value": 100}),
    Dataset("isomorphic_strings", "algorithmic", {}),
    Dataset("number_sequence", "cognition", {}),
    Dataset("simple_equations", "algebra", {"min_terms": 2, "max_terms": 2, "min_value": 1, "max_value": 9}),
)
SEEDS = "0-2"
ITERATIONS = 200
# The one recipe: the built-in task's `tiny` preset (model, batch, learning rates), the character
# form of the dataset, rows that do not fit dropped and counted, 6000 entries generated; the warm-up
# (at most the preset's 1200 steps) stops on what RL will see, checked every 10 steps: sampled pass@1
# at the rollout temperature >= 0.3 and at least half of the groups mixed.
RECIPE = ("task.name=reasoning_gym", "task.reasoning_gym.overlong=drop", "task.reasoning_gym.size=6000",
          "warmup.target_pass_rate=0.3", "warmup.target_mixed_groups=0.5", "warmup.eval_every=10")


def recipe_sets(d: Dataset) -> list[str]:
    """The config settings of dataset `d`: the recipe, then only its name and its own (size) config."""
    return [*RECIPE, f"task.reasoning_gym.dataset={d.name}",
            f"task.reasoning_gym.config={json.dumps(d.config, separators=(',', ':'))}"]


def compare_argv(d: Dataset, out: str) -> list[str]:
    """The `experiments.compare` command of dataset `d` (after `python -m`)."""
    return ["experiments.compare", "--algorithms=grpo", f"--seeds={SEEDS}", f"--iterations={ITERATIONS}",
            f"--out={out}", *(f"--set={s}" for s in recipe_sets(d))]


def dataset(name: str) -> Dataset:
    """The listed dataset called `name`."""
    by_name = {d.name: d for d in DATASETS}
    if name not in by_name:
        raise cli.UsageError(f"--datasets: {name!r} is not one of {tuple(by_name)}")
    return by_name[name]


def main(argv: list[str]) -> None:
    del argv
    chosen = [dataset(n) for n in FLAGS.datasets] or list(DATASETS)
    for d in chosen:
        argv = compare_argv(d, os.path.join(FLAGS.out, d.name))
        if FLAGS.list:
            print(f"{d.name} [{d.category}] {json.dumps(d.config)}\n  python -m " + " ".join(
                f"'{a}'" if "{" in a else a for a in argv))
            continue
        proc = subprocess.run([sys.executable, "-m", *argv])
        if proc.returncode != 0:
            raise RuntimeError(f"{d.name}: `python -m {' '.join(argv)}` exited with {proc.returncode}")
        os.makedirs(RESULTS, exist_ok=True)
        shutil.copyfile(os.path.join(FLAGS.out, d.name, "compare.json"), os.path.join(RESULTS, f"{d.name}.json"))


if __name__ == "__main__":
    define_flags()
    cli.run(main)
