"""experiments/stats.py against hand-computed values and brute-force enumeration."""

import itertools

import numpy as np
import pytest

from experiments import stats


def brute_force_p(d):
    """Two-sided exact p by enumerating every sign assignment of the non-zero |d| mid-ranks."""
    d = np.asarray(d, float)
    d = d[d != 0]
    ranks = stats._midranks(np.abs(d))
    w = ranks[d > 0].sum()
    sums = [sum(r for r, s in zip(ranks, signs) if s) for signs in itertools.product([0, 1], repeat=len(d))]
    sums = np.asarray(sums)
    return min(1.0, 2 * min(np.mean(sums <= w + 1e-9), np.mean(sums >= w - 1e-9)))


def test_null_counts_by_hand():
    # ranks {1, 2, 3} (doubled: 2, 4, 6): subset sums 0,1,2,3,3,4,5,6 -> counts of 2*W+
    counts = stats.signed_rank_null_counts(np.array([2, 4, 6]))
    expected = np.zeros(13)
    for s in (0, 1, 2, 3, 3, 4, 5, 6):
        expected[2 * s] += 1
    np.testing.assert_array_equal(counts, expected)


def test_wilcoxon_hand_values():
    # n = 5, all positive: W+ = 15 is the single most extreme of 32 assignments -> p = 2/32
    assert stats.wilcoxon_signed_rank([0.1, 0.2, 0.3, 0.4, 0.5])["p_value"] == pytest.approx(2 / 32, abs=1e-15)
    # n = 10, all negative: p = 2/1024
    assert stats.wilcoxon_signed_rank(-np.arange(1, 11) / 10)["p_value"] == pytest.approx(2 / 1024, abs=1e-15)
    # n = 6, negative ranks {1, 2} -> W+ = 18 = 21 - 3: subsets of {1..6} with sum <= 3 are
    # {}, {1}, {2}, {3}, {1,2} -> 5 of 64, two-sided 10/64
    r = stats.wilcoxon_signed_rank([-1, -2, 3, 4, 5, 6])
    assert r["w_plus"] == 18 and r["p_value"] == pytest.approx(10 / 64, abs=1e-15)
    # zeros are dropped; all zero -> p = 1
    assert stats.wilcoxon_signed_rank([0.0, 0.0])["p_value"] == 1.0
    assert stats.wilcoxon_signed_rank([0, 0.1, 0.2, 0.3, 0.4, 0.5])["n"] == 5


@pytest.mark.parametrize("d", [[0.3, -0.1, 0.2, 0.2, -0.05, 0.4, 0.1], [1, 1, -1, 2, -2, 2, 3], [0.5, -0.5, 0, 0.2]])
def test_wilcoxon_equals_enumeration_with_ties(d):
    assert stats.wilcoxon_signed_rank(d)["p_value"] == pytest.approx(brute_force_p(d), abs=1e-12)


def test_bootstrap_ci_brackets_the_mean_and_shrinks_with_n():
    rng = np.random.default_rng(0)
    small, large = rng.normal(0.1, 1.0, 10), rng.normal(0.1, 1.0, 1000)
    lo, hi = stats.bootstrap_mean_ci(small)
    assert lo < small.mean() < hi
    lo2, hi2 = stats.bootstrap_mean_ci(large)
    # normal theory: half-width 1.96 * s / sqrt(n); the percentile bootstrap is within ~5% of it at n = 1000
    assert (hi2 - lo2) / 2 == pytest.approx(1.96 * large.std(ddof=1) / np.sqrt(1000), rel=0.05)
    assert hi2 - lo2 < hi - lo


def test_paired_difference():
    out = stats.paired_difference([0.5, 0.6, 0.7], [0.4, 0.4, 0.4])
    assert out["mean"] == pytest.approx(0.2) and out["diffs"] == pytest.approx([0.1, 0.2, 0.3])
    assert out["wilcoxon_p"] == pytest.approx(2 / 8)
    with pytest.raises(ValueError, match="equal-length"):
        stats.paired_difference([1, 2], [1])
