"""A sweep's results as a researcher reads them: per point and seed the final held-out accuracy,
pass@1, the training-reward AUC and the held-out AUC (`overfit.heldout_auc`); per metric a table (mean and 95%
bootstrap CI over seeds, the paired difference against a baseline point with its Wilcoxon p where seeds pair),
and a plot of each metric against each swept key with CI bands (`experiments.stats`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from experiments import overfit, stats

# metric -> what it is (a row of `vmapped.run_group` holds them, pass@1 where eval.heldout_samples > 0)
METRICS = {"final_accuracy": "final held-out greedy accuracy",
           "final_pass_at_1": "final held-out pass@1 (sampled)",
           "reward_auc": "training-reward AUC (mean batch reward)",
           "heldout_auc": "held-out AUC (mean greedy accuracy of the evaluations after iteration 0)"}


def point_metrics(row: dict) -> dict[str, float]:
    """The metrics of one run's row (`vmapped.run_group`); the held-out AUC from its curve (`overfit`)."""
    out = {"final_accuracy": row["final_accuracy"], "reward_auc": row["reward_auc"],
           "heldout_auc": overfit.heldout_auc(row["acc_steps"], row["accuracy"])}
    if "final_pass_at_1" in row:
        out["final_pass_at_1"] = row["final_pass_at_1"]
    return out


def mean_ci(values: list[float]) -> dict[str, Any]:
    """{n, mean, ci95}: the 95% bootstrap CI of the mean over seeds (None with one seed)."""
    return {"n": len(values), "mean": float(np.mean(values)),
            "ci95": list(stats.bootstrap_mean_ci(values)) if len(values) > 1 else None}


def paired(point: dict[int, float], baseline: dict[int, float]) -> dict[str, Any] | None:
    """`point - baseline` over the seeds both have (paired by seed): mean, CI and Wilcoxon p from two seeds
    on (`stats.paired_difference`); the one difference with one seed; None with no common seed."""
    seeds = sorted(point.keys() & baseline.keys())
    if not seeds:
        return None
    if len(seeds) == 1:
        d = point[seeds[0]] - baseline[seeds[0]]
        return {"n": 1, "mean": d, "ci95": None, "wilcoxon_p": None, "diffs": [d], "seeds": seeds}
    return stats.paired_difference([point[s] for s in seeds], [baseline[s] for s in seeds]) | {"seeds": seeds}


def summarise(rows: list[dict], baseline: str | None) -> dict[str, Any]:
    """`rows`: {label, seed, metrics} per point and seed. Per metric and label: mean and CI over seeds,
    and (with a `baseline` label) the paired difference against it."""
    labels = list(dict.fromkeys(r["label"] for r in rows))
    metrics = [m for m in METRICS if all(m in r["metrics"] for r in rows)]
    by = {m: {lab: {r["seed"]: r["metrics"][m] for r in rows if r["label"] == lab} for lab in labels} for m in metrics}
    out: dict[str, Any] = {"metrics": metrics, "labels": labels, "baseline": baseline, "per_label": {},
                           "vs_baseline": {}}
    for m in metrics:
        out["per_label"][m] = {lab: mean_ci(list(by[m][lab].values())) for lab in labels}
        if baseline is not None:
            out["vs_baseline"][m] = {lab: paired(by[m][lab], by[m][baseline]) for lab in labels if lab != baseline}
    return out


def format_ci(stat: dict, digits: int = 3, signed: bool = False) -> str:
    """A {mean, ci95} statistic as '0.400 [0.300, 0.500]' (`signed`, for differences: '+0.400 [+0.300, +0.500]');
    the mean alone where ci95 is None (one seed)."""
    number = f"{{:{'+' if signed else ''}.{digits}f}}".format
    text = number(stat["mean"])
    return text + (f" [{number(stat['ci95'][0])}, {number(stat['ci95'][1])}]" if stat["ci95"] else "")


def _diff(stat: dict | None, digits: int = 3) -> str:
    if stat is None:
        return "-"
    return format_ci(stat, digits, signed=True) + (f", p = {stat['wilcoxon_p']:.3g}" if stat["ci95"] else "")


def format_tables(summary: dict) -> str:
    """Markdown: one table per metric, a row per point (label)."""
    blocks, base = [], summary["baseline"]
    for m in summary["metrics"]:
        head = f"| point | seeds | {METRICS[m]}: mean [95% CI] |"
        sep = "| --- | --- | --- |"
        if base is not None:
            head += f" minus `{base}` [95% CI], Wilcoxon p |"
            sep += " --- |"
        lines = [head, sep]
        for lab, stat in summary["per_label"][m].items():
            line = f"| {lab} | {stat['n']} | {format_ci(stat)} |"
            if base is not None:
                line += " (baseline) |" if lab == base else f" {_diff(summary['vs_baseline'][m][lab])} |"
            lines.append(line)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _as_number(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def plot(rows: list[dict], swept: list[str], summary: dict, path: str) -> None:
    """A panel per metric (rows) and swept key (columns): the metric's mean over seeds against the key's
    value, one line per combination of the other swept keys, with its 95% bootstrap band; a baseline
    point that does not set the key is a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics, base = summary["metrics"], summary["baseline"]
    keys = swept or ["(none)"]
    fig, axes = plt.subplots(len(metrics), len(keys), figsize=(4.2 * len(keys), 3.2 * len(metrics)), squeeze=False)
    overrides = {r["label"]: r["overrides"] for r in rows}
    for j, key in enumerate(keys):
        lines: dict[str, list[tuple[Any, str]]] = {}
        for lab, o in overrides.items():
            if key in o or key == "(none)":
                rest = ",".join(f"{k}={v}" for k, v in o.items() if k != key) or key
                lines.setdefault(rest, []).append((o.get(key, lab), lab))
        for i, m in enumerate(metrics):
            ax = axes[i][j]
            for rest, members in lines.items():
                values = [v for v, _ in members]
                numeric = all(_as_number(v) is not None for v in values)
                order = sorted(range(len(members)), key=lambda k: _as_number(values[k]) if numeric else k)
                x = [_as_number(values[k]) if numeric else k for k in order]
                stat = [summary["per_label"][m][members[k][1]] for k in order]
                ax.plot(x, [s["mean"] for s in stat], marker="o", label=rest)
                if all(s["ci95"] for s in stat):
                    ax.fill_between(x, [s["ci95"][0] for s in stat], [s["ci95"][1] for s in stat], alpha=0.2)
                if not numeric:
                    ax.set_xticks(x, [str(values[k]) for k in order])
                elif len(set(x)) > 1 and min(x) > 0 and max(x) / min(x) >= 10:
                    ax.set_xscale("log")
            if base is not None and key not in overrides.get(base, {}):
                ax.axhline(summary["per_label"][m][base]["mean"], color="gray", linestyle="--", label=base)
            ax.set_xlabel(key)
            ax.set_title(METRICS[m], fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
