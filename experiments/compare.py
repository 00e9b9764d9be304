"""Algorithms with and without PIPO over many seeds on the built-in task (or any task with a
JAX reward, e.g. a reasoning-gym dataset), with uncertainty.

    python -m experiments.compare --algorithms=grpo --seeds=0-9 --out=runs/compare_grpo
    python -m experiments.compare --algorithms=sdpo,vpd --seeds=0-4 --iterations=150 --out=runs/compare_sdpo
    python -m experiments.compare --algorithms=sdpo --seeds=0-4 \
        --variant=sdpo:norm:pipo.attribution_norm=mean_abs --variant=sdpo:lam0:pipo.lam=0.0
    python -m experiments.compare --algorithms=grpo --seeds=0-4 --out=runs/compare_rg_gcd \
        --set=task.name=reasoning_gym --set=task.reasoning_gym.dataset=gcd \
        --set='task.reasoning_gym.config={"max_value":30}'

`--set=KEY=VALUE` (repeatable) sets any config key of every arm, as `--config.KEY=VALUE` does
for the trainer (the value read as the key's type).

Each seed has its own warmed-up base model (`experiments.runs.warmed_up_model`); both arms
of an algorithm start from it and see the same RNG stream, so within a seed the two runs
differ by PIPO's verification step alone. A comparison is a sweep with paired arms, on the sweep's
engine: an arm is a point at every seed (`experiments.study`); the points whose jit-static specs are
equal (all seeds of an arm, and arms that differ only in values the train state carries) run as ONE
program: their `TrainState`s are stacked and `jax.vmap(loop.scan_chunk)` advances them together
(`vmapped.run_group`; with `--members=map` one after another, each bit-equal to its separate
run). The groups run as a sweep's do (`experiments.schedule`): `--workers=N` side by side,
`--emit_slurm=FILE` a job array of one group per task, `--group_index` / `--group_shard`
(experiments/launch/tpu_sweep.sh) some of them, `--collect_only` the report from the stored ones,
`--dry_run` the groups printed; each group writes its own file under <out>/groups/, and run again a
finished group is read back, not rerun.

Per algorithm it reports the paired difference (with PIPO minus without, same seed and
base model) of final held-out greedy accuracy and of reward AUC (mean batch reward over
the run): mean, 95% bootstrap confidence interval and the exact Wilcoxon signed-rank
p-value (`experiments.stats`); per arm, the gain over the base model the same way.
`--variant=ALGO:LABEL:key=value[;key=value...]` (repeatable) adds a PIPO arm `ALGO+PIPO[LABEL]`
with those config overrides (e.g. `pipo.attribution_norm=mean_abs`), from the same base models
and RNG streams, reported paired against both the no-PIPO arm and the paper's PIPO arm.
Writes compare.json (with commit, package versions, CPU, seeds, wall / CPU time) and
compare.png (mean curves with 95% bootstrap bands over seeds).
"""

from __future__ import annotations

import ast
import functools
import importlib
import os
import time
from typing import Any

import ml_collections
import numpy as np
from absl import flags

from experiments import cli, overfit, provenance, schedule, stats, study, study_report
from experiments.overrides import set_key, with_overrides
from experiments.runs import parse_seeds, warmed_up_model
from pipo_jax.config.sections import RunConfig
from pipo_jax.run import atomic

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags, defined when it runs (tests import this module beside other commands'): its own
    and the sweep engine's launch flags (`experiments.schedule`)."""
    flags.DEFINE_list("algorithms", ["grpo"], "algorithms (configs/<name>.py) to compare")
    flags.DEFINE_string("preset", "tiny", "preset of the algorithm configs")
    flags.DEFINE_string("seeds", "0-4", "seeds: 'a-b' (inclusive) or a comma list")
    flags.DEFINE_integer("iterations", 0, "RL iterations; 0 = the preset's")
    flags.DEFINE_integer("eval_every", 0, "iterations between evaluations; 0 = the preset's eval.every")
    flags.DEFINE_string("out", "runs/compare", "output directory (base models are cached here)")
    flags.DEFINE_multi_string("set", [], "KEY=VALUE: a config key of every arm (e.g. task.reasoning_gym.dataset=gcd)")
    flags.DEFINE_string("base_dir", "", "where the per-seed base models are cached; '' = --out "
                        "(two runs may share one: a base model found there is not warmed up again)")
    flags.DEFINE_multi_string("variant", [], "ALGO:LABEL:key=value[;key=value]: an extra PIPO arm "
                              "ALGO+PIPO[LABEL] with these config overrides (repeatable)")
    schedule.define_flags()


def parse_variant(text: str) -> tuple[str, str, dict[str, Any]]:
    """'sdpo:norm:pipo.attribution_norm=mean_abs;pipo.lam=0.0' -> ('sdpo', 'norm', {key: value});
    values as Python literals where they parse (numbers, True / False / None), else strings."""
    try:
        algorithm, label, assignments = text.split(":", 2)
        overrides = {}
        for item in filter(None, assignments.split(";")):
            key, value = item.split("=", 1)
            try:
                overrides[key.strip()] = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                overrides[key.strip()] = value.strip()
    except ValueError:
        raise ValueError(f"--variant={text!r}: expected ALGO:LABEL:key=value[;key=value]") from None
    if not (algorithm and label and overrides):
        raise ValueError(f"--variant={text!r}: expected ALGO:LABEL:key=value[;key=value]")
    return algorithm, label, overrides


def algorithm_config(name: str, preset: str, iterations: int, assignments: tuple[str, ...] = (), eval_every: int = 0
                     ) -> ml_collections.ConfigDict:
    """configs/<name>.py's `preset` (with `iterations` and `eval_every` where > 0); an unknown algorithm or
    preset is a `UsageError` naming the flag."""
    if not os.path.exists(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                                       f"{name}.py")):
        raise cli.UsageError(f"--algorithms: no config file configs/{name}.py for algorithm {name!r}")
    try:
        c = importlib.import_module(f"configs.{name}").get_config(preset)
    except ValueError as e:
        raise cli.UsageError(f"--preset={preset}: {cli.one_line(e)}") from None
    for a in assignments:
        try:
            set_key(c, a)
        except ValueError as e:
            raise cli.UsageError(f"--set: {e}") from None
    if iterations:
        c.iterations = iterations
    if eval_every:
        c.eval.every = eval_every
    return c


def _has_curves(runs: list[dict]) -> bool:
    """Whether every run holds the curves `overfit.run_figures` reads."""
    return all(k in r for r in runs for k in ("reward", "acc_steps", "accuracy"))


def summarise(results: dict[str, list[dict]], algorithms: list[str]) -> dict:
    """Per arm: gain over the base; per algorithm: PIPO minus no PIPO (paired by seed)."""
    arms = {}
    for label, rs in results.items():
        final = [r["final_accuracy"] for r in rs]
        initial = [r["initial_accuracy"] for r in rs]
        arms[label] = {"n": len(rs), "initial_accuracy_mean": float(np.mean(initial)),
                       "final_accuracy_mean": float(np.mean(final)),
                       "reward_auc_mean": float(np.mean([r["reward_auc"] for r in rs])),
                       "gain_over_base": stats.paired_difference(final, initial),
                       "seeds_improved": int(np.sum(np.asarray(final) > np.asarray(initial))),
                       "pi_steps_mean": float(np.mean([r["pi_steps"] for r in rs]))}
        if _has_curves(rs):
            figures = [overfit.run_figures(r) for r in rs]
            arms[label]["heldout_auc_mean"] = float(np.mean([f["heldout_auc"] for f in figures]))
            arms[label]["gap_flags"] = [f["gap_flag"] for f in figures]
        if "final_pass_at_1" in rs[0]:
            arms[label]["initial_pass_at_1_mean"] = float(np.mean([r["initial_pass_at_1"] for r in rs]))
            arms[label]["final_pass_at_1_mean"] = float(np.mean([r["final_pass_at_1"] for r in rs]))
        if "teacher_accuracy_solution" in rs[0]:
            arms[label]["teacher_accuracy_solution_initial_mean"] = float(
                np.mean([r["teacher_accuracy_solution"][0] for r in rs]))
            arms[label]["teacher_accuracy_feedback_initial_mean"] = float(
                np.mean([r["teacher_accuracy_feedback"][0] for r in rs]))
    def diff(on, off):
        if _has_curves(on) and _has_curves(off):
            on, off = ([dict(r, **overfit.run_figures(r)) for r in rs] for rs in (on, off))
        return {metric: stats.paired_difference([r[metric] for r in on], [r[metric] for r in off])
                for metric in ("final_accuracy", "reward_auc", "heldout_auc", "final_pass_at_1") if metric in on[0]}

    paired, variants = {}, {}
    for a in algorithms:
        paired[a] = diff(results[a + "+PIPO"], results[a])
        for label in results:
            if label.startswith(a + "+PIPO["):
                variants[label] = {"minus_base": diff(results[label], results[a]),
                                   "minus_paper_pipo": diff(results[label], results[a + "+PIPO"])}
    return {"arms": arms, "pipo_minus_base": paired, "variants": variants}


def arm_config(config: ml_collections.ConfigDict, pipo: bool, overrides: dict) -> ml_collections.ConfigDict:
    """An arm's config: its algorithm's with the arm's overrides and PIPO on or off. An arm starts from
    its seed's base, warmed up once with the first algorithm's settings, so the warm-up's sampled targets
    are not the arm's to check (PPO's one response per prompt never makes a mixed group)."""
    c = with_overrides(config, overrides)
    c.pipo.enabled = pipo
    c.warmup.target_pass_rate = c.warmup.target_mixed_groups = None
    return c


def compare(algorithms: list[str], preset: str, seeds: list[int], out: str, iterations: int = 0,
            eval_every: int = 0, assignments: tuple[str, ...] = (), variants: list[str] = (),
            base_dir: str = "", launch: schedule.Launch = schedule.Launch()) -> dict | None:
    """Runs every algorithm with PIPO off and on (and each `variants` arm) for all `seeds` (`assignments`:
    'KEY=VALUE' config settings of every arm) on the sweep engine: an arm is a point at every seed, the
    points grouped into programs, which run as `launch` says (`schedule.run_study`: here, side by side, or
    one per task of a cluster) and store their results in <out>/groups/, where a finished group is read
    back, not rerun. Writes compare.json / .png from them and returns the record (None where this process
    reports nothing: a dry run, an emitted SLURM script, some groups of many)."""
    origin = provenance.record()  # the code that runs (taken now: the tree may change while it runs)
    try:
        parsed = [parse_variant(v) for v in variants]
    except ValueError as e:
        raise cli.UsageError(str(e)) from None
    for algorithm, label, _ in parsed:
        if algorithm not in algorithms:
            raise cli.UsageError(f"--variant {algorithm}:{label}: {algorithm!r} is not in --algorithms={algorithms}")
    # a bad flag fails before any write
    configs = {a: algorithm_config(a, preset, iterations, tuple(assignments), eval_every) for a in algorithms}
    for algorithm, label, overrides in parsed:
        try:
            with_overrides(configs[algorithm], overrides)
        except ValueError as e:
            raise cli.UsageError(f"--variant {algorithm}:{label}: {e}") from None
    start, cpu_start = time.perf_counter(), time.process_time()
    first = next(iter(configs.values()))
    arms = []  # (label, config, overrides) of every arm, in the table's order
    for name, config in configs.items():
        kinds = [("", False, {}), ("+PIPO", True, {})]
        kinds += [(f"+PIPO[{label}]", True, o) for algorithm, label, o in parsed if algorithm == name]
        arms += [(name + arm, arm_config(config, enabled, o), o) for arm, enabled, o in kinds]
    points = [study.Point(label, s, o, study.checked_config(c, {"seed": s}, f"arm {label} (seed {s})"))
              for label, c, o in arms for s in seeds]  # every point validated before anything runs
    groups = study.group_points(points)
    # one base model per seed, warmed up with the first algorithm's settings and shared by every arm
    done = schedule.run_study("experiments.compare", points, groups, out,
                              lambda p: warmed_up_model(RunConfig.from_config(first), p.seed, base_dir or out),
                              study.code_version(origin["commit"]), launch)
    if done is None:
        return None
    entries, reused = done
    results = {label: [entries[p.name]["result"] for p in points if p.label == label] for label, _, _ in arms}
    summary = summarise(results, algorithms)
    children = os.times()
    record = {"script": "experiments/compare.py", "algorithms": algorithms, "preset": preset, "seeds": seeds,
              "settings": list(assignments), "task": first.task.name,
              "variants": {f"{a}+PIPO[{label}]": o for a, label, o in parsed},
              "iterations": first.iterations, "wall_time_s": time.perf_counter() - start,
              "cpu_time_s": time.process_time() - cpu_start + children.children_user + children.children_system,
              "groups": [[p.name for p in members] for members in groups], "members": launch.members,
              "reused_points": reused,
              "reused_arms": [label for label, _, _ in arms if all(p.name in reused for p in points
                                                                   if p.label == label)],
              **origin, "summary": summary, "runs": results}
    atomic.write_json_atomic(os.path.join(out, "compare.json"), record, indent=1)
    plot(results, os.path.join(out, "compare.png"))
    return record


def mean_band(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over seeds (axis 0) and its 95% bootstrap band, per column."""
    if y.shape[0] < 2:
        return y.mean(0), y.mean(0), y.mean(0)
    bands = np.array([stats.bootstrap_mean_ci(col, resamples=2000) for col in y.T])
    return y.mean(0), bands[:, 0], bands[:, 1]


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for label, rs in results.items():
        for ax, xk, yk in ((axes[0], "steps", "reward"), (axes[1], "acc_steps", "accuracy")):
            x = np.asarray(rs[0][xk])
            mean, low, high = mean_band(np.asarray([r[yk] for r in rs]))
            ax.plot(x, mean, label=label)
            ax.fill_between(x, low, high, alpha=0.2)
    n = len(next(iter(results.values())))
    axes[0].set_title(f"batch reward (mean, 95% CI over {n} seeds)")
    axes[1].set_title(f"held-out greedy accuracy (mean, 95% CI, {n} seeds)")
    for ax in axes:
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_table(record: dict) -> str:
    """Markdown: per arm the gain over the base; per algorithm PIPO's paired difference."""
    s, signed_ci = record["summary"], functools.partial(study_report.format_ci, signed=True)
    lines = ["| run | seeds | base acc | final acc | gain (95% CI) | seeds improved | training-reward AUC | "
             "held-out acc AUC | seeds whose training reward rose without held-out accuracy |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, a in s["arms"].items():
        g = a["gain_over_base"]
        flagged = sum(f is not None for f in a.get("gap_flags", []))
        gap = f"{flagged}/{a['n']}" if flagged else "-"
        heldout = f"{a['heldout_auc_mean']:.3f}" if "heldout_auc_mean" in a else "-"
        lines.append(f"| {label} | {a['n']} | {a['initial_accuracy_mean']:.3f} | {a['final_accuracy_mean']:.3f} | "
                     f"{signed_ci(g)} | {a['seeds_improved']}/{a['n']} | "
                     f"{a['reward_auc_mean']:.3f} | {heldout} | "
                     f"{gap} |")
    lines += ["", "| algorithm | PIPO - base: final acc (95% CI), Wilcoxon p | reward AUC (95% CI), Wilcoxon p |",
              "| --- | --- | --- |"]
    for name, p in s["pipo_minus_base"].items():
        f, r = p["final_accuracy"], p["reward_auc"]
        lines.append(f"| {name} | {signed_ci(f)}, p = {f['wilcoxon_p']:.3g} | "
                     f"{signed_ci(r, 4)}, p = {r['wilcoxon_p']:.3g} |")
    if s.get("variants"):
        lines += ["", "| variant | vs | final acc (95% CI), Wilcoxon p | reward AUC (95% CI), Wilcoxon p |",
                  "| --- | --- | --- | --- |"]
        for label, v in s["variants"].items():
            for vs, key in (("no PIPO", "minus_base"), ("paper PIPO", "minus_paper_pipo")):
                f, r = v[key]["final_accuracy"], v[key]["reward_auc"]
                lines.append(f"| {label} | {vs} | {signed_ci(f)}, p = {f['wilcoxon_p']:.3g} | "
                             f"{signed_ci(r, 4)}, p = {r['wilcoxon_p']:.3g} |")
    return "\n".join(lines)


def main(argv):
    del argv
    for name in ("iterations", "eval_every"):
        if FLAGS[name].value < 0:
            raise cli.UsageError(f"--{name}={FLAGS[name].value}: must be >= 0")
    record = compare(FLAGS.algorithms, FLAGS.preset, parse_seeds(FLAGS.seeds), FLAGS.out, FLAGS.iterations,
                     FLAGS.eval_every, tuple(FLAGS.set), FLAGS.variant, FLAGS.base_dir, schedule.Launch.from_flags())
    if record is None:
        return
    print(format_table(record))
    for label, arm in record["summary"]["arms"].items():
        for seed, flag in zip(record["seeds"], arm.get("gap_flags", [])):
            if flag is not None:
                print(f"{label} seed {seed}: {flag}")
    print(f"wrote {os.path.join(FLAGS.out, 'compare.json')} and compare.png "
          f"({record['wall_time_s']:.0f}s wall, {record['cpu_time_s']:.0f}s CPU)")


if __name__ == "__main__":
    define_flags()
    cli.run(main)
