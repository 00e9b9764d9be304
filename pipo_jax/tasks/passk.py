"""pass@k evaluation: unbiased estimator, per-benchmark aggregation, table and JSON.

For a problem with ``n`` samples of which ``c`` are correct, the unbiased estimator
of pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code") is
``1 - C(n-c, k) / C(n, k)``, computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` to stay
finite for large n. pass@1 reduces to ``c / n``, the mean correctness over the n
samples. A benchmark's score is the mean over its problems; the "average" row is the
unweighted mean over benchmarks (the paper's AVG column).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``n`` samples, ``c`` of them correct."""
    if not (isinstance(n, (int, np.integer)) and isinstance(c, (int, np.integer)) and isinstance(k, (int, np.integer))):
        raise TypeError(f"pass_at_k needs integers, got n={n!r}, c={c!r}, k={k!r}")
    if n < 1 or k < 1:
        raise ValueError(f"pass_at_k needs n >= 1 and k >= 1, got n={n}, k={k}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got c={c}, n={n}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def correct_counts(rewards_pn: Sequence[Sequence[float]], threshold: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(n per problem, c per problem) from per-sample rewards; correct = reward >= threshold."""
    n = np.array([len(r) for r in rewards_pn], dtype=np.int64)
    c = np.array([int(np.sum(np.asarray(r, dtype=np.float64) >= threshold)) for r in rewards_pn], dtype=np.int64)
    return n, c


@dataclasses.dataclass(frozen=True)
class BenchmarkScore:
    """Scores of one benchmark: pass@k means over problems, mean reward over samples."""

    name: str
    num_problems: int
    samples_per_problem: int  # the smallest n over problems
    pass_at: dict[int, float]
    mean_reward: float


def score_benchmark(name: str, rewards_pn: Sequence[Sequence[float]], ks: Sequence[int] = (1, 8),
                    threshold: float = 1.0) -> BenchmarkScore:
    """pass@k for each k in ``ks`` (mean over problems) from per-problem reward lists.

    ``rewards_pn[p]`` holds the rewards of the n samples of problem p (n may vary
    between problems but must be >= max(ks)).
    """
    if len(rewards_pn) == 0:
        raise ValueError(f"benchmark {name!r} has no problems")
    n, c = correct_counts(rewards_pn, threshold)
    if n.min() < 1:
        bad = int(np.argmin(n))
        raise ValueError(f"benchmark {name!r}: problem {bad} has no samples")
    for k in ks:
        if k > n.min():
            raise ValueError(f"benchmark {name!r}: pass@{k} needs >= {k} samples per problem, "
                             f"problem {int(np.argmin(n))} has {int(n.min())}")
    pass_at = {int(k): float(np.mean([pass_at_k(int(ni), int(ci), int(k)) for ni, ci in zip(n, c, strict=True)]))
               for k in ks}
    mean_reward = float(np.mean([np.mean(np.asarray(r, dtype=np.float64)) for r in rewards_pn]))
    return BenchmarkScore(name, len(rewards_pn), int(n.min()), pass_at, mean_reward)


def summarize(rewards_by_benchmark: Mapping[str, Sequence[Sequence[float]]], ks: Sequence[int] = (1, 8),
              threshold: float = 1.0) -> list[BenchmarkScore]:
    """One `BenchmarkScore` per benchmark (input order) plus an "average" row.

    The average row's pass@k and mean reward are unweighted means over benchmarks;
    its num_problems is the total and samples_per_problem the smallest n.
    """
    rows = [score_benchmark(name, r, ks, threshold) for name, r in rewards_by_benchmark.items()]
    if not rows:
        raise ValueError("summarize needs at least one benchmark")
    avg = BenchmarkScore(
        "average",
        sum(r.num_problems for r in rows),
        min(r.samples_per_problem for r in rows),
        {k: float(np.mean([r.pass_at[k] for r in rows])) for k in rows[0].pass_at},
        float(np.mean([r.mean_reward for r in rows])),
    )
    return rows + [avg]


def format_table(rows: Sequence[BenchmarkScore], greedy: dict[str, float] | None = None) -> str:
    """Markdown table: benchmark, problems, n, pass@k columns and the mean reward, as fractions (0-1,
    3 decimals, as the trainer logs them); with `greedy` ({benchmark: greedy accuracy}) a "greedy acc"
    column ("-" for a benchmark it lacks)."""
    ks = list(rows[0].pass_at)
    header = ["benchmark", "problems", "n"] + [f"pass@{k}" for k in ks] + ["mean reward"]
    header += ["greedy acc"] if greedy else []
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        cells = [r.name, str(r.num_problems), str(r.samples_per_problem)]
        cells += [f"{r.pass_at[k]:.3f}" for k in ks] + [f"{r.mean_reward:.3f}"]
        if greedy:
            cells.append(f"{greedy[r.name]:.3f}" if r.name in greedy else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def to_json(rows: Sequence[BenchmarkScore]) -> dict:
    """JSON-ready dict ``{benchmark: {num_problems, samples_per_problem, pass@k..., mean_reward}}``."""
    return {
        r.name: {"num_problems": r.num_problems, "samples_per_problem": r.samples_per_problem,
                 **{f"pass@{k}": v for k, v in r.pass_at.items()}, "mean_reward": r.mean_reward}
        for r in rows
    }

