"""Training reward against held-out accuracy: a run whose training reward rises while its held-out
accuracy does not has learned its training questions, not the task (seen on a reasoning-gym dataset
with a small question space: reward 0.43 -> 0.74 over 200 iterations, held-out accuracy 0.13 -> 0.16).

`heldout_auc` is the held-out side of the training-reward AUC the tables report (the mean batch reward
over the iterations); `heldout_gap_flag` says when the two part ways. `run_figures` reads both from a
run's curves as `experiments/runs.py:summarise` and `experiments/vmapped.py:run_group` store them
(`reward`, `acc_steps`, `accuracy`), so the tables compute them for stored results too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

MIN_TRAIN_RISE = 0.10  # reward per response: smaller rises are within a run's noise on the tables' runs
HELDOUT_SHARE = 0.25  # held-out accuracy must rise by at least this share of the training reward's rise
EDGE_SHARE = 0.2  # the share of a curve at each end that `rise` averages


def heldout_auc(acc_steps: Sequence[int], accuracy: Sequence[float]) -> float:
    """Area under the held-out greedy accuracy curve per iteration, as the training-reward AUC is
    under the batch reward: the mean of the evaluations after iteration 0 (the base model's is not
    the run's); NaN without one. The evaluations are equally spaced (`eval.every`) but the last."""
    after = [a for s, a in zip(acc_steps, accuracy) if s > 0]
    return float(np.mean(after)) if after else float("nan")


def rise(curve: Sequence[float], share: float = EDGE_SHARE) -> tuple[float, float]:
    """(start, end): the means of the first and the last `share` of `curve` (at least one point each)."""
    x = np.asarray(curve, np.float64)
    k = max(1, int(round(share * len(x))))
    return float(x[:k].mean()), float(x[-k:].mean())


def heldout_gap_flag(train_reward_curve: Sequence[float], heldout_acc_curve: Sequence[float]) -> str | None:
    """A one-line warning when the training reward rose (end - start >= `MIN_TRAIN_RISE`, `rise`) while
    held-out accuracy rose by less than `HELDOUT_SHARE` of that; None otherwise (or with fewer than two
    points of either curve). `train_reward_curve`: the batch reward per iteration; `heldout_acc_curve`:
    held-out accuracy at each evaluation, the base model's (iteration 0) first."""
    if len(train_reward_curve) < 2 or len(heldout_acc_curve) < 2:
        return None
    (r0, r1), (a0, a1) = rise(train_reward_curve), rise(heldout_acc_curve)
    if any(math.isnan(v) for v in (r0, r1, a0, a1)) or r1 - r0 < MIN_TRAIN_RISE:
        return None
    if a1 - a0 >= HELDOUT_SHARE * (r1 - r0):
        return None
    return (f"training reward rose {r0:.2f} -> {r1:.2f} ({r1 - r0:+.2f}) while held-out accuracy went {a0:.2f} -> "
            f"{a1:.2f} ({a1 - a0:+.2f}): the policy learned its training questions more than the task")


def run_figures(run: dict[str, Any]) -> dict[str, Any]:
    """{"heldout_auc", "gap_flag"} of a run's stored curves (`reward`, `acc_steps`, `accuracy`)."""
    return {"heldout_auc": heldout_auc(run["acc_steps"], run["accuracy"]),
            "gap_flag": heldout_gap_flag(run["reward"], run["accuracy"])}


def describe_flags(runs: Sequence[dict[str, Any]]) -> str:
    """A table cell: "-" when no run is flagged, else "k/n" runs flagged."""
    flagged = sum(run_figures(r)["gap_flag"] is not None for r in runs)
    return f"{flagged}/{len(runs)}" if flagged else "-"
