"""The authors' PPO behaviours (`pipo.authors.ppo_pi_no_lam`, `ppo_sign_attribution`,
`ppo_adv_gate`) against their code's arithmetic (pipo_verl: `compute_ppo_layback_coefficients`,
layback_utils.py:204-253; `compute_layback_coefficients` over groups of one response,
:172-183; `ppo_layback`, core_algos.py:989-1037, which ignores `layback_loss_scale`), and the
settings beside the paper's recipe (`pipo.attribution_norm`, the SDPO PI denominator's rows).
Every expected value is worked out by hand in the comments."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.losses import pipo
from pipo_jax.rl import controller
from pipo_jax.rl.batch import TrainBatch

ATTR = jnp.array([[1.0, -2.0, 0.0], [4.0, -2.0, 3.0]])
MASK = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])


def test_pi_rewards_paper_scales_negative_xi_by_lam():
    # xi = -3, lam = 0.1: c = -0.3; rhat = a * c on valid tokens
    rhat = pipo.pi_rewards(ATTR, -0.3, MASK, xi=-3.0, lam=0.1)
    chex.assert_trees_all_close(rhat, jnp.array([[-0.3, 0.6, 0.0], [-1.2, 0.6, 0.0]]), atol=1e-6)


def test_ppo_pi_no_lam_uses_xi_itself():
    # their ppo_layback loss ignores layback_loss_scale: rhat = a * xi = a * -3
    rhat = pipo.pi_rewards(ATTR, -0.3, MASK, xi=-3.0, lam=0.1, no_lam=True)
    chex.assert_trees_all_close(rhat, jnp.array([[-3.0, 6.0, 0.0], [-12.0, 6.0, 0.0]]), atol=1e-6)
    # with rhat_clamp: clamp(a * xi, -10, 10) and no lam factor: -12 -> -10
    rhat = pipo.pi_rewards(ATTR, -0.3, MASK, xi=-3.0, lam=0.1, clamp=True, no_lam=True)
    chex.assert_trees_all_close(rhat, jnp.array([[-3.0, 6.0, 0.0], [-10.0, 6.0, 0.0]]), atol=1e-6)
    # GRPO's path (clamp, then times lam): -10 * 0.1 = -1, 6 * 0.1 = 0.6
    rhat = pipo.pi_rewards(ATTR, -0.3, MASK, xi=-3.0, lam=0.1, clamp=True)
    chex.assert_trees_all_close(rhat, jnp.array([[-0.3, 0.6, 0.0], [-1.0, 0.6, 0.0]]), atol=1e-6)
    # xi >= 0: the same as the paper (c = xi)
    chex.assert_trees_all_close(pipo.pi_rewards(ATTR, 2.0, MASK, xi=2.0, lam=0.1, no_lam=True),
                                pipo.pi_rewards(ATTR, 2.0, MASK))
    with pytest.raises(ValueError, match="needs xi"):
        pipo.pi_rewards(ATTR, -0.3, MASK, no_lam=True)


def test_pi_verification_no_lam_only_on_the_ppo_path():
    state = controller.init_pipo_state(2, TrainBatch(
        tokens_bl=jnp.zeros((2, 4), jnp.int32), mask_bl=jnp.ones((2, 4), jnp.int32), mask_br=MASK,
        logp_old_br=jnp.zeros((2, 3)), logp_ref_br=jnp.zeros((2, 3)), attr_br=ATTR))
    state = state.replace(mu_window_k=jnp.array([0.5, 0.7]), count=jnp.array(2, jnp.int32),
                          has_prev=jnp.array(True), prev=state.prev.replace(attr_br=ATTR, mask_br=MASK))
    # window [0.5, 0.7]: mean 0.6, std (ddof 1) = sqrt(0.02) = 0.141421; mu_t = 0.6 - 0.141421 * 2 -> xi = -2
    mu_t = 0.6 - 2 * np.sqrt(0.02)
    options = controller.PipoOptions(ppo_pi_no_lam=True)
    rhat, m = controller.pi_verification(state, mu_t, lam=0.1, options=options, ppo=True)
    np.testing.assert_allclose(float(m["xi"]), -2.0, rtol=1e-5)
    np.testing.assert_allclose(float(m["c"]), -0.2, rtol=1e-5)  # c is still phi_lam(xi) (logged, go / no-go)
    chex.assert_trees_all_close(rhat, -2.0 * ATTR * MASK, rtol=1e-5)
    rhat, _ = controller.pi_verification(state, mu_t, lam=0.1, options=options, ppo=False)  # GRPO etc.: c
    chex.assert_trees_all_close(rhat, -0.2 * ATTR * MASK, rtol=1e-5)
    # lam = 0, xi < 0: c = 0, the step is skipped as in paper mode
    rhat, m = controller.pi_verification(state, mu_t, lam=0.0, options=options, ppo=True)
    assert not bool(m["pi_step_applied"]) and float(jnp.abs(rhat).sum()) == 0.0


@pytest.mark.parametrize("mu_t, window, count, kw, gate, xi", [
    # valid [0.2, 0.4]: mean 0.3; ddof 1: std sqrt(0.02) = 0.141421 -> xi = 0.2 / 0.141421 = 1.414214
    (0.5, [0.0, 0.0, 0.2, 0.4], 2, {}, 1.414214, 1.414214),
    # ddof 0 (np.std, their code): std 0.1 -> xi 2 -> gate 2
    (0.5, [0.0, 0.0, 0.2, 0.4], 2, {"ddof": 0}, 2.0, 2.0),
    # xi = 0.6 / 0.1 = 6 -> gate clipped to 2
    (0.9, [0.0, 0.0, 0.2, 0.4], 2, {"ddof": 0}, 2.0, 6.0),
    # xi = -0.3 / 0.1 = -3 -> gate -2 (negative: the advantages flip sign)
    (0.0, [0.0, 0.0, 0.2, 0.4], 2, {"ddof": 0}, -2.0, -3.0),
    # empty window: their rho = mu_t, so xi = 0 and the gate zeroes the advantages
    (0.5, [0.0, 0.0, 0.0, 0.0], 0, {}, 0.0, 0.0),
    # one mean: sigma 1 (len < 2) -> xi = 0.1 - 0.4 = -0.3
    (0.1, [0.0, 0.0, 0.0, 0.4], 1, {"ddof": 0}, -0.3, -0.3),
    # xi_clip: the difference clipped to 5 first (10 - 0.4 = 9.6 -> 5), sigma 1 -> xi 5, gate 2
    (10.0, [0.0, 0.0, 0.0, 0.4], 1, {"ddof": 0, "xi_clip": True}, 2.0, 5.0),
    # constant window: sigma 0 < floor -> 1.0; xi = 0.5 - 0.4 = 0.1
    (0.5, [0.4, 0.4, 0.4, 0.4], 4, {"ddof": 0, "xi_clip": True}, 0.1, 0.1),
])
def test_ppo_gate_matches_their_arithmetic(mu_t, window, count, kw, gate, xi):
    g, x = controller.ppo_gate(mu_t, jnp.array(window), jnp.array(count, jnp.int32), **kw)
    np.testing.assert_allclose([float(g), float(x)], [gate, xi], rtol=1e-5, atol=1e-6)


def test_ppo_sign_attribution_is_the_group_attribution_of_one_response():
    # abar = token means over valid tokens: row 0 (0.5 + 1.5) / 2 = 1.0, row 1 (-0.2 + 0) / 2 = -0.1
    adv = jnp.array([[0.5, 1.5, 9.0], [-0.2, 0.0, 5.0]])
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    a = pipo.group_attribution(adv, mask, 1)  # abar / max(|abar|, 1e-6) = sign
    chex.assert_trees_all_close(a, jnp.array([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]]))
    a = pipo.group_attribution(adv, mask, 1, additive_eps=True)  # their code: abar / (|abar| + 1e-6)
    chex.assert_trees_all_close(a, jnp.array([[1 / (1 + 1e-6)] * 2 + [0.0], [-0.1 / (0.1 + 1e-6)] * 2 + [0.0]]),
                                rtol=1e-6)
    # after a gate of -0.5 (an xi < 0 iteration) the stored advantages and so the signs are flipped
    chex.assert_trees_all_close(pipo.group_attribution(adv * -0.5, mask, 1), -pipo.group_attribution(adv, mask, 1))


def test_normalise_attribution_mean_abs_over_rows_with_a_signal():
    attr = jnp.array([[0.5, -1.5, 0.0], [0.0, 0.0, 0.0], [2.0, 7.0, 0.0]])
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    # row 2's 7.0 is padding (dropped); row 1 has no signal: 3 tokens, sum |a| = 0.5 + 1.5 + 2 = 4, mean 4/3
    out = pipo.normalise_attribution(attr, mask)
    chex.assert_trees_all_close(out, jnp.array([[0.375, -1.125, 0.0], [0.0, 0.0, 0.0], [1.5, 0.0, 0.0]]),
                                rtol=1e-6)
    chex.assert_trees_all_close(pipo.signal_rows(attr, mask), jnp.array([1.0, 0.0, 1.0]))
    # an all-zero attribution stays zero (floor 1e-6, no NaN)
    chex.assert_trees_all_close(pipo.normalise_attribution(jnp.zeros((3, 3)), mask), jnp.zeros((3, 3)))


def test_pipo_options_know_the_new_behaviours():
    for name in ("ppo_pi_no_lam", "ppo_sign_attribution", "ppo_adv_gate", "micro_token_mean"):
        assert name in controller.AUTHORS_BEHAVIOURS
        assert getattr(controller.pipo_options(True, **{name: False}), name) is False
        assert getattr(controller.pipo_options(False), name) is False
        assert getattr(controller.pipo_options(True), name) is True
