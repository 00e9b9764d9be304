"""pass@k estimator against its closed form; aggregation, table and JSON."""
import itertools
import json
import math

import numpy as np
import pytest

from pipo_jax.tasks import passk


def pass_at_k_exact(n: int, c: int, k: int) -> float:
    """The closed form ``1 - C(n-c, k) / C(n, k)`` with exact integers (the reference)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.parametrize("n,c,k", [(n, c, k) for n in (1, 2, 5, 8, 16, 64) for c in range(0, n + 1, max(1, n // 8))
                                   for k in (1, 2, 4, 8) if k <= n])
def test_matches_closed_form(n, c, k):
    expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    assert passk.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_hand_values_and_edges():
    assert passk.pass_at_k(8, 2, 1) == pytest.approx(0.25)  # pass@1 = c/n
    assert passk.pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert passk.pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert passk.pass_at_k(10, 0, 5) == 0.0
    assert passk.pass_at_k(10, 10, 1) == 1.0
    assert passk.pass_at_k(8, 1, 8) == 1.0  # n - c < k: every k-subset holds a correct one
    assert passk.pass_at_k(8, 0, 8) == 0.0
    # large n stays finite (the product form), while C(n, k) would be huge
    big = passk.pass_at_k(10_000, 3, 100)
    assert big == pytest.approx(pass_at_k_exact(10_000, 3, 100), rel=1e-9)


def test_pass_at_1_is_mean_over_samples():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(1, 20))
        c = int(rng.integers(0, n + 1))
        assert passk.pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_unbiased_against_enumeration():
    """pass@k equals the fraction of k-subsets of the n samples containing a success."""
    samples = [1, 0, 0, 1, 0, 0]
    for k in range(1, 7):
        subsets = list(itertools.combinations(samples, k))
        frac = sum(any(s) for s in subsets) / len(subsets)
        assert passk.pass_at_k(6, 2, k) == pytest.approx(frac)


def test_errors():
    with pytest.raises(ValueError, match="pass@8 needs at least 8"):
        passk.pass_at_k(4, 1, 8)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        passk.pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="n >= 1"):
        passk.pass_at_k(0, 0, 1)
    with pytest.raises(TypeError):
        passk.pass_at_k(4.0, 1, 1)


def test_correct_counts_threshold():
    n, c = passk.correct_counts([[1.0, 0.0, 0.5], [0.99, 1.0]], threshold=1.0)
    assert n.tolist() == [3, 2] and c.tolist() == [1, 1]
    _, c_half = passk.correct_counts([[1.0, 0.0, 0.5]], threshold=0.5)
    assert c_half.tolist() == [2]


def test_summarize_table_and_json(tmp_path):
    rewards = {
        "MATH500": [[1, 1, 0, 0], [0, 0, 0, 0]],  # pass@1 = (0.5 + 0)/2; pass@2 = (1 - 1/6 + 0)/2
        "AIME25": [[1, 0, 0, 0]],  # pass@1 = 0.25; pass@2 = 1 - C(3,2)/C(4,2) = 0.5
    }
    rows = passk.summarize(rewards, ks=(1, 2))
    assert [r.name for r in rows] == ["MATH500", "AIME25", "average"]
    m, a, avg = rows
    assert m.pass_at == {1: pytest.approx(0.25), 2: pytest.approx((1 - 1 / 6) / 2)}
    assert a.pass_at == {1: pytest.approx(0.25), 2: pytest.approx(0.5)}
    assert avg.pass_at[1] == pytest.approx(0.25)
    assert avg.pass_at[2] == pytest.approx(((1 - 1 / 6) / 2 + 0.5) / 2)
    assert (avg.num_problems, avg.samples_per_problem) == (3, 4)
    assert m.mean_reward == pytest.approx(0.25)

    table = passk.format_table(rows)  # fractions, as the trainer logs them
    assert table.splitlines()[0] == "| benchmark | problems | n | pass@1 | pass@2 | mean reward |"
    assert table.splitlines()[2] == "| MATH500 | 2 | 4 | 0.250 | 0.417 | 0.250 |"
    assert table.splitlines()[4] == "| average | 3 | 4 | 0.250 | 0.458 | 0.250 |"
    table = passk.format_table(rows, greedy={"AIME25": 0.5})
    assert table.splitlines()[0].endswith("| mean reward | greedy acc |")
    assert table.splitlines()[2].endswith("| 0.250 | - |") and table.splitlines()[3].endswith("| 0.250 | 0.500 |")

    path = tmp_path / "out" / "eval.json"
    path.parent.mkdir()
    path.write_text(json.dumps(passk.to_json(rows)))  # as experiments/eval.py records it
    data = json.loads(path.read_text())
    assert data["AIME25"] == {"num_problems": 1, "samples_per_problem": 4, "pass@1": 0.25, "pass@2": 0.5,
                              "mean_reward": 0.25}
    assert list(data) == ["MATH500", "AIME25", "average"]


def test_summarize_errors():
    with pytest.raises(ValueError, match="'tiny': pass@8 needs >= 8 samples per problem, problem 1 has 2"):
        passk.summarize({"tiny": [[1] * 8, [1, 0]]}, ks=(1, 8))
    with pytest.raises(ValueError, match="no problems"):
        passk.summarize({"empty": []})
    with pytest.raises(ValueError, match="problem 0 has no samples"):
        passk.summarize({"x": [[], [1]]}, ks=(1,))
