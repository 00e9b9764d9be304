"""SDPO: generalised JSD, top-k + tail, reverse-KL token loss, IS weight, attribution, demos, EMA."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.losses import distill
from pipo_jax.losses.aggregation import Aggregation, aggregation_counts

S2 = jnp.log(jnp.array([[[0.5, 0.5]]]))  # [1, 1, 2]
T2 = jnp.log(jnp.array([[[0.9, 0.1]]]))


def kl(p, q):
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))


@pytest.mark.parametrize(
    "alpha, expected",
    [
        (0.0, kl([0.9, 0.1], [0.5, 0.5])),  # forward KL(T||S) = 0.368064
        (1.0, kl([0.5, 0.5], [0.9, 0.1])),  # reverse KL(S||T) = 0.510826
        (0.5, 0.5 * kl([0.5, 0.5], [0.7, 0.3]) + 0.5 * kl([0.9, 0.1], [0.7, 0.3])),  # JSD, M = [.7, .3]: 0.101749
        (0.25, 0.75 * kl([0.5, 0.5], [0.6, 0.4]) + 0.25 * kl([0.9, 0.1], [0.6, 0.4])),  # M = .75 S + .25 T
    ],
)
def test_generalized_jsd_hand_computed(alpha, expected):
    chex.assert_trees_all_close(distill.generalized_jsd(S2, T2, alpha), jnp.array([[expected]], jnp.float32), rtol=1e-5)


def test_generalized_jsd_matches_literal_values_and_teacher_has_no_gradient():
    chex.assert_trees_all_close(distill.generalized_jsd(S2, T2, 0.5), jnp.array([[0.101749]]), rtol=1e-4)
    g_teacher = jax.grad(lambda t: distill.generalized_jsd(S2, t, 0.5).sum())(T2)
    chex.assert_trees_all_close(g_teacher, jnp.zeros_like(T2))
    g_student = jax.grad(lambda s: distill.generalized_jsd(s, T2, 1.0).sum())(S2)
    # d/dlogS_v of sum_v S_v (logS_v - logT_v) = S_v (logS_v - logT_v + 1)
    s, t = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    chex.assert_trees_all_close(g_student[0, 0], jnp.asarray(s * (np.log(s / t) + 1), jnp.float32), rtol=1e-5)
    with pytest.raises(ValueError, match="alpha=1.5"):
        distill.generalized_jsd(S2, T2, 1.5)


def test_topk_with_tail_hand_computed():
    s = jnp.log(jnp.array([[[0.5, 0.3, 0.15, 0.05]]]))
    t = jnp.log(jnp.array([[[0.1, 0.2, 0.3, 0.4]]]))
    s_n, t_n = distill.student_topk_with_tail(s, t, 2)  # student's top-2 = tokens 0, 1
    chex.assert_trees_all_close(jnp.exp(s_n), jnp.array([[[0.5, 0.3, 0.2]]]), rtol=1e-5)
    chex.assert_trees_all_close(jnp.exp(t_n), jnp.array([[[0.1, 0.2, 0.7]]]), rtol=1e-5)
    s_n, t_n = distill.student_topk_with_tail(s, t, 2, add_tail=False)
    chex.assert_trees_all_close(jnp.exp(s_n), jnp.array([[[0.625, 0.375]]]), rtol=1e-5)
    chex.assert_trees_all_close(jnp.exp(t_n), jnp.array([[[1 / 3, 2 / 3]]]), rtol=1e-5)
    full_s, full_t = distill.student_topk_with_tail(s, t, None)
    chex.assert_trees_all_close((full_s, full_t), (s, t))
    s_all, _ = distill.student_topk_with_tail(s, t, 4)  # all mass in the top-k: tail stays finite
    assert bool(jnp.all(jnp.isfinite(s_all)))
    with pytest.raises(ValueError, match="distill_topk=5"):
        distill.student_topk_with_tail(s, t, 5)


def test_full_support_jsd_equals_topk_jsd_when_k_is_vocab_without_tail():
    rng = np.random.default_rng(0)
    s = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(2, 3, 6)), jnp.float32))
    t = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(2, 3, 6)), jnp.float32))

    @jax.jit
    def both(s, t):
        s_n, t_n = distill.student_topk_with_tail(s, t, 6, add_tail=False)  # a permutation of the vocabulary
        return [(distill.generalized_jsd(s_n, t_n, a), distill.generalized_jsd(s, t, a)) for a in (0.0, 0.5, 1.0)]

    for topk_jsd, full_jsd in both(s, t):
        chex.assert_trees_all_close(topk_jsd, full_jsd, rtol=1e-5, atol=1e-6)


def test_reverse_kl_token_loss_and_importance_weight():
    val, grad = jax.value_and_grad(lambda s: distill.reverse_kl_token_loss(s, jnp.array(-2.0)))(jnp.array(-1.0))
    assert float(val) == pytest.approx(-1.0) and float(grad) == pytest.approx(1.0)  # sg(S - T) * S
    w = distill.importance_weight(jnp.log(jnp.array([1.5, 3.0, 0.5])), jnp.zeros(3))
    chex.assert_trees_all_close(w, jnp.array([1.5, 2.0, 0.5]), rtol=1e-6)
    chex.assert_trees_all_close(distill.importance_weight(jnp.log(jnp.array([3.0])), jnp.zeros(1), None),
                                jnp.array([3.0]), rtol=1e-6)
    g = jax.grad(lambda x: distill.importance_weight(x, jnp.zeros(3)).sum())(jnp.zeros(3))
    chex.assert_trees_all_close(g, jnp.zeros(3))


def _sdpo_inputs():
    logp = jnp.array([[-1.0, -0.5], [-0.3, -0.2]])
    teacher = jnp.array([[-2.0, -1.0], [-0.1, -0.9]])
    old = jnp.array([[-1.0, -0.5 - math.log(3.0)], [-0.3, -0.2]])  # token (0, 1) has ratio 3 -> weight 2
    mask = jnp.array([[1, 1], [1, 0]])
    return logp, teacher, old, mask, jnp.array([1.0, 0.0])  # row 1 has no teacher signal


def test_sdpo_token_loss_hand_computed():
    logp, teacher, old, mask, sd = _sdpo_inputs()

    def f(lp):
        return distill.sdpo_token_loss(lp, old, None, mask, logp_teacher_br=teacher, sd_mask_b=sd)

    (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(logp)
    # row 0: (1 * -1) * w=1 and (0.5 * -0.5) * w=2, token mean over 2 tokens
    chex.assert_trees_all_close(loss, jnp.float32((-1.0 - 0.5) / 2), rtol=1e-6)
    chex.assert_trees_all_close(grad, jnp.array([[1.0 * 1 / 2, 0.5 * 2 / 2], [0.0, 0.0]]), rtol=1e-6)
    chex.assert_trees_all_close(metrics["sdpo_teacher_minus_student_logp"], jnp.float32((-1.0 - 0.5) / 2), rtol=1e-6)


def test_sdpo_jsd_loss_weighting_and_micro_batches():
    rng = np.random.default_rng(1)
    b, t, v = 4, 3, 7
    s_btv = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(b, t, v)), jnp.float32))
    t_btv = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(b, t, v)), jnp.float32))
    logp = jnp.asarray(-rng.random((b, t)), jnp.float32)
    old = logp - jnp.asarray(rng.normal(size=(b, t)) * 0.5, jnp.float32)
    mask = jnp.array([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], jnp.float32)
    sd = jnp.array([1.0, 0.0, 1.0, 1.0])

    @jax.jit
    def expected_full_and_parts():
        s_n, t_n = distill.student_topk_with_tail(s_btv, t_btv, 3)
        per_tok = distill.generalized_jsd(s_n, t_n, 0.5) * distill.importance_weight(logp, old)
        eff = mask * sd[:, None]
        expected = jnp.sum(per_tok * eff) / jnp.sum(eff)
        kw = {"student_distill_logp_brn": s_n, "teacher_distill_logp_brn": t_n, "sd_mask_b": sd}
        loss, _ = distill.sdpo_jsd_loss(logp, old, None, mask, **kw)
        counts = aggregation_counts(eff)
        parts = [distill.sdpo_jsd_loss(logp[sl], old[sl], None, mask[sl], student_distill_logp_brn=s_n[sl],
                                       teacher_distill_logp_brn=t_n[sl], sd_mask_b=sd[sl],
                                       agg=Aggregation.of("token-mean", counts))[0]
                 for sl in (slice(0, 1), slice(1, 4))]
        return expected, loss, sum(parts)

    expected, loss, summed = expected_full_and_parts()
    chex.assert_trees_all_close(loss, expected, rtol=1e-6)
    chex.assert_trees_all_close(summed, loss, rtol=1e-6)


def test_token_attribution_and_demonstrations():
    a = distill.token_attribution(jnp.array([[-1.0, -2.0, 5.0]]), jnp.array([[-1.5, -1.0, 0.0]]),
                                  jnp.array([[1, 1, 0]]))
    chex.assert_trees_all_close(a, jnp.array([[0.5, -1.0, 0.0]]))
    rewards = jnp.array([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    demo, has = distill.select_demonstrations(rewards, 3)
    np.testing.assert_array_equal(demo, [2, 0, 0, -1, -1, -1, 7, -1, 7])
    np.testing.assert_array_equal(has, [True, True, True, False, False, False, True, False, True])
    demo, _ = distill.select_demonstrations(jnp.array([0.5, 0.7]), 2, success_threshold=0.6)
    np.testing.assert_array_equal(demo, [1, -1])


def test_ema_update():
    teacher = {"w": jnp.array([1.0, 2.0]), "b": jnp.array([4.0], jnp.bfloat16)}
    student = {"w": jnp.array([3.0, 2.0]), "b": jnp.array([0.0], jnp.bfloat16)}
    out = distill.ema_update(teacher, student, 0.05)
    chex.assert_trees_all_close(out["w"], jnp.array([1.1, 2.0]), rtol=1e-6)
    assert out["b"].dtype == jnp.bfloat16 and float(out["b"][0]) == pytest.approx(3.8, rel=1e-2)
    with pytest.raises(ValueError, match="rate=2"):
        distill.ema_update(teacher, student, 2)
