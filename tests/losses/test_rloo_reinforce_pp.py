"""RLOO and REINFORCE++ advantages (docs/math.md §1 "RLOO", "REINFORCE++"): hand-computed numbers and
plain numpy transcriptions of the papers' equations (a loop over each response's other responses for
the leave-one-out baseline; the reward-to-go and the batch's mean / std over valid tokens)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.losses import advantages as adv
from pipo_jax.losses.aggregation import Aggregation
from pipo_jax.losses.policy import token_clip_loss


def rloo_reference(rewards, group_size):
    """A_i = r_i - 1 / (G - 1) sum_{j != i} r_j, literally, group by group."""
    r = np.asarray(rewards, np.float64).reshape(-1, group_size)
    out = np.zeros_like(r)
    for p in range(r.shape[0]):
        for i in range(group_size):
            others = [r[p, j] for j in range(group_size) if j != i]
            out[p, i] = r[p, i] - sum(others) / (group_size - 1)
    return out.reshape(-1)


def whiten_reference(x, mask):
    """(x - mean) / sqrt(var + 1e-8) over the valid entries of the whole batch, unbiased var."""
    vals = x[mask > 0]
    mean = vals.mean()
    var = ((vals - mean) ** 2).sum() / max(len(vals) - 1, 1)
    return np.where(mask > 0, (x - mean) / np.sqrt(var + 1e-8), 0.0)


def reinforce_pp_reference(outcome, kl, mask, beta, gamma):
    """r_t = 1[t = last] r - beta KL_t; A_t = sum_{s >= t} gamma^(s - t) r_s over the valid tokens; whitened."""
    b, t = mask.shape
    returns = np.zeros((b, t))
    for i in range(b):
        valid = [j for j in range(t) if mask[i, j]]
        rew = {j: -beta * kl[i, j] for j in valid}
        if valid:
            rew[valid[-1]] += outcome[i]
        for k, j in enumerate(valid):
            returns[i, j] = sum(gamma ** n * rew[s] for n, s in enumerate(valid[k:]))
    return whiten_reference(returns, mask)


def test_rloo_leave_one_out_by_hand():
    # group 0: baselines (0 + .5 + .25) / 3, (1 + .5 + .25) / 3, (1 + 0 + .25) / 3, (1 + 0 + .5) / 3
    # group 1: equal rewards: exactly 0
    rewards = jnp.array([1.0, 0.0, 0.5, 0.25, 0.7, 0.7, 0.7, 0.7])
    a = adv.leave_one_out_advantages(rewards, 4)
    want = [0.75, -1.75 / 3, 0.5 - 1.25 / 3, 0.25 - 0.5, 0.0, 0.0, 0.0, 0.0]
    chex.assert_trees_all_close(a, jnp.array(want), atol=1e-6)
    assert np.all(np.asarray(a)[4:] == 0.0)
    # G / (G - 1) times Dr. GRPO's r - mean_g
    chex.assert_trees_all_close(a, adv.group_relative_advantages(rewards, 4, norm_by_std=False) * 4 / 3, atol=1e-6)


@pytest.mark.parametrize("group_size", [2, 3, 8])
def test_rloo_matches_the_leave_one_out_loop(group_size):
    rewards = np.random.RandomState(group_size).randn(4 * group_size).astype(np.float32)
    chex.assert_trees_all_close(adv.leave_one_out_advantages(jnp.asarray(rewards), group_size),
                                jnp.asarray(rloo_reference(rewards, group_size), jnp.float32), atol=1e-5)


def test_rloo_needs_two_responses():
    with pytest.raises(ValueError, match="leave-one-out baseline needs G >= 2"):
        adv.leave_one_out_advantages(jnp.ones(4), 1)


def test_rloo_loss_is_the_token_clip_on_its_advantages():
    """G = 2, rewards 1 and 0: A = +-1 on each response's tokens; at ratio 1 the token-mean loss is
    -mean_t A = -(2 * 1 - 1 * 1) / 3 and each token's gradient -A / 3."""
    mask = jnp.array([[1.0, 1.0], [1.0, 0.0]])
    a_bt = adv.broadcast_over_tokens(adv.leave_one_out_advantages(jnp.array([1.0, 0.0]), 2), mask)
    chex.assert_trees_all_close(a_bt, jnp.array([[1.0, 1.0], [-1.0, 0.0]]))
    logp = jnp.log(jnp.full((2, 2), 0.5))

    def loss(lp):
        return token_clip_loss(lp, logp, a_bt, mask, agg=Aggregation("token-mean", num_tokens=3.0))[0]

    chex.assert_trees_all_close(loss(logp), jnp.float32(-1 / 3), atol=1e-7)
    chex.assert_trees_all_close(jax.grad(loss)(logp), -a_bt / 3, atol=1e-7)


def test_discounted_returns_by_hand():
    r = jnp.array([[0.0, 0.5, 1.0], [2.0, 4.0, 9.0]])
    m = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # gamma .5, from the end: row 0 G2 = 1, G1 = .5 + .5 * 1 = 1, G0 = 0 + .5 * 1 = .5;
    # row 1 (9 is padding): G1 = 4, G0 = 2 + .5 * 4 = 4. gamma 1: the plain reward-to-go
    chex.assert_trees_all_close(adv.discounted_returns(r, m, gamma=0.5), jnp.array([[0.5, 1.0, 1.0], [4.0, 4.0, 0.0]]))
    chex.assert_trees_all_close(adv.discounted_returns(r, m, gamma=1.0), jnp.array([[1.5, 1.5, 1.0], [6.0, 4.0, 0.0]]))


def test_reinforce_pp_outcome_only_by_hand():
    """beta = 0: the return is the outcome reward on every token: 1, 1, 1 and 0, 0 (5 tokens, mean .6,
    unbiased var (3 * .16 + 2 * .36) / 4 = .3): +.4 / sqrt(.3) and -.6 / sqrt(.3)."""
    mask = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    tok = adv.outcome_token_rewards(jnp.array([1.0, 0.0]), mask)
    a = adv.reinforce_pp_advantages(tok, mask)
    hi, lo = 0.4 / np.sqrt(0.3 + 1e-8), -0.6 / np.sqrt(0.3 + 1e-8)
    chex.assert_trees_all_close(a, jnp.array([[hi, hi, hi], [lo, lo, 0.0]]), rtol=1e-6)
    # global, not per group: the same numbers whatever the rows' grouping (there is none)
    chex.assert_trees_all_close(jnp.sum(a * mask), jnp.float32(0.0), atol=1e-6)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_with_kl_in_the_reward_matches_the_equations(gamma):
    """The trainer's path: outcome at the last token, minus beta k1 per token
    (`kl_penalized_token_rewards`), then the estimator, against the numpy transcription."""
    rng = np.random.RandomState(0)
    b, t = 6, 5
    mask = np.ones((b, t), np.float32)
    mask[1, 3:] = 0
    mask[4, 1:] = 0
    logp_old = rng.randn(b, t).astype(np.float32) * 0.3 - 1.0
    logp_ref = rng.randn(b, t).astype(np.float32) * 0.3 - 1.0
    outcome = rng.rand(b).astype(np.float32)
    beta = 0.1
    tok = adv.kl_penalized_token_rewards(adv.outcome_token_rewards(jnp.asarray(outcome), jnp.asarray(mask)),
                                         jnp.asarray(logp_old), jnp.asarray(logp_ref), jnp.asarray(mask), beta=beta,
                                         estimator="k1")
    got = adv.reinforce_pp_advantages(tok, jnp.asarray(mask), gamma=gamma)
    want = reinforce_pp_reference(outcome, logp_old - logp_ref, mask, beta, gamma)
    chex.assert_trees_all_close(got, jnp.asarray(want, jnp.float32), atol=1e-5)
    # gamma = 1: A_t = r - beta sum_{s >= t} KL_s before the whitening, so tokens of one response differ
    assert float(jnp.max(jnp.abs(got[0] - got[0, 0]))) > 1e-3


def test_reinforce_pp_baseline_by_hand():
    """Rewards 1, 0 | 1, 1 (G = 2), two tokens each: r - group mean = .5, -.5, 0, 0 on 8 tokens,
    mean 0, unbiased var 4 * .25 / 7: +-.5 * sqrt(7) on the first group, 0 on the second."""
    mask = jnp.ones((4, 2))
    a = adv.reinforce_pp_baseline_advantages(jnp.array([1.0, 0.0, 1.0, 1.0]), mask, 2)
    s = 0.5 / np.sqrt(1 / 7 + 1e-8)
    chex.assert_trees_all_close(a, jnp.array([[s, s], [-s, -s], [0.0, 0.0], [0.0, 0.0]]), rtol=1e-6)


def test_reinforce_pp_baseline_matches_the_equations_on_ragged_rows():
    rng = np.random.RandomState(1)
    b, t, g = 8, 4, 4
    mask = (rng.rand(b, t) > 0.3).astype(np.float32)
    mask[:, 0] = 1.0
    rewards = rng.randn(b).astype(np.float32)
    centred = rewards - np.repeat(rewards.reshape(-1, g).mean(axis=1), g)
    want = whiten_reference(centred[:, None] * mask, mask)
    got = adv.reinforce_pp_baseline_advantages(jnp.asarray(rewards), jnp.asarray(mask), g)
    chex.assert_trees_all_close(got, jnp.asarray(want, jnp.float32), atol=1e-5)
