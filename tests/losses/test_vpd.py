"""VPD loss math (docs/math.md §4): implicit reward, BCO E-step loss and gradient, the margin delta,
teacher-collapse diagnostics and the GRPO + SDPO hybrids, on hand-computed numbers and a
plain numpy reference."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.losses import distill, vpd
from pipo_jax.losses.aggregation import Aggregation
from pipo_jax.losses.policy import token_clip_loss

LOGQ = jnp.array([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]])
LOGPI = jnp.array([[-1.5, -2.0, -2.0], [-1.0, -1.0, 99.0]])  # 99 sits in padding and must be ignored
MASK = jnp.array([[1, 1, 1], [1, 1, 0]], jnp.float32)


def np_log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


def np_bco(r, delta, pos, neg):
    """Plain numpy E-step loss: mean over positives and negatives separately, empty set -> 0."""
    z = r - delta
    lp = -np_log_sigmoid(z[pos]).sum() / max(pos.sum(), 1)
    ln = -np_log_sigmoid(-z[neg]).sum() / max(neg.sum(), 1)
    return lp + ln


def test_implicit_reward_sum_and_mean_hand_computed():
    # row 0: (0.5 + 0 - 1) = -0.5; row 1: 0.5 + 0.5 = 1.0 (padding excluded)
    r_sum = vpd.implicit_reward(LOGQ, LOGPI, MASK, beta=0.1)
    chex.assert_trees_all_close(r_sum, jnp.array([-0.05, 0.1]), rtol=1e-6)
    r_mean = vpd.implicit_reward(LOGQ, LOGPI, MASK, beta=0.1, seq_logprob="mean")
    chex.assert_trees_all_close(r_mean, jnp.array([-0.05 / 3, 0.05]), rtol=1e-6)
    with pytest.raises(ValueError, match="seq_logprob='max'"):
        vpd.implicit_reward(LOGQ, LOGPI, MASK, beta=0.1, seq_logprob="max")


def test_implicit_reward_gradient_reaches_the_teacher_only():
    w = jnp.array([1.0, -2.0])
    f = lambda q, p, mode: jnp.sum(w * vpd.implicit_reward(q, p, MASK, beta=0.1, seq_logprob=mode))
    g_q, g_p = jax.grad(f, argnums=(0, 1))(LOGQ, LOGPI, "sum")
    chex.assert_trees_all_close(g_q, jnp.array([[0.1, 0.1, 0.1], [-0.2, -0.2, 0.0]]), rtol=1e-6)
    chex.assert_trees_all_close(g_p, jnp.zeros_like(LOGPI))
    g_q, _ = jax.grad(f, argnums=(0, 1))(LOGQ, LOGPI, "mean")
    chex.assert_trees_all_close(g_q, jnp.array([[0.1 / 3] * 3, [-0.1, -0.1, 0.0]]), rtol=1e-6)


def test_outcome_labels():
    pos, neg = vpd.outcome_labels(jnp.array([1.0, 0.5, 1.2, 0.0]), 1.0, jnp.array([1, 1, 0, 1]))
    np.testing.assert_array_equal(pos, [True, False, False, False])
    np.testing.assert_array_equal(neg, [False, True, False, True])


R4 = jnp.array([0.3, -0.2, 0.1, 0.5])
POS4 = jnp.array([True, False, True, False])
NEG4 = ~POS4


def test_bco_loss_hand_computed_value_and_gradient():
    loss, m = vpd.bco_loss(R4, 0.1, POS4, NEG4)
    # z = r - delta = [0.2, -0.3, 0.0, 0.4]
    l_pos = (math.log1p(math.exp(-0.2)) + math.log(2.0)) / 2  # 0.645643
    l_neg = (math.log1p(math.exp(-0.3)) + math.log1p(math.exp(0.4))) / 2  # 0.733685
    assert float(loss) == pytest.approx(l_pos + l_neg, rel=1e-6)
    assert float(loss) == pytest.approx(1.379328, abs=1e-6)
    assert float(m["e_loss_pos"]) == pytest.approx(l_pos, rel=1e-6)
    assert float(m["e_loss_neg"]) == pytest.approx(l_neg, rel=1e-6)
    assert float(m["rtilde_pos"]) == pytest.approx(0.2, rel=1e-6)  # mean(0.3, 0.1)
    assert float(m["rtilde_neg"]) == pytest.approx(0.15, rel=1e-6)  # mean(-0.2, 0.5)
    assert float(m["e_accuracy"]) == pytest.approx(0.5)  # z=0.2 (+) and z=-0.3 (-) are right
    # dL/dr_i = -sigmoid(-z_i) / n_pos for positives, sigmoid(z_i) / n_neg for negatives
    sig = lambda x: 1 / (1 + math.exp(-x))
    expected = [-sig(-0.2) / 2, sig(-0.3) / 2, -sig(0.0) / 2, sig(0.4) / 2]
    g_r, g_delta = jax.grad(lambda r, d: vpd.bco_loss(r, d, POS4, NEG4)[0], argnums=(0, 1))(R4, jnp.float32(0.1))
    chex.assert_trees_all_close(g_r, jnp.array(expected), rtol=1e-6)
    assert float(g_delta) == 0.0  # the margin carries no gradient


def test_bco_loss_matches_numpy_reference():
    rng = np.random.default_rng(0)
    for _ in range(5):
        r = rng.normal(size=12).astype(np.float32) * 3
        pos = rng.random(12) < 0.4
        neg = ~pos & (rng.random(12) < 0.8)
        delta = float(rng.normal())
        loss, _ = vpd.bco_loss(jnp.asarray(r), delta, pos, neg)
        assert float(loss) == pytest.approx(np_bco(r, delta, pos, neg), rel=1e-5)


@pytest.mark.parametrize("case", ["no_negatives", "no_positives", "none_labelled"])
def test_bco_loss_empty_sets_contribute_zero_without_nan(case):
    pos = {"no_negatives": POS4 | NEG4, "no_positives": jnp.zeros(4, bool), "none_labelled": jnp.zeros(4, bool)}[case]
    neg = {"no_negatives": jnp.zeros(4, bool), "no_positives": POS4 | NEG4, "none_labelled": jnp.zeros(4, bool)}[case]
    r = R4.at[1].set(1e4)  # huge implicit rewards must not produce inf / NaN anywhere
    (loss, m), g = jax.value_and_grad(lambda x: vpd.bco_loss(x, 0.1, pos, neg), has_aux=True)(r)
    assert np.all(np.isfinite(g)) and all(np.isfinite(float(v)) for v in m.values())
    expected = np_bco(np.asarray(r), 0.1, np.asarray(pos), np.asarray(neg))
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    if case == "no_negatives":
        assert float(m["e_loss_neg"]) == 0.0 and float(m["rtilde_neg"]) == 0.0
    if case == "no_positives":
        # mean over the 4 negatives of log(1 + e^z), z = [0.2, 1e4 - 0.1, 0, 0.4]
        hand = (math.log1p(math.exp(0.2)) + (1e4 - 0.1) + math.log(2) + math.log1p(math.exp(0.4))) / 4
        assert float(m["e_loss_pos"]) == 0.0 and float(loss) == pytest.approx(hand, rel=1e-6)
    if case == "none_labelled":
        assert float(loss) == 0.0
        chex.assert_trees_all_close(g, jnp.zeros(4))


def test_bco_loss_micro_batches_add_up_with_global_counts():
    rng = np.random.default_rng(1)
    r = jnp.asarray(rng.normal(size=8), jnp.float32)
    pos = jnp.asarray([1, 0, 0, 1, 1, 0, 0, 0], bool)
    neg = jnp.asarray([0, 1, 1, 0, 0, 0, 1, 1], bool)
    whole, m_whole = vpd.bco_loss(r, 0.2, pos, neg)
    n = {"num_pos": jnp.sum(pos), "num_neg": jnp.sum(neg)}
    parts = [vpd.bco_loss(r[s], 0.2, pos[s], neg[s], **n) for s in (slice(0, 4), slice(4, 8))]
    assert float(parts[0][0] + parts[1][0]) == pytest.approx(float(whole), rel=1e-6)
    for key in m_whole:
        assert float(parts[0][1][key] + parts[1][1][key]) == pytest.approx(float(m_whole[key]), rel=1e-6, abs=1e-7)


def test_update_delta_modes():
    s = vpd.init_delta_state()
    b1, b2, b3 = jnp.array([0.0, 2.0]), jnp.array([3.0, 3.0]), jnp.array([-6.0, 0.0])
    # cumulative: the plain mean of the batch means 1, 3, -3
    s1 = vpd.update_delta(s, b1)
    s2 = vpd.update_delta(s1, b2)
    s3 = vpd.update_delta(s2, b3)
    np.testing.assert_allclose([s1.delta, s2.delta, s3.delta], [1.0, 2.0, 1.0 / 3.0], rtol=1e-6)
    assert int(s3.count) == 3
    # ema with rate 0.5: the first update takes the mean (no pull toward the initial 0)
    e1 = vpd.update_delta(s, b1, mode="ema", rate=0.5)
    e2 = vpd.update_delta(e1, b2, mode="ema", rate=0.5)
    e3 = vpd.update_delta(e2, b3, mode="ema", rate=0.5)
    np.testing.assert_allclose([e1.delta, e2.delta, e3.delta], [1.0, 2.0, -0.5], rtol=1e-6)
    # batch: no memory
    assert float(vpd.update_delta(s2, b3, mode="batch").delta) == -3.0
    # valid mask: only labelled rows count; a batch with none leaves the state unchanged
    assert float(vpd.update_delta(s, jnp.array([5.0, 100.0]), jnp.array([1, 0])).delta) == 5.0
    same = vpd.update_delta(s2, b3, jnp.zeros(2))
    assert float(same.delta) == 2.0 and int(same.count) == 2
    with pytest.raises(ValueError, match="delta_mode='median'"):
        vpd.update_delta(s, b1, mode="median")
    with pytest.raises(ValueError, match="delta_ema_rate=0.0"):
        vpd.update_delta(s, b1, mode="ema", rate=0.0)


def test_entropy_kl_and_collapse_metrics_hand_computed():
    t = jnp.log(jnp.array([[[0.9, 0.1], [0.5, 0.5], [1.0, 0.0]]]))  # [1, 3, 2]; the last entry has p = 0
    s = jnp.log(jnp.array([[[0.5, 0.5], [0.5, 0.5], [0.2, 0.8]]]))
    h = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))  # 0.325083
    chex.assert_trees_all_close(vpd.token_entropy(t), jnp.array([[h, math.log(2), 0.0]]), rtol=1e-5, atol=1e-7)
    kl0 = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)  # 0.368064
    chex.assert_trees_all_close(vpd.token_kl(t, s), jnp.array([[kl0, 0.0, math.log(1 / 0.2)]]), rtol=1e-5,
                                atol=1e-7)
    m = vpd.teacher_collapse_metrics(t, s, jnp.array([[1, 1, 0]]))  # the third token is padding
    assert float(m["teacher_entropy"]) == pytest.approx((h + math.log(2)) / 2, rel=1e-5)
    assert float(m["student_entropy"]) == pytest.approx(math.log(2), rel=1e-5)
    assert float(m["kl_teacher_student"]) == pytest.approx(kl0 / 2, rel=1e-5)


# ----------------------------------------------------------------------------- hybrids

ADV = jnp.array([[1.0, 1.0], [-1.0, -1.0]])
LOGP_S = jnp.array([[-2.0, -2.0], [-0.5, -3.0]])
LOGP_T = jnp.array([[-1.0, -2.0], [-1.0, -1.0]])
M2 = jnp.ones((2, 2))
SD = jnp.array([1.0, 0.0])


def test_reshaped_advantages_hand_computed():
    a = vpd.reshaped_advantages(ADV, LOGP_T, LOGP_S, M2, weight=0.5, sd_mask_b=SD)
    # row 0: 1 + 0.5 * (logT - logS) = [1 + 0.5, 1 + 0]; row 1 has no teacher signal: plain A
    chex.assert_trees_all_close(a, jnp.array([[1.5, 1.0], [-1.0, -1.0]]))
    a = vpd.reshaped_advantages(ADV, LOGP_T, LOGP_S, jnp.array([[1, 0], [1, 1]]), weight=2.0)
    chex.assert_trees_all_close(a, jnp.array([[3.0, 0.0], [-2.0, 3.0]]))


def reshape_hybrid(logp, logp_old, adv, mask, *, logp_teacher, weight, sd_mask_b=None):
    """The reshape hybrid as the learner runs it (the `vpd_reshape` advantage shaping, then the
    token clip loss): (loss, metrics, A')."""
    a2 = vpd.reshaped_advantages(adv, logp_teacher, logp_old, mask, weight=weight, sd_mask_b=sd_mask_b)
    loss, metrics = token_clip_loss(logp, logp_old, a2, mask, agg=Aggregation("seq-mean-token-mean"))
    return loss, metrics, a2


def test_reshape_hybrid_hand_value_and_weight_zero_is_token_clip():
    # at ratio 1 the clip loss is -A': seq-mean-token-mean of [[-1.5, -1], [1, 1]] = mean(-1.25, 1) = -0.125
    loss, _, a2 = reshape_hybrid(LOGP_S, LOGP_S, ADV, M2, logp_teacher=LOGP_T, weight=0.5, sd_mask_b=SD)
    assert float(loss) == pytest.approx(-0.125, rel=1e-6)
    chex.assert_trees_all_close(a2, jnp.array([[1.5, 1.0], [-1.0, -1.0]]), rtol=1e-6)
    # weight 0: plain GRPO token clip, value and gradient, with ratios outside the clip range
    logp = LOGP_S + jnp.array([[0.3, -0.4], [0.1, 0.5]])
    f = lambda lp: reshape_hybrid(lp, LOGP_S, ADV, M2, logp_teacher=LOGP_T, weight=0.0)[0]
    g = lambda lp: token_clip_loss(lp, LOGP_S, ADV, M2, agg=Aggregation("seq-mean-token-mean"))[0]
    chex.assert_trees_all_close(jax.value_and_grad(f)(logp), jax.value_and_grad(g)(logp), rtol=1e-6)


def test_joint_hybrid_loss_token_form_hand_value_and_gradient():
    f = lambda s: vpd.joint_hybrid_loss(s, LOGP_S, ADV, M2, weight=0.5,
                                        logp_teacher_br=LOGP_T, sd_mask_b=SD)
    (loss, m), g = jax.value_and_grad(f, has_aux=True)(LOGP_S)
    # pg at ratio 1: mean over rows of -A = mean(-1, 1) = 0
    # SDPO token-mean over mask * sd_mask (row 0): sg(S - T) * S = [(-1)(-2), 0] -> 2 / 2 = 1
    assert float(m["pg_loss"]) == pytest.approx(0.0, abs=1e-7)
    assert float(m["sdpo_loss"]) == pytest.approx(1.0, rel=1e-6)
    assert float(loss) == pytest.approx(0.5, rel=1e-6) and float(m["joint_loss"]) == float(loss)
    # d pg / d logp = -A r / |y| / n_seq = -A / 4; d sdpo / d logp_S = sg(S - T) * IS / n_tok (IS = 1)
    expected = -np.array([[1, 1], [-1, -1]]) / 4 + 0.5 * np.array([[-1.0, 0.0], [0.0, 0.0]]) / 2
    chex.assert_trees_all_close(g, jnp.asarray(expected, jnp.float32), rtol=1e-6)


def test_joint_hybrid_loss_jsd_form_is_clip_plus_weighted_jsd():
    rng = np.random.default_rng(2)
    s_btn = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(2, 2, 5)), jnp.float32))
    t_btn = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(2, 2, 5)), jnp.float32))
    logp = LOGP_S + 0.2
    loss, m = vpd.joint_hybrid_loss(logp, LOGP_S, ADV, M2, weight=0.3, distill_form="jsd",
                                    student_distill_logp_brn=s_btn, teacher_distill_logp_brn=t_btn, alpha=0.5,
                                    sd_mask_b=SD)
    pg, _ = token_clip_loss(logp, LOGP_S, ADV, M2, agg=Aggregation("seq-mean-token-mean"))
    sd, _ = distill.sdpo_jsd_loss(logp, LOGP_S, None, M2, student_distill_logp_brn=s_btn,
                                  teacher_distill_logp_brn=t_btn, alpha=0.5, sd_mask_b=SD)
    assert float(loss) == pytest.approx(float(pg + 0.3 * sd), rel=1e-6)
    # plain numpy: IS weight min(e^0.2, 2) times the JSD of row 0's tokens, token-mean over 2 tokens
    s, t = np.exp(np.asarray(s_btn[0])), np.exp(np.asarray(t_btn[0]))
    mix = 0.5 * s + 0.5 * t
    jsd = 0.5 * np.sum(s * np.log(s / mix), -1) + 0.5 * np.sum(t * np.log(t / mix), -1)
    assert float(m["sdpo_loss"]) == pytest.approx(math.exp(0.2) * jsd.mean(), rel=1e-5)
    with pytest.raises(ValueError, match="needs logp_teacher_br"):
        vpd.joint_hybrid_loss(logp, LOGP_S, ADV, M2, weight=0.3)
    with pytest.raises(ValueError, match="distill_form='kl'"):
        vpd.joint_hybrid_loss(logp, LOGP_S, ADV, M2, weight=0.3, distill_form="kl", logp_teacher_br=LOGP_T)
