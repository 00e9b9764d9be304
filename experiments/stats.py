"""Paired comparisons over seeds in plain numpy: mean difference, a bootstrap 95% confidence
interval and the exact Wilcoxon signed-rank test (no scipy)."""

from __future__ import annotations

import numpy as np


def signed_rank_null_counts(ranks2: np.ndarray) -> np.ndarray:
    """Number of sign assignments giving each value of 2 * W+ under H0.

    `ranks2`: positive integer ranks times two (mid-ranks of ties are then integers).
    Returns `counts[s]` for s = 0 .. sum(ranks2): how many of the 2**n subsets of ranks
    sum to s (each |d_i| is positive or negative with probability 1/2, independently).
    """
    ranks2 = np.asarray(ranks2, np.int64)
    if np.any(ranks2 <= 0):
        raise ValueError(f"signed_rank_null_counts: ranks must be positive, got {ranks2.tolist()}")
    counts = np.zeros(int(ranks2.sum()) + 1, np.float64)
    counts[0] = 1.0
    for r in ranks2:
        shifted = np.zeros_like(counts)
        shifted[r:] = counts[:-r] if r else counts
        counts = counts + shifted
    return counts


def _midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of x with ties given their average rank."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), np.float64)
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def wilcoxon_signed_rank(diffs) -> dict:
    """Exact two-sided Wilcoxon signed-rank test of H0 'the paired differences are symmetric
    about 0'. Zero differences are dropped (Wilcoxon's convention); tied |d| get mid-ranks
    and the exact null distribution of those ranks. Returns {n (non-zero pairs), w_plus
    (sum of ranks of positive differences), p_value}; p = 1 when every difference is 0.
    """
    d = np.asarray(diffs, np.float64)
    d = d[d != 0]
    if len(d) == 0:
        return {"n": 0, "w_plus": 0.0, "p_value": 1.0}
    ranks = _midranks(np.abs(d))
    w_plus2 = int(round(2 * ranks[d > 0].sum()))
    counts = signed_rank_null_counts(np.rint(2 * ranks).astype(np.int64))
    total = counts.sum()
    lower = counts[: w_plus2 + 1].sum() / total
    upper = counts[w_plus2:].sum() / total
    return {"n": int(len(d)), "w_plus": w_plus2 / 2, "p_value": float(min(1.0, 2 * min(lower, upper)))}


def bootstrap_mean_ci(x, level: float = 0.95, resamples: int = 20_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean of `x` (resampling with
    replacement, a fixed seed so a JSON is reproducible)."""
    x = np.asarray(x, np.float64)
    if len(x) < 2:
        raise ValueError(f"bootstrap_mean_ci: need >= 2 values, got {len(x)}")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def paired_difference(with_values, without_values) -> dict:
    """Summary of `with - without` over paired seeds: mean, std, 95% bootstrap CI, Wilcoxon p."""
    a, b = np.asarray(with_values, np.float64), np.asarray(without_values, np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired_difference: need two equal-length 1-D arrays, got {a.shape} and {b.shape}")
    d = a - b
    low, high = bootstrap_mean_ci(d)
    test = wilcoxon_signed_rank(d)
    return {"n": int(len(d)), "mean": float(d.mean()), "std": float(d.std(ddof=1)), "ci95": [low, high],
            "wilcoxon_p": test["p_value"], "wilcoxon_w_plus": test["w_plus"], "diffs": d.tolist()}
