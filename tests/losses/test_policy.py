"""Policy losses, KL, entropy and value loss: hand numbers, gradients, micro-batch invariance."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.losses import advantages
from pipo_jax.losses.aggregation import AGG_MODES, Aggregation, aggregation_counts
from pipo_jax.kernels.softmax_stats import token_entropy
from pipo_jax.losses.kl import kl_estimate, kl_k3, kl_loss
from pipo_jax.losses.policy import (
    cispo_loss,
    gspo_loss,
    gspo_token_log_ratio,
    sequence_log_ratio,
    token_clip_loss,
    token_log_ratio,
)
from pipo_jax.losses.masking import as_mask
from pipo_jax.losses.value import clipped_value_loss


def gspo_sequence_loss_reference(logp_br, logp_old_br, adv_b, mask_br, *, ratio_low=1 - 3e-4, ratio_high=1 + 4e-4):
    """Plain sequence form of GSPO, the spec of `gspo_loss`: mean over non-empty rows of
    max(-A s_i, -A clip(s_i)). Scalar."""
    log_s_b = jnp.minimum(sequence_log_ratio(logp_br, logp_old_br, mask_br), 10.0)
    s_b = jnp.exp(log_s_b)
    loss_b = jnp.maximum(-adv_b * s_b, -adv_b * jnp.clip(s_b, ratio_low, ratio_high))
    nonempty_b = jnp.sum(as_mask(mask_br), axis=-1) > 0
    return jnp.sum(jnp.where(nonempty_b, loss_b, 0.0)) / jnp.maximum(jnp.sum(nonempty_b.astype(jnp.float32)), 1.0)

# six tokens: (A, r) = (1, 1.5) (1, .5) (-1, .5) (-1, 1.5) (-1, 5) (2, 1); eps .2 / .28, c = 3
ADV = jnp.array([[1.0, 1.0, -1.0, -1.0, -1.0, 2.0]])
RATIO = np.array([[1.5, 0.5, 0.5, 1.5, 5.0, 1.0]])
LOGP_OLD = jnp.array([[-1.0, -2.0, -0.5, -1.5, -3.0, -0.7]])
LOGP = LOGP_OLD + jnp.asarray(np.log(RATIO), jnp.float32)
ONES = jnp.ones((1, 6))
CLIP_CFG = {"ratio_low": 1 - 0.2, "ratio_high": 1 + 0.28, "clip_ratio_c": 3.0, "agg": Aggregation("token-mean")}


def test_cispo_hand_computed_every_token_keeps_its_gradient():
    # weights sg(clip(r, 0.8, 1.28)): 1.28, 0.8, 0.8, 1.28, 1.28, 1; per token -w A logp
    w = np.array([1.28, 0.8, 0.8, 1.28, 1.28, 1.0])
    a, logp = np.asarray(ADV[0]), np.asarray(LOGP[0], np.float64)
    loss, metrics = cispo_loss(LOGP, LOGP_OLD, ADV, ONES, ratio_low=1 - 0.2, ratio_high=1 + 0.28,
                               agg=Aggregation("token-mean"))
    chex.assert_trees_all_close(loss, jnp.float32(np.mean(-w * a * logp)), rtol=1e-5)
    chex.assert_trees_all_close(metrics["pg_clipfrac"], jnp.float32(5 / 6), rtol=1e-6)  # all but r = 1
    # d loss / d logp_t = -w_t A_t / 6: the clipped tokens keep a gradient (the token clip's is 0 there)
    grad = jax.grad(lambda x: cispo_loss(x, LOGP_OLD, ADV, ONES, ratio_low=1 - 0.2, ratio_high=1 + 0.28,
                                         agg=Aggregation("token-mean"))[0])(LOGP)
    chex.assert_trees_all_close(grad[0], jnp.asarray(-w * a / 6, jnp.float32), rtol=1e-5)
    clip_grad = jax.grad(lambda x: token_clip_loss(x, LOGP_OLD, ADV, ONES, **CLIP_CFG)[0])(LOGP)
    assert float(clip_grad[0, 0]) == 0.0 and float(grad[0, 0]) != 0.0
    half, _ = cispo_loss(LOGP, LOGP_OLD, ADV, ONES, ratio_low=1 - 0.2, ratio_high=1 + 0.28, 
                         agg=Aggregation("token-mean", num_tokens=12.0))
    chex.assert_trees_all_close(half, loss / 2, rtol=1e-6)  # the global count is honoured


def test_token_clip_hand_computed():
    # per token: -1.28 (upper clip), -0.5, 0.8 (lower clip), 1.5, 3 (dual clip of 5), -2
    loss, metrics = token_clip_loss(LOGP, LOGP_OLD, ADV, ONES, **CLIP_CFG)
    chex.assert_trees_all_close(loss, jnp.float32((-1.28 - 0.5 + 0.8 + 1.5 + 3.0 - 2.0) / 6), rtol=1e-5)
    chex.assert_trees_all_close(metrics["pg_clipfrac"], jnp.float32(2 / 6), rtol=1e-6)
    chex.assert_trees_all_close(metrics["pg_clipfrac_lower"], jnp.float32(1 / 6), rtol=1e-6)
    chex.assert_trees_all_close(metrics["ppo_kl"], jnp.float32(-np.log(RATIO).mean()), rtol=1e-5)
    no_dual, _ = token_clip_loss(LOGP, LOGP_OLD, ADV, ONES, **{**CLIP_CFG, "clip_ratio_c": 0.0})
    chex.assert_trees_all_close(no_dual, jnp.float32((-1.28 - 0.5 + 0.8 + 1.5 + 5.0 - 2.0) / 6), rtol=1e-5)


def test_token_clip_gradient_zero_where_clipped():
    grad = jax.grad(lambda lp: token_clip_loss(lp, LOGP_OLD, ADV, ONES, **CLIP_CFG)[0])(LOGP)
    # d/dlogp of -A r is -A r on unclipped tokens; zero under upper, lower and dual clip
    expected = jnp.array([[0.0, -0.5, 0.0, 1.5, 0.0, -2.0]]) / 6
    chex.assert_trees_all_close(grad, expected, atol=1e-6)


def test_token_clip_compat_no_lower_clip_for_negative_adv():
    # authors' -A min(r, clip(r)): A = -1 tokens give min(.5, .8) = .5 (no lower clip), min(1.5, 1.28) = 1.28,
    # min(5, 1.28) = 1.28 (then under the dual clip 3); A > 0 tokens as the token clip
    loss, _ = token_clip_loss(LOGP, LOGP_OLD, ADV, ONES, **CLIP_CFG, lower_clip_negative_adv=False)
    chex.assert_trees_all_close(loss, jnp.float32((-1.28 - 0.5 + 0.5 + 1.28 + 1.28 - 2.0) / 6), rtol=1e-5)
    grad = jax.grad(lambda lp: token_clip_loss(lp, LOGP_OLD, ADV, ONES, **CLIP_CFG, lower_clip_negative_adv=False)[0])(
        LOGP)
    # gradient -A r where r is not clipped; zero for A < 0 once r > 1 + eps_high
    chex.assert_trees_all_close(grad, jnp.array([[0.0, -0.5, 0.5, 0.0, 0.0, -2.0]]) / 6, atol=1e-6)


def test_token_clip_ratio_log_clamp():
    loss, _ = token_clip_loss(jnp.array([[50.0]]), jnp.array([[0.0]]), jnp.array([[-1.0]]), jnp.ones((1, 1)),
                              ratio_low=1 - 0.2, ratio_high=1 + 0.2, clip_ratio_c=0.0, agg=Aggregation("token-mean"))
    chex.assert_trees_all_close(loss, jnp.float32(np.exp(20.0)), rtol=1e-5)


def test_clip_config_errors():
    with pytest.raises(ValueError, match="clip_ratio_c=0.5"):
        token_clip_loss(LOGP, LOGP_OLD, ADV, ONES, ratio_low=1 - 0.2, ratio_high=1 + 0.2, clip_ratio_c=0.5,
                        agg=Aggregation("token-mean"))
    with pytest.raises(ValueError, match=r"ratio_low=-0\.5 \(1 - eps_low\) must be in \[0, 1\]"):
        token_clip_loss(LOGP, LOGP_OLD, ADV, ONES, ratio_low=1 - 1.5, ratio_high=1 + 0.2, agg=Aggregation("token-mean"))
    with pytest.raises(ValueError, match=r"ratio_high=0\.9 \(1 \+ eps_high\) must be >= 1"):
        token_clip_loss(LOGP, LOGP_OLD, ADV, ONES, ratio_low=0.8, ratio_high=0.9, agg=Aggregation("token-mean"))


def test_log_ratios_hand_computed():
    logp = jnp.array([[-1.0, -2.0, 30.0], [-1.0, -1.0, -1.0]])
    old = jnp.array([[-1.5, -1.0, 0.0], [-1.0, -1.0, -1.0]])
    chex.assert_trees_all_close(token_log_ratio(logp, old), jnp.array([[0.5, -1.0, 20.0], [0.0, 0.0, 0.0]]))
    mask = jnp.array([[1, 1, 0], [0, 0, 0]])
    chex.assert_trees_all_close(sequence_log_ratio(logp, old, mask), jnp.array([-0.25, 0.0]))
    chex.assert_trees_all_close(gspo_token_log_ratio(logp, old, mask), jnp.array([[-0.25] * 3, [0.0] * 3]))
    big = gspo_token_log_ratio(jnp.array([[20.0]]), jnp.array([[0.0]]), jnp.array([[1]]))
    chex.assert_trees_all_close(big, jnp.array([[10.0]]))  # clamped <= 10
    # the token form carries d logp_t, not d log s_i
    grad = jax.grad(lambda lp: gspo_token_log_ratio(lp, old, mask).sum())(logp)
    chex.assert_trees_all_close(grad, jnp.ones((2, 3)))


def test_gspo_hand_computed():
    logp_old = jnp.array([[-1.0, -2.0, -3.0]])
    logp = logp_old + jnp.array([[0.1, 0.3, 7.0]])  # third token is padding
    mask = jnp.array([[1, 1, 0]])
    s = math.exp(0.2)
    loss, m = gspo_loss(logp, logp_old, jnp.ones((1, 3)), mask)
    chex.assert_trees_all_close(loss, jnp.float32(-1.0004), rtol=1e-6)  # max(-s, -(1 + 4e-4))
    chex.assert_trees_all_close(m["pg_clipfrac"], jnp.float32(1.0))
    grad_pos = jax.grad(lambda lp: gspo_loss(lp, logp_old, jnp.ones((1, 3)), mask)[0])(logp)
    chex.assert_trees_all_close(grad_pos, jnp.zeros((1, 3)), atol=1e-7)
    loss, _ = gspo_loss(logp, logp_old, -jnp.ones((1, 3)), mask)
    chex.assert_trees_all_close(loss, jnp.float32(s), rtol=1e-6)
    grad_neg = jax.grad(lambda lp: gspo_loss(lp, logp_old, -jnp.ones((1, 3)), mask)[0])(logp)
    # d(s)/dlogp_t = s / |y| on each valid token
    chex.assert_trees_all_close(grad_neg, jnp.array([[s / 2, s / 2, 0.0]]), rtol=1e-5)


def test_gspo_token_form_matches_sequence_form_value_and_gradient():
    rng = np.random.default_rng(2)
    logp_old = jnp.asarray(-rng.random((6, 5)) * 3, jnp.float32)
    delta = jnp.asarray(rng.normal(size=(6, 5)) * 0.08, jnp.float32)
    mask = jnp.asarray([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0],
                        [0, 0, 0, 0, 0]], jnp.float32)
    adv_b = jnp.array([1.0, -1.0, 0.5, -2.0, 1.5, 3.0])
    adv_bt = adv_b[:, None] * jnp.ones((1, 5))
    cfg = {"ratio_low": 1 - 0.03, "ratio_high": 1 + 0.04}

    def token_form(d):
        return gspo_loss(logp_old + d, logp_old, adv_bt, mask, agg=Aggregation("seq-mean-token-mean"), **cfg)[0]

    def seq_form(d):
        return gspo_sequence_loss_reference(logp_old + d, logp_old, adv_b, mask, **cfg)

    _, m = gspo_loss(logp_old + delta, logp_old, adv_bt, mask, **cfg)
    assert 0.0 < float(m["pg_clipfrac"]) < 1.0  # both clipped and unclipped sequences are exercised
    token_val, token_grad = jax.jit(jax.value_and_grad(token_form))(delta)
    seq_val, seq_grad = jax.jit(jax.value_and_grad(seq_form))(delta)
    chex.assert_trees_all_close(token_val, seq_val, rtol=1e-5, atol=1e-7)  # the sum cancels to ~1e-3
    chex.assert_trees_all_close(token_grad, seq_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("loss_name", ["token_clip", "gspo"])
def test_micro_batch_invariance_of_loss_and_gradient(mode, loss_name):
    rng = np.random.default_rng(3)
    b, t, d = 8, 6, 3
    feats = jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32)
    theta = jnp.asarray(rng.normal(size=(d,)) * 0.1, jnp.float32)
    logp_old = jnp.asarray(-rng.random((b, t)) - 0.5, jnp.float32)
    adv = jnp.asarray(rng.normal(size=(b, 1)) * jnp.ones((1, t)), jnp.float32)
    mask = jnp.asarray(rng.random((b, t)) < 0.7, jnp.float32).at[5].set(0.0)
    fn = token_clip_loss if loss_name == "token_clip" else gspo_loss
    cfg = ({"ratio_low": 1 - 0.2, "ratio_high": 1 + 0.28} if loss_name == "token_clip"
           else {"ratio_low": 1 - 0.003, "ratio_high": 1 + 0.004})

    def loss(th, sl, counts):
        logp = logp_old[sl] + feats[sl] @ th
        agg = Aggregation.of(mode, counts) if counts else Aggregation(mode)
        return fn(logp, logp_old[sl], adv[sl], mask[sl], agg=agg, **cfg)[0]

    @jax.jit
    def full_and_summed_parts(th):
        counts = aggregation_counts(mask)
        full = jax.value_and_grad(loss)(th, slice(0, b), {})
        parts = [jax.value_and_grad(loss)(th, sl, counts) for sl in (slice(0, 3), slice(3, 4), slice(4, 8))]
        return full, jax.tree.map(lambda *xs: sum(xs), *parts)

    (full_val, full_grad), (parts_val, parts_grad) = full_and_summed_parts(theta)
    chex.assert_trees_all_close(parts_val, full_val, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(parts_grad, full_grad, rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(full_grad).max()) > 1e-4  # the gradient being compared is not trivially zero


@pytest.mark.parametrize("loss_name", ["token_clip", "gspo"])
def test_padding_invariance(loss_name):
    rng = np.random.default_rng(4)
    logp_old = jnp.asarray(-rng.random((4, 5)), jnp.float32)
    logp = logp_old + jnp.asarray(rng.normal(size=(4, 5)) * 0.3, jnp.float32)
    adv = jnp.asarray(rng.normal(size=(4, 1)), jnp.float32) * jnp.ones((1, 5))
    mask = jnp.asarray(rng.random((4, 5)) < 0.8, jnp.float32)
    fn = token_clip_loss if loss_name == "token_clip" else gspo_loss
    pad = lambda x, v: jnp.concatenate([x, jnp.full((4, 3), v, jnp.float32)], axis=1)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        ref, ref_m = fn(logp, logp_old, adv, mask, agg=Aggregation(mode))
        got, got_m = fn(pad(logp, 3.0), pad(logp_old, -9.0), pad(adv, 5.0), pad(mask, 0.0), agg=Aggregation(mode))
        chex.assert_trees_all_close((got, got_m), (ref, ref_m), rtol=1e-6)


def test_kl_estimators_hand_computed():
    logp = jnp.array([-1.0, -2.0, 0.0])
    ref = jnp.array([-2.0, -1.0, -30.0])
    chex.assert_trees_all_close(kl_estimate(logp, ref, "k1"), jnp.array([1.0, -1.0, 30.0]))
    chex.assert_trees_all_close(kl_estimate(logp, ref, "k2"), jnp.array([0.5, 0.5, 450.0]))
    # k3: x = ref - logp = -1 -> e^-1; x = 1 -> e - 2; x = -30 clipped to -20 -> 19, clipped to 10
    chex.assert_trees_all_close(kl_k3(logp, ref), jnp.array([math.exp(-1), math.e - 2, 10.0]), rtol=1e-6)
    loss, _m = kl_loss(logp[None], ref[None], jnp.array([[1, 1, 0]]), estimator="k3", agg=Aggregation("token-mean"))
    chex.assert_trees_all_close(loss, jnp.float32((math.exp(-1) + math.e - 2) / 2), rtol=1e-6)
    with pytest.raises(ValueError, match="kl estimator='k4'"):
        kl_estimate(logp, ref, "k4")


def test_entropy_hand_computed_and_reference():
    h = token_entropy(jnp.array([[[0.0, 0.0], [0.0, math.log(3.0)]]]))
    chex.assert_trees_all_close(h, jnp.array([[math.log(2), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]]),
                                rtol=1e-6)
    z64 = np.random.default_rng(5).normal(size=(2, 3, 11)) * 4
    p64 = np.exp(z64 - z64.max(-1, keepdims=True))
    p64 /= p64.sum(-1, keepdims=True)
    # float32 cancellation in logsumexp(z) - E[z] is about eps32 * |z| ~ 1e-6
    chex.assert_trees_all_close(token_entropy(jnp.asarray(z64, jnp.float32)),
                                jnp.asarray(-np.sum(p64 * np.log(p64), -1), jnp.float32), atol=1e-5)


def test_value_loss_hand_computed():
    v = jnp.array([[1.0, 2.0]])
    v_old = jnp.array([[0.0, 2.0]])
    ret = jnp.array([[1.2, 1.0]])
    loss, m = clipped_value_loss(v, v_old, ret, jnp.ones((1, 2)), agg=Aggregation("token-mean"))
    # token 0: max(.04, (0.5 - 1.2)^2 = .49) clipped; token 1: max(1, 1) -> 0.5 * (.49 + 1) / 2
    chex.assert_trees_all_close(loss, jnp.float32(0.3725), rtol=1e-6)
    chex.assert_trees_all_close(m["vf_clipfrac"], jnp.float32(0.5))
    grad = jax.grad(lambda x: clipped_value_loss(x, v_old, ret, jnp.ones((1, 2)), agg=Aggregation("token-mean"))[0])(v)
    chex.assert_trees_all_close(grad, jnp.array([[0.0, 0.5]]), atol=1e-6)  # clipped branch has no gradient


def test_dr_grpo_advantages_and_loss_by_hand():
    """Dr. GRPO (configs/dr_grpo.py): A_i = R_i - mean_g, and the token clip loss summed over each
    response's tokens over a constant length, then averaged over responses. Two groups of two,
    responses of 3, 1, 2 and 3 tokens, ratio 1 (no clip), constant length 8."""
    rewards = jnp.array([1.0, 0.0, 0.75, 0.25])
    adv_b = advantages.group_relative_advantages(rewards, 2, norm_by_std=False)
    chex.assert_trees_all_close(adv_b, jnp.array([0.5, -0.5, 0.25, -0.25]))  # r - group mean, no std
    # GRPO's std division would make both groups +-1
    chex.assert_trees_all_close(advantages.group_relative_advantages(rewards, 2), jnp.array([1.0, -1.0, 1.0, -1.0]),
                                atol=1e-5)
    mask = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]], jnp.float32)
    adv_bt = adv_b[:, None] * mask
    logp = jnp.log(jnp.full((4, 4), 0.5))

    def loss(lp, mode):
        return token_clip_loss(lp, logp, adv_bt, mask, agg=Aggregation(mode, norm_length=8))[0]

    # sum_t -A_i: -1.5, 0.5, -0.5, 0.75 -> -0.75; / 8 tokens / 4 responses
    chex.assert_trees_all_close(loss(logp, "seq-mean-token-sum-norm"), -0.75 / 8 / 4)
    chex.assert_trees_all_close(loss(logp, "seq-mean-token-mean"), 0.0)  # GRPO: each response's mean, -A_i
    # every token weighs -A_i / (8 * 4) whatever its response's length (no 1/|o_i|)
    chex.assert_trees_all_close(jax.grad(loss)(logp, "seq-mean-token-sum-norm"), -adv_bt / 32)
