"""GDPO (`pipo_jax/losses/gdpo.py`, docs/math.md §1 "GDPO"): each reward component normalised within its group,
the weighted sum normalised over the batch; by hand, against a numpy transcription of the authors' TRL code, the
shaping component of the registered estimator, and `--check_config`."""

from types import SimpleNamespace

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.losses import advantages, gdpo
from pipo_jax.rl import algorithms
from pipo_jax.rl.algorithms import AdvantageInputs
from pipo_jax.tasks.protocol import RewardComponent
from tests.rl.test_config import check_config_run

EPS = 1e-4


def test_decoupled_normalisation_by_hand_keeps_the_combinations_grpo_collapses():
    """G = 4, components (answer, stop): prompt 0's responses (1, 0), (1, -1), (0, 0), (0, 0), prompt 1's all
    (0, 0). GRPO on the sums 1, 0, 0, 0 gives rows 1-3 one advantage; GDPO: answer [1, 1, 0, 0] -> +-.5 / (s + eps)
    with s = sqrt(1/3) (ddof 1), stop [0, -1, 0, 0] -> (.25, -.75, .25, .25) / (.5 + eps); their sums
    1.3658, -.6338, -.3660, -.3660 and prompt 1's zeros, over the batch: mean 0, std sqrt(sum S^2 / 7)."""
    comps = jnp.array([[1, 0], [1, -1], [0, 0], [0, 0]] + [[0, 0]] * 4, jnp.float32)
    answer = 0.5 / (np.sqrt(1 / 3) + EPS) * np.array([1, 1, -1, -1])
    stop = np.array([0.25, -0.75, 0.25, 0.25]) / (0.5 + EPS)
    s = np.concatenate([answer + stop, np.zeros(4)])
    np.testing.assert_allclose(s[:4], [1.365775, -0.633825, -0.365975, -0.365975], atol=1e-5)
    want = s / (np.sqrt(np.sum(s ** 2) / 7) + EPS)
    np.testing.assert_allclose(want[:4], [2.269186, -1.053078, -0.608054, -0.608054], atol=1e-5)
    chex.assert_trees_all_close(gdpo.component_advantages(comps, 4),
                                jnp.stack([jnp.asarray(np.r_[answer, np.zeros(4)]),
                                           jnp.asarray(np.r_[stop, np.zeros(4)])], axis=1), atol=1e-6)
    got = gdpo.gdpo_advantages(comps, (1.0, 1.0), 4)
    chex.assert_trees_all_close(got, jnp.asarray(want, jnp.float32), atol=1e-5)
    grpo = advantages.group_relative_advantages(comps.sum(axis=1), 4, std_ddof=1)
    assert float(grpo[1]) == float(grpo[2]) == float(grpo[3])  # (1, -1) and (0, 0) collapse under GRPO
    assert float(got[1]) < float(got[2]) - 0.4  # GDPO ranks the right answer that did not stop below a wrong one


def test_groups_where_more_components_vary_weigh_more():
    """G = 2: prompt 0 (1, 0) vs (0, 0), prompt 1 (1, 0) vs (0, -1). GRPO gives both groups +-1/sqrt(2) (ddof 1);
    GDPO +-.7071 and +-1.4142 before the batch step, then over the batch's std sqrt(5/3): +-.5477, +-1.0954."""
    comps = jnp.array([[1, 0], [0, 0], [1, 0], [0, -1]], jnp.float32)
    grpo = advantages.group_relative_advantages(comps.sum(axis=1), 2, std_ddof=1)
    np.testing.assert_allclose(grpo, np.array([1, -1, 1, -1]) / np.sqrt(2), rtol=1e-5)
    a = 0.5 / (np.sqrt(0.5) + EPS)
    s = np.array([a, -a, 2 * a, -2 * a])
    want = s / (np.sqrt(np.sum(s ** 2) / 3) + EPS)
    np.testing.assert_allclose(want, [0.547723, -0.547723, 1.095445, -1.095445], atol=1e-4)
    chex.assert_trees_all_close(gdpo.gdpo_advantages(comps, (1.0, 1.0), 2), jnp.asarray(want, jnp.float32), atol=1e-5)


def _trl_gdpo(rewards_per_func, weights, num_generations):
    """numpy transcription of the authors' TRL code (NVlabs/GDPO trl-0.18.0-gdpo, `grpo_trainer.py`, apply_gdpo):
    per reward function the group mean and torch.std (ddof 1), (r - mean) / (std + 1e-4); the weighted nansum;
    the batch's mean and std, (x - mean) / (std + 1e-4)."""
    r = np.nan_to_num(np.asarray(rewards_per_func, np.float64))
    per_func = []
    for i in range(len(weights)):
        grouped = r[:, i].reshape(-1, num_generations)
        mean = np.repeat(grouped.mean(axis=1), num_generations)
        std = np.repeat(grouped.std(axis=1, ddof=1), num_generations)
        per_func.append((r[:, i] - mean) / (std + 1e-4))
    pre_bn = np.nansum(np.stack(per_func, axis=1) * np.asarray(weights)[None, :], axis=1)
    return (pre_bn - pre_bn.mean()) / (pre_bn.std(ddof=1) + 1e-4)


def test_equals_the_authors_code_on_random_components():
    """Three components on values the groups sometimes share (constant groups included), weights 1, .5, 2."""
    rng = np.random.RandomState(0)
    comps = rng.choice([-1.0, 0.0, 0.25, 0.5, 1.0], size=(24, 3)).astype(np.float32)
    comps[4:8, 1] = 0.5  # one group's component 1 is constant: A = 0 there
    weights = (1.0, 0.5, 2.0)
    got = gdpo.gdpo_advantages(jnp.asarray(comps), weights, 4)
    np.testing.assert_allclose(got, _trl_gdpo(comps, weights, 4), atol=2e-5)
    assert np.all(np.asarray(gdpo.component_advantages(jnp.asarray(comps), 4))[4:8, 1] == 0)


def test_one_component_is_grpo_normalised_over_the_batch():
    rewards = jnp.array([1.0, 0.0, 0.5, 0.5, 0.75, 0.25, 1.0, 0.0])
    grpo = advantages.group_relative_advantages(rewards, 2, std_ddof=0, eps=EPS)
    want = (grpo - jnp.mean(grpo)) / (jnp.std(grpo) + EPS)
    chex.assert_trees_all_close(gdpo.gdpo_advantages(rewards[:, None], (1.0,), 2, std_ddof=0), want, atol=1e-6)
    with pytest.raises(ValueError, match="1 reward components but 2 weights"):
        gdpo.gdpo_advantages(rewards[:, None], (1.0, 1.0), 2)


def _spec(kl_in_reward=False, overlong_buffer=0):
    parts = (RewardComponent("answer", 1.0), RewardComponent("stop", 0.5))
    return SimpleNamespace(task=SimpleNamespace(reward_weights=lambda: parts), rollout=SimpleNamespace(group_size=2),
                           advantage=SimpleNamespace(std_ddof=1, norm_by_std=True),
                           loss=SimpleNamespace(kl_in_reward=kl_in_reward),
                           dapo=SimpleNamespace(overlong_buffer=overlong_buffer))


def test_the_estimator_adds_the_learners_shaping_as_one_more_component():
    """`advantage.estimator=gdpo` reads the task's components and weights; with the KL in the reward (or DAPO's
    overlong shaping) the sequence reward minus their weighted sum is a third component of weight 1."""
    mask = jnp.array([[1, 1], [1, 0], [1, 1], [1, 1]], jnp.float32)
    comps = jnp.array([[1.0, 0.0], [1.0, -1.0], [0.0, 0.0], [1.0, 0.0]])
    shaped = jnp.array([0.9, 0.3, -0.2, 1.0])  # the task rewards 1, .5, 0, 1 and a shaping of -.1, -.2, -.2, 0
    x = AdvantageInputs(mask, jnp.zeros((4, 2)), shaped, reward_components_bc=comps)
    est = algorithms.ADVANTAGE_ESTIMATORS["gdpo"]
    assert est.group and est.reward_components and not est.critic
    adv, returns = est.fn(_spec(), x)
    assert returns is None
    chex.assert_trees_all_close(adv, gdpo.gdpo_advantages(comps, (1.0, 0.5), 2)[:, None] * mask, atol=1e-6)
    for spec in (_spec(kl_in_reward=True), _spec(overlong_buffer=4)):
        got, weights = algorithms._gdpo_components(spec, x)
        chex.assert_trees_all_close(got[:, 2], jnp.array([-0.1, -0.2, -0.2, 0.0]), atol=1e-6)
        assert weights == (1.0, 0.5, 1.0)
        adv, _ = est.fn(spec, x)
        chex.assert_trees_all_close(adv, gdpo.gdpo_advantages(got, weights, 2)[:, None] * mask, atol=1e-6)


def test_check_config_prints_the_gdpo_keys():
    """`--check_config` of configs/gdpo.py: the keys GDPO reads, each with its value."""
    values, lines = check_config_run("--config=configs/gdpo.py:micro")
    assert {k: values[k] for k in ("algorithm", "advantage.estimator", "advantage.std_ddof", "advantage.norm_by_std",
                                   "loss.policy", "loss.clip_low", "loss.clip_high", "loss.clip_ratio_c",
                                   "loss.agg_mode", "loss.kl_coef", "pipo.attribution")} == {
        "algorithm": "gdpo", "advantage.estimator": "gdpo", "advantage.std_ddof": 1, "advantage.norm_by_std": True,
        "loss.policy": "token_clip", "loss.clip_low": 0.2, "loss.clip_high": 0.2, "loss.clip_ratio_c": 0.0,
        "loss.agg_mode": "token-mean", "loss.kl_coef": 0.04, "pipo.attribution": "group"}
    assert "gdpo" in lines["advantage.estimator"]
