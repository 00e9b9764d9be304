"""ADORA (`pipo_jax/losses/adora.py`, docs/math.md §1 "ADORA"): each prompt temporarily advantageous (weight 1)
or not (lambda) from its own rollouts, GRPO's advantages weighted; by hand, against a numpy transcription of the
authors' released code, PIPO's attribution, the keys' errors and `--check_config`."""

from collections import defaultdict

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from configs import adora as adora_config
from pipo_jax.losses import adora, advantages, pipo
from pipo_jax.rl.spec import ConfigError
from tests.rl.test_config import check_config_run
from tests.typed import spec_of

G = 4
# prompt 0: longest correct 5 > the incorrect ones' mean 3: advantageous
# prompt 1: longest correct 2 < mean(4, 6) = 5 (the 8-token response is cut off at max_length 8): not
# prompt 2: no correct response: not (its advantages are 0 anyway)
# prompt 3: correct ones, every incorrect one cut off: advantageous
# prompt 4: longest correct 4 = the incorrect ones' mean 4: not (strictly longer is needed)
# prompt 5: .5 is not above the threshold .5: no correct response, not
REWARDS = jnp.array([1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0.5, 0, 0, 0], jnp.float32)
LENGTHS = jnp.array([5, 3, 4, 2, 2, 4, 6, 8, 3, 3, 3, 3, 3, 8, 9, 2, 4, 3, 5, 4, 2, 4, 6, 1], jnp.float32)
TAS = [True, False, False, True, False, False]
KW = dict(success_threshold=0.5, max_length=8)


def test_the_groups_by_hand():
    np.testing.assert_array_equal(adora.length_advantageous(REWARDS, LENGTHS, G, **KW), TAS)
    w = adora.adora_weights(REWARDS, LENGTHS, G, tds_weight=0.1, **KW)
    np.testing.assert_allclose(w, np.repeat([1.0, 0.1, 0.1, 1.0, 0.1, 0.1], G))
    adv, w2 = adora.adora_advantages(REWARDS, LENGTHS, G, tds_weight=0.1, std_ddof=1, **KW)
    chex.assert_trees_all_close(w2, w)
    half = 0.5 / (np.sqrt(1 / 3) + 1e-6)  # two of four correct: +-.5 / torch.std
    one = np.array([0.75, -0.25, -0.25, -0.25]) / (0.5 + 1e-6)  # one of four: std sqrt(.75 / 3) = .5
    want = np.concatenate([half * np.array([1, 1, -1, -1]), 0.1 * one, np.zeros(4), half * np.array([1, -1, -1, 1]),
                           0.1 * one, 0.1 * one])
    np.testing.assert_allclose(adv[:8], [0.866024, 0.866024, -0.866024, -0.866024, 0.15, -0.05, -0.05, -0.05],
                               atol=1e-5)
    np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-7)
    # lambda = 1 is GRPO; with the cut at 100 prompt 3's incorrect 8 and 9 count: its longest correct 3 < 8.5
    plain, _ = adora.adora_advantages(REWARDS, LENGTHS, G, tds_weight=1.0, std_ddof=1, **KW)
    chex.assert_trees_all_close(plain, advantages.group_relative_advantages(REWARDS, G, std_ddof=1))
    longer = adora.length_advantageous(REWARDS, LENGTHS, G, success_threshold=0.5, max_length=100)
    np.testing.assert_array_equal(longer, [True, False, False, False, False, False])


def _authors_adora(rewards, lengths, index, correct_score, lamda, max_length_threshold, epsilon=1e-6):
    """numpy transcription of `compute_grpo_outcome_advantage_ADORA` (ShadeCloak/ADORA, `ADORA/verl/trainer/ppo/
    core_algos.py`): per uid, positives score > correct_score, negatives the rest shorter than the threshold;
    length_advantage = max(positive lengths, -inf if none) > mean(negative lengths, -inf if none); the group's
    (score - mean) / (torch.std + eps) (one response: unchanged), times lamda without the length advantage."""
    scores = np.asarray(rewards, np.float64).copy()
    original = scores.copy()
    groups = defaultdict(list)
    for i, idx in enumerate(index):
        groups[idx].append(i)
    advantage = {}
    for idx, rows in groups.items():
        raw, lens = original[rows], np.asarray(lengths, np.float64)[rows]
        pos, neg = raw > correct_score, (raw <= correct_score) & (lens < max_length_threshold)
        max_pos = lens[pos].max() if pos.any() else -np.inf
        mean_neg = lens[neg].mean() if neg.any() else -np.inf
        advantage[idx] = max_pos > mean_neg
    for idx, rows in groups.items():
        if len(rows) > 1:
            group = scores[rows]
            scores[rows] = (group - group.mean()) / (group.std(ddof=1) + epsilon)
    for idx, rows in groups.items():
        if not advantage[idx]:
            scores[rows] *= lamda
    return scores


def test_equals_the_authors_code_on_random_groups():
    """24 prompts of G = 4: rewards 0 / 1 (some groups all equal), lengths 1..12, the cut at 10."""
    rng = np.random.RandomState(0)
    rewards = rng.binomial(1, 0.4, size=96).astype(np.float32)
    lengths = rng.randint(1, 13, size=96).astype(np.float32)
    got, w = adora.adora_advantages(jnp.asarray(rewards), jnp.asarray(lengths), G, success_threshold=0.5,
                                    max_length=10, tds_weight=0.1, std_ddof=1)
    want = _authors_adora(rewards, lengths, np.repeat(np.arange(24), G), 0.5, 0.1, 10)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert 0 < np.mean(np.asarray(w) == 1.0) < 1  # both kinds of prompt occur


def test_pipo_attribution_keeps_the_weight_the_group_attribution_divides_out():
    """ADORA's advantages are GRPO's times w_p per prompt, which G abar / sum |abar| divides out (the group
    attribution of GRPO's advantages); ADORA's attribution multiplies it back: prompt 1's response 0 gets
    .1 x 4 x 1.5 / 3 = .2, its others .1 x 4 x (-.5) / 3."""
    mask = jnp.ones((24, 3)).at[:, 2].set(0.0)
    adv, w = adora.adora_advantages(REWARDS, LENGTHS, G, tds_weight=0.1, std_ddof=1, **KW)
    adv_br = advantages.broadcast_over_tokens(adv, mask)
    grpo_attr = pipo.group_attribution(advantages.broadcast_over_tokens(
        advantages.group_relative_advantages(REWARDS, G, std_ddof=1), mask), mask, G)
    chex.assert_trees_all_close(pipo.group_attribution(adv_br, mask, G), grpo_attr, atol=1e-5)
    got = adora.adora_attribution(adv_br, w, mask, G)
    chex.assert_trees_all_close(got, w[:, None] * grpo_attr, atol=1e-6)
    np.testing.assert_allclose(got[4:8, 0], [0.2, -0.2 / 3, -0.2 / 3, -0.2 / 3], rtol=1e-5)
    assert float(jnp.max(jnp.abs(got * (1 - mask)))) == 0.0


@pytest.mark.parametrize("key, value, message", [
    ("tds_weight", 1.5, r"config\.advantage\.adora\.tds_weight: 1\.5 must be in \[0, 1\]"),
    ("max_length", -1, r"config\.advantage\.adora\.max_length: -1 must be >= 0"),
])
def test_bad_keys_are_one_line_errors(key, value, message):
    c = adora_config.get_config("micro")
    c.advantage.adora[key] = value
    with pytest.raises(ConfigError, match=message):
        spec_of(c)


def test_check_config_prints_the_adora_keys():
    """`--check_config` of configs/adora.py: the keys ADORA reads, each with its value and description."""
    values, lines = check_config_run("--config=configs/adora.py:micro")
    assert {k: values[k] for k in ("algorithm", "advantage.estimator", "advantage.std_ddof",
                                   "advantage.adora.tds_weight", "advantage.adora.success_threshold",
                                   "advantage.adora.max_length", "loss.policy", "loss.clip_ratio_c", "loss.agg_mode",
                                   "loss.kl_coef", "loss.entropy_coef",
                                   "pipo.attribution")} == {
        "algorithm": "adora", "advantage.estimator": "adora", "advantage.std_ddof": 1,
        "advantage.adora.tds_weight": 0.1, "advantage.adora.success_threshold": 0.5, "advantage.adora.max_length": 0,
        "loss.policy": "token_clip", "loss.clip_ratio_c": 0.0, "loss.agg_mode": "token-mean", "loss.kl_coef": 0.001,
        "loss.entropy_coef": 0.001, "pipo.attribution": "adora"}
    assert "temporarily disadvantageous" in lines["advantage.adora.tds_weight"]
