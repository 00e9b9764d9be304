"""RiskPO (docs/math.md §1 "RiskPO", `losses/riskpo.py`): a batch of three prompts in bundles of two worked
by hand (the scores, the interpolated quantiles, the RVaR and CVaR terms, the std, each credit rule, a
partial last bundle), and a numpy transcription of the authors' released estimator (their loops over
bundles and papers, torch.quantile / torch.std as numpy's linear quantile and ddof-1 std) on random batches."""

from collections import defaultdict

import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.losses import riskpo
from tests.rl.test_config import check_config_run

G = 4
# prompts 0, 1 (bundle 0) and 2 (bundle 1, alone), four responses each
REWARDS = jnp.array([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0])


def test_bundle_scores_and_quantiles_by_hand():
    """Bundle 0's papers score 1 + 0, 0 + 0, 1 + 1, 0 + 1 = 1, 0, 2, 1 (sorted 0, 1, 1, 2): the 0.2-quantile
    sits at position 0.6 (0.6), the 0.8-quantile at 2.4 (1.4). Bundle 1 is prompt 2 alone: 1, 1, 1, 0, so
    0.6 and 1."""
    scores = riskpo.bundle_scores(REWARDS, G, 2)
    np.testing.assert_allclose(np.asarray(scores), [[1, 0, 2, 1], [1, 1, 1, 0]])
    q_a, q_b = riskpo.bundle_quantiles(scores, 0.2, 0.8)
    np.testing.assert_allclose(np.asarray(q_a), [0.6, 0.6], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(q_b), [1.4, 1.0], rtol=1e-6)


def test_riskpo_advantages_by_hand():
    """Bundle 0 (q_a 0.6, q_b 1.4): v = (clip(S) - 1.4) / 0.6 = -2/3, -4/3, 0, -2/3; c = (min(S, 0.6) - 0.6) / 0.2
    = 0, -3, 0, 0; A = (1.5 c + v) / 2.5 = -4/15, -7/3, 0, -4/15, over the std sqrt(2/3). Bundle 1 (0.6, 1): v = 0,
    0, 0, -0.4/0.6; c = 0, 0, 0, -3; A = (-4.5 - 2/3) / 2.5 on its last paper, over the std 0.5. Uniform credit:
    each response its paper's A. Without the natural baseline v rises by (q_b - q_a) / 0.6 = 4/3 (bundle 0) and
    2/3 (bundle 1), A by that / 2.5."""
    s0, s1 = np.sqrt(2 / 3) + 1e-6, 0.5 + 1e-6
    a0 = np.array([-4 / 15, -7 / 3, 0.0, -4 / 15]) / s0
    a1 = np.array([0.0, 0.0, 0.0, (-4.5 - 2 / 3) / 2.5]) / s1
    got = riskpo.riskpo_advantages(REWARDS, G, bundle_size=2)
    np.testing.assert_allclose(np.asarray(got), np.concatenate([a0, a0, a1]), rtol=1e-5)
    upper = riskpo.riskpo_advantages(REWARDS, G, bundle_size=2, natural_baseline=False)
    shift = np.concatenate([np.full(8, 4 / 3 / 2.5 / s0), np.full(4, 2 / 3 / 2.5 / s1)])
    np.testing.assert_allclose(np.asarray(upper), np.asarray(got) + shift, rtol=1e-5, atol=1e-6)
    # credit=std: question stds (ddof 1) sqrt(1/3) for prompts 0 and 1, 0.5 for prompt 2
    std = riskpo.riskpo_advantages(REWARDS, G, bundle_size=2, credit="std")
    sig = np.repeat([np.sqrt(1 / 3), np.sqrt(1 / 3), 0.5], G) + 1e-6
    np.testing.assert_allclose(np.asarray(std), np.concatenate([a0, a0, a1]) / sig, rtol=1e-5)
    # credit=sum_mean: deviations r - mean .5, -.5, .5, -.5 | -.5, -.5, .5, .5 sum per paper to 0, -1, 1, 0:
    # papers 1 and 2 split by deviation (1/2 each), papers 0 and 3 equally (1/2 each); bundle 1 has one prompt,
    # its deviation .25, .25, .25, -.75 is its whole paper's sum: share 1
    share = riskpo.riskpo_advantages(REWARDS, G, bundle_size=2, credit="sum_mean")
    np.testing.assert_allclose(np.asarray(share), np.concatenate([a0 / 2, a0 / 2, a1]), rtol=1e-5)
    # a bundle whose papers all score alike: every advantage 0
    flat = riskpo.riskpo_advantages(jnp.array([1.0, 1, 0, 0, 0, 0, 1, 1]), G, bundle_size=2)
    assert np.all(np.asarray(flat) == 0.0)
    with pytest.raises(ValueError, match="RiskPO credit 'score' is not one of"):
        riskpo.riskpo_advantages(REWARDS, G, credit="score")
    with pytest.raises(ValueError, match="0 < alpha < beta <= 1"):
        riskpo.riskpo_advantages(REWARDS, G, alpha=0.8, beta=0.2)


def riskpo_reference(rewards, g, k, alpha, beta, omega, natural, credit, norm):
    """The authors' estimator (use_q_track_mode='batch', use_mixing_risk_measure) in numpy float64: bundle ids
    every k prompts, papers the j-th response of each question, their loops."""
    rewards = np.asarray(rewards, np.float64)
    index = np.repeat(np.arange(len(rewards) // g), g)
    bundle = index // k
    questions = defaultdict(lambda: defaultdict(list))
    for i, score in enumerate(rewards):
        questions[bundle[i]][index[i]].append((i, score))
    adv = np.zeros(len(rewards))
    for qs in questions.values():
        lists = [qs[q] for q in sorted(qs)]
        stds = {q: (np.std([s for _, s in qs[q]], ddof=1) if np.std([s for _, s in qs[q]], ddof=1) > 1e-3 else 1.0)
                for q in qs}
        means = {q: np.mean([s for _, s in qs[q]]) for q in qs}
        papers = [[lst[j] for lst in lists] for j in range(min(len(lst) for lst in lists))]
        paper_scores = np.array([sum(s for _, s in p) for p in papers])
        q_down, q_up = np.quantile(paper_scores, alpha), np.quantile(paper_scores, beta)
        std = np.std(paper_scores, ddof=1)
        for paper, score in zip(papers, paper_scores):
            a = max(score - q_down, 0) - max(score - q_up, 0) + ((q_down - q_up) if natural else 0.0)
            a /= beta - alpha
            cvar = -max(q_down - score, 0) / alpha
            a = (omega * cvar + a) / (omega + 1)
            if norm:
                a = a / (std + 1e-6)
            ratios = [s - means[index[i]] for i, s in paper]
            for (i, _), ratio in zip(paper, ratios):
                if credit == "uniform":
                    adv[i] = a
                elif credit == "std":
                    adv[i] = a / (stds[index[i]] + 1e-6)
                else:
                    adv[i] = a * ratio / sum(ratios) if abs(sum(ratios)) > 1e-6 else a / len(paper)
    return adv


@pytest.mark.parametrize("credit", riskpo.CREDITS)
@pytest.mark.parametrize("k, alpha, beta, omega, natural, norm", [
    (5, 0.2, 0.8, 1.5, True, True), (3, 0.1, 0.9, 0.0, False, True), (2, 0.25, 0.75, 3.0, True, False),
    (1, 0.2, 1.0, 1.5, True, True)])
def test_riskpo_matches_a_transcription_of_the_authors_code(credit, k, alpha, beta, omega, natural, norm):
    """11 prompts x 6 responses (so the last bundle is partial for K = 2, 3, 5) of graded rewards in {0, .5, 1},
    three random batches per setting."""
    rng = np.random.RandomState(k)
    for _ in range(3):
        rewards = rng.choice([0.0, 0.5, 1.0], size=66, p=[0.5, 0.2, 0.3])
        want = riskpo_reference(rewards, 6, k, alpha, beta, omega, natural, credit, norm)
        got = riskpo.riskpo_advantages(jnp.asarray(rewards, jnp.float32), 6, bundle_size=k, alpha=alpha, beta=beta,
                                       omega=omega, natural_baseline=natural, credit=credit, norm_by_std=norm)
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-4, atol=2e-4)
        assert np.any(want != 0)


def test_check_config_prints_the_riskpo_keys():
    """`--check_config` of configs/riskpo.py: the keys RiskPO reads, each with its value."""
    values, lines = check_config_run("--config=configs/riskpo.py:micro")
    assert {k: values[k] for k in ("algorithm", "advantage.estimator", "pipo.attribution", "advantage.std_ddof",
                                   "advantage.riskpo.bundle_size", "advantage.riskpo.alpha", "advantage.riskpo.beta",
                                   "advantage.riskpo.omega", "advantage.riskpo.credit",
                                   "advantage.riskpo.natural_baseline")} == {
        "algorithm": "riskpo", "advantage.estimator": "riskpo", "pipo.attribution": "gae", "advantage.std_ddof": 1,
        "advantage.riskpo.bundle_size": 5, "advantage.riskpo.alpha": 0.2, "advantage.riskpo.beta": 0.8,
        "advantage.riskpo.omega": 1.5, "advantage.riskpo.credit": "uniform", "advantage.riskpo.natural_baseline": True}
    assert lines["advantage.riskpo.credit"].endswith("[uniform | std | sum_mean]")
