"""Advantages and reward shaping: hand-computed numbers and a plain-loop GAE reference."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.losses import advantages as adv


def gae_reference(rewards, values, mask, gamma, lam):
    """docs/math.md §1 GAE as a plain Python loop over valid tokens (masked positions carry through)."""
    b, t = rewards.shape
    out = np.zeros((b, t))
    for i in range(b):
        next_v, next_a = 0.0, 0.0
        for j in reversed(range(t)):
            if not mask[i, j]:
                continue
            delta = rewards[i, j] + gamma * next_v - values[i, j]
            next_a = delta + gamma * lam * next_a
            next_v = values[i, j]
            out[i, j] = next_a
    return out, (out + values) * mask


def test_gae_hand_computed():
    r = jnp.array([[0.0, 0.0, 1.0]])
    v = jnp.array([[0.5, 0.6, 0.7]])
    m = jnp.ones((1, 3))
    a, ret = adv.gae(r, v, m, gamma=1.0, lam=1.0)
    chex.assert_trees_all_close(a, jnp.array([[0.5, 0.4, 0.3]]), atol=1e-6)  # R - V_t
    chex.assert_trees_all_close(ret, jnp.ones((1, 3)), atol=1e-6)
    a, ret = adv.gae(r, v, m, gamma=0.5, lam=0.5)
    # A2 = 1 - .7; A1 = (.5*.7 - .6) + .25*.3; A0 = (.5*.6 - .5) + .25*A1
    chex.assert_trees_all_close(a, jnp.array([[-0.24375, -0.175, 0.3]]), atol=1e-6)
    chex.assert_trees_all_close(ret, jnp.array([[0.25625, 0.425, 1.0]]), atol=1e-6)


def test_gae_masked_hole_carries_value_through():
    r = jnp.array([[0.0, 5.0, 1.0]])
    v = jnp.array([[0.5, 99.0, 0.7]])
    a, _ = adv.gae(r, v, jnp.array([[1, 0, 1]]), gamma=1.0, lam=1.0)
    # t=1 is skipped: delta_0 = 0 + V_2 - V_0 = 0.2, A_0 = 0.2 + A_2 = 0.5
    chex.assert_trees_all_close(a, jnp.array([[0.5, 0.0, 0.3]]), atol=1e-6)


def test_gae_matches_plain_loop_and_is_padding_invariant():
    rng = np.random.default_rng(1)
    r = rng.normal(size=(4, 7))
    v = rng.normal(size=(4, 7))
    m = (rng.random((4, 7)) < 0.7).astype(np.float64)
    for gamma, lam in [(1.0, 1.0), (0.9, 0.8)]:
        a, ret = adv.gae(jnp.asarray(r, jnp.float32), jnp.asarray(v, jnp.float32), m, gamma=gamma, lam=lam)
        ref_a, ref_ret = gae_reference(r, v, m, gamma, lam)
        chex.assert_trees_all_close(a, jnp.asarray(ref_a, jnp.float32), atol=1e-5)
        chex.assert_trees_all_close(ret, jnp.asarray(ref_ret, jnp.float32), atol=1e-5)
        pad = lambda x, val: np.concatenate([x, np.full((4, 3), val)], axis=1)
        a_pad, _ = adv.gae(pad(r, 9.0).astype(np.float32), pad(v, -4.0).astype(np.float32), pad(m, 0.0), gamma=gamma,
                           lam=lam)
        chex.assert_trees_all_close(a_pad[:, :7], a, atol=1e-6)


def test_masked_whiten():
    x = jnp.array([[1.0, 2.0, 3.0, 100.0]])
    out = adv.masked_whiten(x, jnp.array([[1, 1, 1, 0]]))
    # mean 2, unbiased var (1 + 0 + 1) / 2 = 1
    chex.assert_trees_all_close(out, jnp.array([[-1.0, 0.0, 1.0, 0.0]]) / np.sqrt(1 + 1e-8), atol=1e-6)
    one = adv.masked_whiten(jnp.array([[5.0, 7.0]]), jnp.array([[1, 0]]))
    chex.assert_trees_all_close(one, jnp.zeros((1, 2)))


def test_outcome_rewards_kl_in_reward_and_sequence_rewards():
    m = jnp.array([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    tok = adv.outcome_token_rewards(jnp.array([2.0, 3.0, 4.0]), m)
    chex.assert_trees_all_close(tok, jnp.array([[0.0, 2.0, 0.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0]]))
    shaped = adv.kl_penalized_token_rewards(
        jnp.array([[0.0, 1.0, 8.0]]), jnp.array([[-1.0, -2.0, 0.0]]), jnp.array([[-1.5, -1.0, 0.0]]),
        jnp.array([[1, 1, 0]]), beta=0.1,
    )
    chex.assert_trees_all_close(shaped, jnp.array([[-0.05, 1.1, 0.0]]), atol=1e-6)  # k1 = [0.5, -1]
    chex.assert_trees_all_close(adv.sequence_rewards(shaped, jnp.array([[1, 1, 0]])), jnp.array([1.05]), atol=1e-6)


def test_group_relative_hand_computed():
    r = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    a = adv.group_relative_advantages(r, 4)
    chex.assert_trees_all_close(a[:4], jnp.array([1.0, -1.0, -1.0, 1.0]) * 0.5 / (0.5 + 1e-6), rtol=1e-6)
    assert np.all(np.asarray(a[4:]) == 0.0)
    a1 = adv.group_relative_advantages(r, 4, std_ddof=1)
    chex.assert_trees_all_close(a1[:4], jnp.array([1.0, -1.0, -1.0, 1.0]) * 0.5 / (np.sqrt(1 / 3) + 1e-6), rtol=1e-6)
    a_dr = adv.group_relative_advantages(r, 4, norm_by_std=False)
    chex.assert_trees_all_close(a_dr, jnp.array([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))
    skew = adv.group_relative_advantages(jnp.array([0.0, 0.0, 0.0, 3.0]), 4, eps=0.0)
    # mean .75, population std sqrt(1.6875)
    chex.assert_trees_all_close(skew, jnp.array([-0.75, -0.75, -0.75, 2.25]) / np.sqrt(1.6875), rtol=1e-6)


def test_group_relative_degenerate_groups_are_exactly_zero():
    r = jnp.full((8,), 0.1)  # float mean of 0.1s is not exactly 0.1
    for ddof in (0, 1):
        assert np.all(np.asarray(adv.group_relative_advantages(r, 4, std_ddof=ddof)) == 0.0)
    assert np.all(np.asarray(adv.group_relative_advantages(jnp.array([1.0, 0.0, 3.0]), 1)) == 0.0)


def test_group_relative_errors():
    with pytest.raises(ValueError, match="group_size=3"):
        adv.group_relative_advantages(jnp.zeros(8), 3)
    with pytest.raises(ValueError, match="std_ddof"):
        adv.group_relative_advantages(jnp.zeros(8), 4, std_ddof=2)


def test_broadcast_over_tokens():
    out = adv.broadcast_over_tokens(jnp.array([2.0, -1.0]), jnp.array([[1, 1, 0], [1, 0, 0]]))
    chex.assert_trees_all_close(out, jnp.array([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]))


def test_dapo_filter_and_outcome_counts():
    r = jnp.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5, 0.2])
    keep_p, keep_b, counts = adv.dapo_group_filter(r, 2)
    np.testing.assert_array_equal(keep_p, [True, False, False, True])
    np.testing.assert_array_equal(keep_b, [True, True, False, False, False, False, True, True])
    assert (int(counts["num_groups"]), int(counts["num_kept"]), int(counts["num_dropped"])) == (4, 2, 2)
    keep_p, _, counts = adv.dapo_group_filter(r, 1)
    assert bool(jnp.all(keep_p)) and int(counts["num_kept"]) == 8
    hist = adv.group_outcome_counts(jnp.array([1.0, 1.0, 0.0, 0.0, 1.0, 0.0]), 2)
    assert {k: int(v) for k, v in hist.items()} == {"all_fail": 1, "mixed": 1, "all_success": 1}


def test_overlong_penalty():
    pen = adv.overlong_penalty(jnp.array([10, 16, 18, 20]), max_len=20, buffer=4, factor=1.0)
    chex.assert_trees_all_close(pen, jnp.array([0.0, 0.0, -0.5, -1.0]))
    pen = adv.overlong_penalty(jnp.array([19]), max_len=20, buffer=4, factor=0.5)
    chex.assert_trees_all_close(pen, jnp.array([-0.375]))
    with pytest.raises(ValueError, match="overlong buffer=0"):
        adv.overlong_penalty(jnp.array([1]), max_len=20, buffer=0)
