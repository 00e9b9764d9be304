"""Every results table of the README and docs from one command, rendered from the JSON it writes.

    python -m experiments.reproduce main_job             # 5 seeds of the main job on this CPU model, render
    python -m experiments.reproduce algorithms           # the three algorithm comparisons, then render
    python -m experiments.reproduce methods              # the field's other methods, then render
    python -m experiments.reproduce every_method         # both runs above, then one row per method
    python -m experiments.reproduce ablations            # the SDPO / GSPO ablations of PIPO, then render
    python -m experiments.reproduce rg_study             # the ten reasoning-gym datasets, then render
    python -m experiments.reproduce every_method_rg      # every method on one reasoning-gym dataset
    python -m experiments.reproduce both_tasks           # both runs of methods above: one row per method, both tasks
    python -m experiments.reproduce sweep_lam_lr         # a sweep: 4 pipo.lam x 2 train.lr x 3 seeds (tiny task)
    python -m experiments.reproduce readiness_8b         # the 8B programs compiled for the host and TPU v5p
    python -m experiments.reproduce main_job --render    # run nothing: render the table from its JSON
    python -m experiments.reproduce --list               # the tables, their commands, JSONs and measured times

How long each table takes is read from its JSONs (`measured_time`), and `--help` and `--list` show it.

Each table is declared once in `TABLES`: the commands that measure it, the JSONs they write under
`experiments/results/` (commit, versions, CPU, seeds and times inside), and the marked blocks
(`<!-- table:NAME -->` ... `<!-- /table:NAME -->`) of the README / docs it is rendered into. The
blocks are never typed: `tests/test_reproduce.py` checks each one equals the render of its JSON, and
`tests/test_main_job_reproduces.py` (slow) reruns the main job's seed 0 and compares it with the row of
this host's CPU model.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Callable

from absl import flags

from experiments import cli, overfit, provenance, rg_study, stats, study_report
from experiments.benchmarks import readiness_tables

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags, defined when it runs (its module is imported beside other commands' by tests)."""
    flags.DEFINE_bool("render", False, "run nothing: render the tables from their JSONs")
    flags.DEFINE_bool("list", False, "list the tables, their commands and JSONs")
    flags.DEFINE_string("out", "runs/reproduce", "where the runs' workdirs go (one folder per table)")


@dataclasses.dataclass(frozen=True)
class Run:
    """One command of a table: `argv` (after `python -m`) writes `produced` (relative to its --out),
    which is copied to `experiments/results/<json>`."""

    argv: tuple[str, ...]
    produced: str
    json: str
    out_is_file: bool = False  # the command's --out names its JSON file (the readiness report), not a folder
    optional: bool = False  # True: not yet made, it is a record {"json_name", "missing": True}, shown as such
    # Made on this CPU model only (`provenance.cpu_model()`), with these vector extensions where given
    # (`provenance.cpu_isa()`) and this many schedulable cores (`provenance.schedulable_cpus()`, XLA:CPU's
    # thread pool): XLA:CPU's code and its split of the work, and so the rounding of a long RL trajectory,
    # follow the CPU, so a table can hold one record per CPU; None = any host.
    cpu_model: str | None = None
    cpu_isa: tuple[str, ...] | None = None
    cpus: int | None = None

    def made_here(self) -> bool:
        """Whether this host is the CPU the run belongs to (any host for a run of no CPU)."""
        return (self.cpu_model in (None, provenance.cpu_model()) and self.cpu_isa in (None, provenance.cpu_isa())
                and self.cpus in (None, provenance.schedulable_cpus()))


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    runs: tuple[Run, ...]
    render: Callable[[list[dict]], str]  # the JSON records, in `runs` order -> the block's markdown
    docs: tuple[str, ...]  # files (relative to the repo) holding the marked block


# ------------------------------------------------------------------------------------------ renderers


def _signed(x: float, digits: int = 3) -> str:
    return f"{x:+.{digits}f}"


def _machine(record: dict) -> str:
    """The CPU model, its vector extensions where recorded, cores and jax (the commit, date and the rest are in
    the JSON the table cites)."""
    isa = f" ({vector_extensions(record['cpu_isa'])})" if record.get("cpu_isa") else ""
    return f"{record['cpu_model']}{isa}, {record['cpu_count']} cores, jax {record['versions']['jax']}"


def vector_extensions(isa) -> str:
    """`provenance.cpu_isa()` in a few words, the widest first: 'AVX-512 with BF16 and VNNI, AVX2, FMA'; XLA:CPU
    generates code for them, so hosts with other extensions round differently."""
    isa = set(isa)
    parts = []
    if any(x.startswith("amx") for x in isa):
        parts.append("AMX")
    if any(x.startswith("avx512") for x in isa):
        extras = [name for flag, name in (("avx512_bf16", "BF16"), ("avx512_fp16", "FP16"), ("avx512_vnni", "VNNI"))
                  if flag in isa]
        parts.append("AVX-512" + (f" with {' and '.join(extras)}" if extras else ""))
    parts += [name for flag, name in (("avx2", "AVX2"), ("fma", "FMA")) if flag in isa]
    if not parts:
        parts.append("AVX" if "avx" in isa else "no AVX")
    return ", ".join(parts)


def render_main_job(records: list[dict]) -> str:
    """The main job's per-seed table and its summary line, one per record (CPU model)."""
    return "\n\n".join(_main_job_block(rec) for rec in records)


def _main_job_block(rec: dict) -> str:
    runs = rec["runs"]
    how = f"{rec['workers']} runs at a time" if rec["workers"] else "the runs collected from their workdirs"
    isa = rec.get("cpu_isa") or _DECLARED_ISA.get(rec["json_name"])
    vector = vector_extensions(isa) if isa else "vector extensions not recorded"
    lines = [f"Measured with {rec['cpu_model']} ({vector}), {rec['cpu_count']} cores, jax {rec['versions']['jax']}, "
             f"{how} (JSON: `experiments/results/{rec['json_name']}`).", "",
             "| seed | base acc (held out, greedy) | after 20 it. | after 100 it. | gain | teacher acc with a "
             "solution / feedback context (end of warm-up) | wall / CPU time |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        at20 = dict(zip(r["acc_steps"], r["accuracy"])).get(20)
        teacher = (f"{r['warmup_teacher_solution_accuracy']:.2f} / {r['warmup_teacher_feedback_accuracy']:.2f}"
                   if r.get("warmup_teacher_solution_accuracy") is not None else "-")
        times = (f"{r['wall_time_s']:.0f} s / {r['cpu_time_s']:.0f} s" if r.get("wall_time_s") is not None
                 else "-")
        lines.append(f"| {r['seed']} | {r['initial_accuracy']:.3f} | "
                     f"{'-' if at20 is None else f'{at20:.3f}'} | {r['final_accuracy']:.3f} | "
                     f"{_signed(r['gain'])} | {teacher} | {times} |")
    base = [r["initial_accuracy"] for r in runs]
    improved = sum(r["gain"] > 0 for r in runs)
    lines += ["", f"{improved} of {len(runs)} seeds gain held-out greedy accuracy (mean {_signed(rec['gain_mean'])}, "
              f"least {_signed(rec['gain_min'])}) from bases solving {min(base):.0%}-{max(base):.0%}."]
    return "\n".join(lines)


_ci = functools.partial(study_report.format_ci, signed=True)  # (stat, digits): a difference's mean and 95% CI


def render_algorithms(records: list[dict]) -> str:
    """Per arm: base, final accuracy, gain over the base with its CI, reward AUC; per algorithm: PIPO
    minus no PIPO. An algorithm in several runs is shown from the first run that has it."""
    arm_rows, diff_rows, shown = [], [], set()
    for rec in records:
        name = f"`{rec['json_name']}`"
        summary = rec["summary"]
        for algo in rec["algorithms"]:
            if algo in shown:
                continue
            shown.add(algo)
            for arm in (algo, f"{algo}+PIPO"):
                a = summary["arms"][arm]
                arm_rows.append(f"| {arm} | {a['n']} | {a['initial_accuracy_mean']:.3f} | "
                                f"{a['final_accuracy_mean']:.3f} | {_ci(a['gain_over_base'])} | "
                                f"{a['seeds_improved']}/{a['n']} | {a['reward_auc_mean']:.3f} | {name} |")
            d = summary["pipo_minus_base"][algo]
            acc, auc = d["final_accuracy"], d["reward_auc"]
            higher = sum(x > 0 for x in acc["diffs"])
            diff_rows.append(f"| {algo} | {acc['n']} | {_ci(acc)} | {acc['wilcoxon_p']:.3g} | {higher}/{acc['n']} | "
                             f"{_ci(auc, 4)} | {auc['wilcoxon_p']:.3g} |")
    machines = sorted({_machine(r) for r in records})
    return "\n".join([
        f"Measured with {'; '.join(machines)} (JSONs in `experiments/results/`).", "",
        "| arm | seeds | base acc | final acc | gain over base (95% CI) | seeds improved | reward AUC | JSON |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | --- |", *arm_rows, "",
        "| algorithm | seeds | PIPO - no PIPO, final acc (95% CI) | Wilcoxon p | seeds where PIPO is higher | "
        "reward AUC difference (95% CI) | Wilcoxon p |",
        "| --- | ---: | --- | ---: | ---: | --- | ---: |", *diff_rows])


def _diff_cells(d: dict) -> str:
    """'final acc CI, p, higher | reward AUC CI' of one paired difference (variant minus reference)."""
    acc, auc = d["final_accuracy"], d["reward_auc"]
    higher = sum(x > 0 for x in acc["diffs"])
    return f"{_ci(acc)}, p = {acc['wilcoxon_p']:.3g}, {higher}/{acc['n']} | {_ci(auc, 4)}, p = {auc['wilcoxon_p']:.3g}"


def render_ablations(records: list[dict]) -> str:
    """Per arm (no PIPO, the paper's PIPO, each variant): base, final accuracy, reward AUC, PI steps,
    and the paired differences from no PIPO and from the paper's PIPO."""
    rows = []
    for rec in records:
        summary = rec["summary"]
        for algo in rec["algorithms"]:
            arms = [algo, f"{algo}+PIPO", *(v for v in summary["variants"] if v.startswith(f"{algo}+PIPO["))]
            for arm in arms:
                a = summary["arms"][arm]
                if arm == algo:
                    vs_base, vs_paper = "- | -", "-"
                elif arm == f"{algo}+PIPO":
                    vs_base, vs_paper = _diff_cells(summary["pipo_minus_base"][algo]), "-"
                else:
                    v = summary["variants"][arm]
                    vs_base, vs_paper = _diff_cells(v["minus_base"]), _diff_cells(v["minus_paper_pipo"]).split(" | ")[0]
                overrides = "; ".join(f"`{k}={val}`" for k, val in rec["variants"].get(arm, {}).items()) or "-"
                rows.append(f"| {arm} | {overrides} | {a['n']} | {a['initial_accuracy_mean']:.3f} | "
                            f"{a['final_accuracy_mean']:.3f} | {a['reward_auc_mean']:.3f} | "
                            f"{a.get('pi_steps_mean', 0):.0f} | "
                            f"{vs_base} | {vs_paper} |")
    machines = sorted({_machine(r) for r in records})
    names = ", ".join(f"`experiments/results/{r['json_name']}`" for r in records)
    return "\n".join([
        f"Measured with {'; '.join(machines)}, {records[0]['iterations']} iterations, seeds "
        f"{', '.join(map(str, records[0]['seeds']))} (JSON: {names}). Differences are paired by seed: "
        "mean [95% bootstrap CI], Wilcoxon p, seeds where the arm is higher.", "",
        "| arm | overrides | seeds | base acc | final acc | reward AUC | PI steps | minus no PIPO: final acc | "
        "reward AUC | minus the paper's PIPO: final acc |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |", *rows])


def render_every_method(records: list[dict]) -> str:
    """One row per method, every run's methods together: no PIPO vs PIPO final accuracy and the paired
    difference. A method in several runs is shown from the first run that has it (as `render_algorithms`)."""
    rows, shown = [], set()
    for rec in records:
        summary = rec["summary"]
        for algo in rec["algorithms"]:
            if algo in shown:
                continue
            shown.add(algo)
            off, on = summary["arms"][algo], summary["arms"][f"{algo}+PIPO"]
            d = summary["pipo_minus_base"][algo]
            acc, auc = d["final_accuracy"], d["reward_auc"]
            higher = sum(x > 0 for x in acc["diffs"])
            rows.append(f"| {algo} | {acc['n']} | {off['initial_accuracy_mean']:.3f} | "
                        f"{off['final_accuracy_mean']:.3f} | "
                        f"{on['final_accuracy_mean']:.3f} | {_ci(acc)} | {higher}/{acc['n']} | {_ci(auc, 4)} | "
                        f"`{rec['json_name']}` |")
    machines = sorted({_machine(r) for r in records})
    return "\n".join([
        f"Measured with {'; '.join(machines)} (JSONs in `experiments/results/`).", "",
        "| method | seeds | base acc | final acc, no PIPO | final acc, PIPO | PIPO - no PIPO, final acc (95% CI) | "
        "seeds where PIPO is higher | reward AUC difference (95% CI) | JSON |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: | --- | --- |", *rows])


def _pass1(arm: dict, key: str) -> str:
    return f"{arm[key]:.3f}" if key in arm else "-"


def render_rg_study(records: list[dict]) -> str:
    """Per pre-listed dataset (`experiments/rg_study.py:DATASETS`, in that order): each arm's greedy
    accuracy (base, final, gain with its CI, seeds improved), pass@1 at the rollout temperature (base,
    final), training-reward AUC and held-out accuracy AUC with the seeds whose training reward rose without
    held-out accuracy (`overfit`, from the stored curves); then PIPO minus no PIPO. A dataset not yet run
    says so."""
    arm_rows, diff_rows, machines = [], [], set()
    for d, rec in zip(rg_study.DATASETS, records):
        if rec.get("missing"):
            arm_rows.append(f"| `{d.name}` ({d.category}) | not run yet | | | | | | | | | | |")
            diff_rows.append(f"| `{d.name}` | not run yet | | | | |")
            continue
        machines.add(_machine(rec))
        summary = rec["summary"]
        for arm in ("grpo", "grpo+PIPO"):
            a = summary["arms"][arm]
            arm_rows.append(f"| `{d.name}` ({d.category}) | {arm} | {a['n']} | {a['initial_accuracy_mean']:.3f} | "
                            f"{a['final_accuracy_mean']:.3f} | {_ci(a['gain_over_base'])} | "
                            f"{a['seeds_improved']}/{a['n']} | {_pass1(a, 'initial_pass_at_1_mean')} | "
                            f"{_pass1(a, 'final_pass_at_1_mean')} | {a['reward_auc_mean']:.3f} | "
                            f"{_heldout_auc_mean(rec['runs'][arm]):.3f} | {overfit.describe_flags(rec['runs'][arm])} |")
        diff = summary["pipo_minus_base"]["grpo"]
        acc, auc = diff["final_accuracy"], diff["reward_auc"]
        p1 = _ci(diff["final_pass_at_1"]) if "final_pass_at_1" in diff else "-"
        heldout = stats.paired_difference(*([overfit.run_figures(r)["heldout_auc"] for r in rec["runs"][arm]]
                                            for arm in ("grpo+PIPO", "grpo")))
        diff_rows.append(f"| `{d.name}` | {_ci(acc)}, p = {acc['wilcoxon_p']:.3g} | "
                         f"{sum(x > 0 for x in acc['diffs'])}/{acc['n']} | {p1} | {_ci(auc, 4)} | "
                         f"{_ci(heldout, 4)} |")
    done = sum(not r.get("missing") for r in records)
    head = (f"{done} of {len(records)} datasets run" + (f", measured with {'; '.join(sorted(machines))}" if machines
                                                        else "") + " (JSONs in `experiments/results/rg_study/`).")
    return "\n".join([
        head, "",
        "| dataset | arm | seeds | base acc (greedy) | final acc (greedy) | gain over base (95% CI) | seeds improved | "
        "base pass@1 | final pass@1 | training-reward AUC | held-out acc AUC | seeds whose training reward rose "
        "without held-out accuracy |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |", *arm_rows, "",
        "| dataset | PIPO - no PIPO, final greedy acc (95% CI), Wilcoxon p | seeds where PIPO is higher | "
        "final pass@1 (95% CI) | training-reward AUC (95% CI) | held-out acc AUC (95% CI) |",
        "| --- | --- | ---: | --- | --- | --- |", *diff_rows])


def _heldout_auc_mean(runs: list[dict]) -> float:
    """The mean over seeds of each run's held-out accuracy AUC (`overfit.heldout_auc`)."""
    return sum(overfit.run_figures(r)["heldout_auc"] for r in runs) / len(runs)


def render_every_method_rg(records: list[dict]) -> str:
    """One row per method of `RG_METHOD_GROUPS` (a group not yet run: its methods say so): greedy held-out
    accuracy of the base, of each arm and the no-PIPO arm's gain over its base, then PIPO minus no PIPO on
    final greedy accuracy, pass@1 at the rollout temperature and reward AUC; the methods the task cannot
    run, with the reason, under it."""
    rows, machines = [], set()
    for group, rec in zip(RG_METHOD_GROUPS, records):
        if rec.get("missing"):
            rows += [f"| {algo} | not run yet | | | | | | | | | `{rec['json_name']}` |" for algo in group]
            continue
        machines.add(_machine(rec))
        summary = rec["summary"]
        for algo in group:
            off, on = summary["arms"][algo], summary["arms"][f"{algo}+PIPO"]
            d = summary["pipo_minus_base"][algo]
            acc = d["final_accuracy"]
            p1 = _ci(d["final_pass_at_1"]) if "final_pass_at_1" in d else "-"
            rows.append(f"| {algo} | {acc['n']} | {off['initial_accuracy_mean']:.3f} | {off['final_accuracy_mean']:.3f} | "
                        f"{_ci(off['gain_over_base'])} | {on['final_accuracy_mean']:.3f} | {_ci(acc)} | "
                        f"{sum(x > 0 for x in acc['diffs'])}/{acc['n']} | {p1} | {_ci(d['reward_auc'], 4)} | "
                        f"`{rec['json_name']}` |")
    done = sum(not r.get("missing") for r in records)
    head = (f"{done} of {len(records)} runs made" + (f", measured with {'; '.join(sorted(machines))}" if machines
                                                     else "") + " (JSONs in `experiments/results/every_method_rg/`).")
    skipped = "; ".join(f"{algo} (needs {why})" for algo, why in RG_NOT_APPLICABLE.items())
    return "\n".join([
        head, "",
        "| method | seeds | base acc | final acc, no PIPO | gain over base, no PIPO (95% CI) | final acc, PIPO | "
        "PIPO - no PIPO, final acc (95% CI) | seeds where PIPO is higher | PIPO - no PIPO, final pass@1 (95% CI) | "
        "reward AUC difference (95% CI) | JSON |",
        "| --- | ---: | ---: | ---: | --- | ---: | --- | ---: | --- | --- | --- |", *rows, "",
        f"Not run on reasoning-gym, whose task has no teacher contexts: {skipped}."])


def _method_cells(rec: dict, algo: str) -> list[str]:
    """seeds, base acc, gain over base without PIPO (CI), PIPO - no PIPO final acc (CI), seeds where PIPO
    is higher, reward AUC difference (CI): one task's cells of `render_both_tasks`."""
    summary = rec["summary"]
    off, d = summary["arms"][algo], summary["pipo_minus_base"][algo]
    acc = d["final_accuracy"]
    return [str(acc["n"]), f"{off['initial_accuracy_mean']:.3f}", _ci(off["gain_over_base"]), _ci(acc),
            f"{sum(x > 0 for x in acc['diffs'])}/{acc['n']}", _ci(d["reward_auc"], 4)]


def render_both_tasks(records: list[dict]) -> str:
    """Every method, one row: the built-in task's cells (`_BUILTIN_METHOD_RUNS`, the first run that has
    the method) beside reasoning-gym's (`RG_METHOD_GROUPS`; 'not run yet' for a run not made, 'n/a' with
    the reason for a method the task cannot run)."""
    builtin, rg = records[:len(_BUILTIN_METHOD_RUNS)], records[len(_BUILTIN_METHOD_RUNS):]
    first = {}
    for rec in builtin:
        for algo in rec["algorithms"]:
            first.setdefault(algo, rec)
    rg_of = {algo: rec for group, rec in zip(RG_METHOD_GROUPS, rg) for algo in group}
    blank = [""] * 5
    rows = []
    for algo, rec in first.items():
        if algo in RG_NOT_APPLICABLE:
            right = [f"n/a: needs {RG_NOT_APPLICABLE[algo]}", *blank]
        elif rg_of[algo].get("missing"):
            right = ["not run yet", *blank]
        else:
            right = _method_cells(rg_of[algo], algo)
        rows.append("| " + " | ".join([algo, *_method_cells(rec, algo), *right]) + " |")
    made = [r for r in rg if not r.get("missing")]
    machines = sorted({_machine(r) for r in builtin + made})
    cols = ("seeds", "base acc", "gain over base, no PIPO (95% CI)", "PIPO - no PIPO, final acc (95% CI)",
            "seeds where PIPO is higher", "reward AUC difference (95% CI)")
    return "\n".join([
        f"Built-in task: {len(builtin)} comparisons (100 iterations of the `tiny` preset); reasoning-gym "
        f"`{RG_METHODS_DATASET}`: {len(made)} of {len(rg)} comparisons made (the study's recipe, "
        f"{rg_study.ITERATIONS} iterations). Measured with {'; '.join(machines)}.", "",
        "| method | " + " | ".join(f"built-in: {c}" for c in cols) + " | " +
        " | ".join(f"{RG_METHODS_DATASET}: {c}" for c in cols) + " |",
        "| --- | " + " | ".join(["---:", "---:", "---", "---", "---:", "---"] * 2) + " |", *rows])


def render_readiness(records: list[dict]) -> str:
    """The readiness report's tables (`experiments/benchmarks/readiness_tables.py`) under the line that
    names its installed set, machine and time (its commit and date are in the JSON it cites)."""
    (rec,) = records
    pk = rec["packages"]
    return "\n".join([
        f"Measured on a {rec['machine']['cpus']}-core host ({rec['machine']['backend']}, "
        f"{rec['machine']['host_devices']} simulated devices), installed set `jax=={pk['jax']} jaxlib=={pk['jaxlib']} "
        f"libtpu=={pk['libtpu']}`, {rec['seconds'] / 60:.0f} min (JSON: `experiments/results/{rec['json_name']}`).",
        "", readiness_tables.markdown(rec)])


def render_sweep(records: list[dict]) -> str:
    """A sweep (`experiments.sweep`'s sweep.json): the machine line, points / programs / time, and its
    table per metric (`study_report.format_tables`); a sweep not yet run says so."""
    blocks = []
    for rec in records:
        if rec.get("missing"):
            blocks.append(f"Not run yet (no `experiments/results/{rec['json_name']}`).")
            continue
        points, programs = rec["points"], len(rec["groups"])
        members = {"vmap": ", its points batched", "map": ", its points one after another"}.get(rec.get("members"), "")
        blocks.append("\n".join([
            f"Measured with {_machine(rec)}: {len(points)} points ({', '.join(rec['swept_keys'])} x seeds "
            f"{','.join(map(str, rec['seeds']))}) in {programs} program{'s' * (programs != 1)}{members}, "
            f"{rec['wall_time_s']:.0f} s wall / "
            f"{rec['cpu_time_s']:.0f} s CPU (JSON: `experiments/results/{rec['json_name']}`).", "",
            study_report.format_tables(rec["summary"])]))
    return "\n\n".join(blocks)


def _rg_study_runs() -> tuple[Run, ...]:
    return tuple(Run(("experiments.rg_study", f"--datasets={d.name}"), f"{d.name}/compare.json",
                     f"rg_study/{d.name}.json", optional=True) for d in rg_study.DATASETS)


# ------------------------------------------------------------------------------------------ the tables

# Every method the reasoning-gym task can run, with and without PIPO, on one dataset of the study where
# RL learns within its budget, with the study's recipe, seeds, iterations and bases (the study's own
# warm-ups, shared through --base_dir: every arm starts from the same per-seed base), four or five a run.
RG_METHODS_DATASET = "chain_sum"
RG_METHOD_GROUPS = (("grpo", "dr_grpo", "ppo", "rloo"), ("reinforce_pp", "gspo", "dapo", "bnpo"),
                    ("disco", "bapo", "adora", "kl_cov"), ("clip_cov", "drpo", "copo", "riskpo", "gdpo"))
RG_NOT_APPLICABLE = {"sdpo": "teacher contexts", "vpd": "teacher contexts"}  # the task declares none


def _every_method_rg_runs() -> tuple[Run, ...]:
    d = rg_study.dataset(RG_METHODS_DATASET)
    return tuple(Run(("experiments.compare", f"--algorithms={','.join(group)}", f"--seeds={rg_study.SEEDS}",
                      f"--iterations={rg_study.ITERATIONS}", f"--base_dir=runs/rg_study/{d.name}",
                      *(f"--set={s}" for s in rg_study.recipe_sets(d))),
                     "compare.json", f"every_method_rg/{d.name}_{k}.json", optional=True)
                 for k, group in enumerate(RG_METHOD_GROUPS, 1))


_ALGORITHM_RUNS = (
    Run(("experiments.compare", "--algorithms=grpo,sdpo", "--seeds=0-9"), "compare.json",
        "compare_grpo_sdpo_10seeds.json"),
    Run(("experiments.compare", "--algorithms=ppo,gspo,dapo", "--seeds=0-4"), "compare.json",
        "compare_ppo_gspo_dapo_5seeds.json"),
    Run(("experiments.compare", "--algorithms=grpo,sdpo,vpd", "--seeds=0-4"), "compare.json",
        "compare_grpo_sdpo_vpd_5seeds.json"))
_METHOD_RUNS = (
    Run(("experiments.compare", "--algorithms=rloo,reinforce_pp,bnpo,disco,bapo,gdpo,adora", "--seeds=0-4"),
        "compare.json", "compare_methods_a_5seeds.json"),
    Run(("experiments.compare", "--algorithms=dr_grpo,kl_cov,clip_cov,drpo,copo,riskpo", "--seeds=0-4"),
        "compare.json", "compare_methods_b_5seeds.json"))
_BUILTIN_METHOD_RUNS = (*_ALGORITHM_RUNS, *_METHOD_RUNS)  # every method with a config file, on the built-in task

# The main job on each CPU it was measured on (the same command; the record of this host's CPU is the one
# `tests/test_main_job_reproduces.py` holds a rerun to). The Intel Xeon record predates `provenance.cpu_isa`.
_AMD_EPYC_ISA = ("avx", "avx2", "avx512_bf16", "avx512_bitalg", "avx512_vbmi2", "avx512_vnni", "avx512_vpopcntdq",
                 "avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512ifma", "avx512vbmi", "avx512vl", "f16c", "fma",
                 "sse4_1", "sse4_2", "sse4a")
MAIN_JOB_RUNS = tuple(
    Run(("experiments.main_job_seeds", "--seeds=0-4", "--workers=2"), "main_job_seeds.json", name, cpu_model=cpu,
        cpu_isa=isa, cpus=2)
    for cpu, isa, name in (("Intel(R) Xeon(R) Processor", None, "main_job_seeds.json"),
                           ("AMD EPYC", _AMD_EPYC_ISA, "main_job_seeds_amd_epyc.json")))
# The vector extensions a run declares, for its render where its JSON predates `cpu_isa`.
_DECLARED_ISA = {run.json: run.cpu_isa for run in MAIN_JOB_RUNS if run.cpu_isa}

TABLES = {t.name: t for t in (
    Table("main_job", MAIN_JOB_RUNS, render_main_job, ("README.md", "docs/results.md")),
    Table("algorithms", _ALGORITHM_RUNS, render_algorithms, ("docs/results.md",)),
    Table("methods", _METHOD_RUNS, render_algorithms, ("docs/results.md",)),
    Table("every_method", _BUILTIN_METHOD_RUNS, render_every_method, ("docs/results.md",)),
    Table("rg_study", _rg_study_runs(), render_rg_study, ("docs/results.md",)),
    Table("every_method_rg", _every_method_rg_runs(), render_every_method_rg, ("docs/results.md",)),
    Table("both_tasks", (*_BUILTIN_METHOD_RUNS, *_every_method_rg_runs()), render_both_tasks, ("docs/results.md",)),
    Table("readiness_8b",
          (Run(("experiments.benchmarks.readiness", "--parts=paper", "--models=qwen3_8b"), "readiness.json",
               "readiness_paper_8b.json", out_is_file=True),),
          render_readiness, ("docs/scaling.md",)),
    Table("sweep_lam_lr",
          (Run(("experiments.sweep", "--config=experiments/studies/pipo_lam_lr.py", "--seeds=0-2"), "sweep.json",
               "sweep_pipo_lam_lr_3seeds.json", optional=True),),
          render_sweep, ("docs/configs.md",)),
    Table("ablations",
          (Run(("experiments.compare", "--algorithms=sdpo,gspo", "--seeds=0-4",
                "--variant=sdpo:norm:pipo.attribution_norm=mean_abs",
                "--variant=sdpo:separate:pipo.pi_optimizer=separate",
                "--variant=sdpo:lam0:pipo.lam=0.0", "--variant=gspo:clip0.2:pipo.pi_clip_low=0.2;pipo.pi_clip_high=0.2",
                "--variant=gspo:lam0:pipo.lam=0.0"),
               "compare.json", "ablations_sdpo_gspo_5seeds.json"),),
          render_ablations, ("docs/results.md",)),
)}


def record_times(record: dict) -> tuple[float | None, float | None]:
    """(wall, CPU) seconds one JSON record holds (None where it has none): a comparison's `wall_time_s` /
    `cpu_time_s`; the main job's `total_wall_time_s` (None for runs collected from their workdirs) and its
    runs' CPU times summed; the readiness report's `seconds` (wall; it records no CPU time)."""
    if "seconds" in record:
        return record["seconds"], None
    if "total_wall_time_s" in record:  # experiments/main_job_seeds.py
        cpus = [r.get("cpu_time_s") for r in record["runs"]]
        return record.get("total_wall_time_s"), (sum(cpus) if None not in cpus else None)
    return record.get("wall_time_s"), record.get("cpu_time_s")


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{max(minutes, 1)} min"


def _times(wall: float | None, cpu: float | None) -> str:
    parts = [f"{_duration(wall)} wall" if wall is not None else "wall time not recorded"]
    if cpu is not None:
        parts.append(f"{_duration(cpu)} CPU")
    return ", ".join(parts)


def measured_time(table: Table) -> str:
    """How long the table's runs took, from its JSONs: per CPU model for a table whose runs belong to one
    (a host makes only its own), else their sum (and how many of its runs are made, where some are not)."""
    records = load_records(table)
    if all(run.cpu_model for run in table.runs):
        return "; ".join(f"on {run.cpu_model}: {_times(*record_times(rec))}" for run, rec in zip(table.runs, records))
    made = [record_times(rec) for rec in records if not rec.get("missing")]
    if not made:
        return f"not run yet (0 of {len(records)} runs made)"
    walls, cpus = [w for w, _ in made], [c for _, c in made]
    text = _times(sum(walls) if None not in walls else None, sum(cpus) if made and None not in cpus else None)
    return text + (f" ({len(made)} of {len(records)} runs made)" if len(made) < len(records) else "")


def usage() -> str:
    """The module's docstring and each table's measured time (`--help`)."""
    lines = [f"  {name}: {measured_time(table)}" for name, table in TABLES.items()]
    return "\n".join([__doc__.rstrip(), "", "Measured times, from the JSONs (wall time with other jobs sharing the "
                      "cores; the CPU time is the run's own):", *lines])


def load_records(table: Table) -> list[dict]:
    """The table's JSON records, each with `json_name` (its file's name) added."""
    records = []
    for run in table.runs:
        path = RESULTS / run.json
        if not path.exists() and run.optional:
            records.append({"json_name": run.json, "missing": True})
            continue
        if not path.exists():
            raise cli.UsageError(f"{table.name}: {path} is missing; run "
                                 f"`python -m experiments.reproduce {table.name}` first")
        records.append(json.loads(path.read_text()) | {"json_name": run.json})
    return records


def markers(name: str) -> tuple[str, str]:
    return f"<!-- table:{name} -->", f"<!-- /table:{name} -->"


def block(text: str, name: str, where: str) -> tuple[int, int]:
    """(start, end) of the text between the table's markers in `text`; one line naming the file if absent."""
    begin, end = markers(name)
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise cli.UsageError(f"{where}: no {begin} ... {end} block")
    return i + len(begin), j


def rendered_block(table: Table) -> str:
    return "\n" + table.render(load_records(table)) + "\n"


def render_into_docs(table: Table) -> list[str]:
    """Rewrites the table's marked blocks; returns the files changed."""
    body, changed = rendered_block(table), []
    for doc in table.docs:
        path = ROOT / doc
        text = path.read_text()
        i, j = block(text, table.name, doc)
        if text[i:j] != body:
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(text[:i] + body + text[j:])
            os.replace(tmp, path)
            changed.append(doc)
    return changed


def _where(run: Run) -> str:
    """" (on MODEL, N cores)" for a run of one CPU, "" for a run of any host."""
    if not run.cpu_model:
        return ""
    return f" (on {run.cpu_model}" + (f", {run.cpus} cores)" if run.cpus else ")")


def runs_of_this_host(table: Table) -> list[Run]:
    """The table's runs this host makes: those of any host and those of its CPU model; one line naming the
    models if the table has runs but none for this host."""
    runs = [r for r in table.runs if r.made_here()]
    if table.runs and not runs:
        measured = ", ".join(f"{r.cpu_model!r}" + (f" with {r.cpus} cores" if r.cpus else "") for r in table.runs)
        cores = provenance.schedulable_cpus()
        here = f"{provenance.cpu_model()!r} with its vector extensions and {cores} schedulable cores"
        raise cli.UsageError(f"{table.name}: measured on the CPU models {measured}, not on this host's {here} "
                             f"(XLA:CPU's rounding, and so the runs, follow the CPU and its thread pool): run its "
                             f"command directly, e.g. "
                             f"`python -m {' '.join(table.runs[0].argv)}`")
    return runs


def run_table(table: Table, out: str) -> None:
    """Runs the table's commands of this host (`runs_of_this_host`), each into its own folder of `out`, and
    copies their JSONs to results/."""
    for run in runs_of_this_host(table):
        k = table.runs.index(run)
        run_out = os.path.join(out, table.name, str(k))
        out_flag = os.path.join(run_out, run.produced) if run.out_is_file else run_out
        argv = [sys.executable, "-m", *run.argv, f"--out={out_flag}"]
        print("running:", " ".join(argv[1:]), flush=True)
        proc = subprocess.run(argv, cwd=ROOT)
        if proc.returncode != 0:
            raise RuntimeError(f"{table.name}: `{' '.join(argv[1:])}` exited with {proc.returncode}")
        (RESULTS / run.json).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(os.path.join(run_out, run.produced), RESULTS / run.json)


def main(argv: list[str]) -> None:
    names = argv[1:]
    if FLAGS.list:
        for t in TABLES.values():
            runs = "; ".join("python -m " + " ".join(r.argv) + f" -> experiments/results/{r.json}" + _where(r)
                             for r in t.runs)
            print(f"{t.name} ({measured_time(t)}): {runs}; rendered into {', '.join(t.docs)}")
        return
    unknown = [n for n in names if n not in TABLES]
    if not names or unknown:
        raise cli.UsageError(f"name tables among {sorted(TABLES)}" + (f", not {unknown[0]!r}" if unknown else ""))
    for name in names:
        if not FLAGS.render:
            run_table(TABLES[name], FLAGS.out)
        print(f"{name}: rendered into {', '.join(render_into_docs(TABLES[name])) or 'no file (unchanged)'}")


if __name__ == "__main__":
    __doc__ = usage()  # absl's --help prints the main module's docstring
    define_flags()
    cli.run(main)
