"""PIPO's named behaviours of the authors' released code (JacckMa/pipo_verl), one at a time.

Every expected value is worked out by hand from the formulas of their code on a fixed
sequence of batch means and ratios (file and line in the README's table):
layback_utils.py (window statistics, xi, coefficients), ray_trainer.py (window pushes, the
go / no-go), core_algos.py (the PI loss).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.losses import pipo
from pipo_jax.losses.aggregation import Aggregation
from pipo_jax.rl import controller
from pipo_jax.rl.batch import TrainBatch

K = 8
MUS = [0.1, 0.3, 0.2, 0.5, 0.4, 0.6, 0.2, 0.7, 0.3, 0.8]
AUTHORS = controller.pipo_options(compat=True)


def _batch(v=0.0):
    ones = jnp.ones((2, 3))
    return TrainBatch(tokens_bl=jnp.zeros((2, 4), jnp.int32), mask_bl=jnp.ones((2, 4), jnp.int32),
                      mask_br=ones, logp_old_br=ones * v, logp_ref_br=ones * v,
                      attr_br=jnp.array([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]))


def _run(options, lam=0.1):
    """The trainer's order (learn.learn): [push_mean], PI signal, push. Returns per-iteration metrics."""
    state = controller.init_pipo_state(K, _batch())
    out = []
    for mu in MUS:
        if options.window_twice:
            state = controller.push_mean(state, mu)
        _, m = controller.pi_verification(state, mu, lam=lam, options=options)
        out.append({k: float(v) for k, v in m.items()})
        state = controller.push(state, mu, _batch(mu))
    return out


def test_window_twice_first_pi_step_at_iteration_5_with_its_own_mean():
    metrics = _run(AUTHORS)
    applied = [m["pi_step_applied"] for m in metrics]
    # authors: len(deque) >= min_steps_before_layback = 8 after 2 pushes per iteration and the 9th
    # push at iteration 5 (1-based); the paper needs K = 8 previous means: iteration 9
    assert applied[:4] == [0.0] * 4 and applied[4] == 1.0
    paper = [m["pi_step_applied"] for m in _run(controller.PipoOptions())]
    assert paper[:8] == [0.0] * 8 and paper[8] == 1.0
    # iteration 5: the deque (maxlen 8) holds mu1, mu2 x2, mu3 x2, mu4 x2 and mu5 itself
    window = [0.1, 0.3, 0.3, 0.2, 0.2, 0.5, 0.5, 0.4]
    mean = 2.5 / 8  # 0.3125
    std0 = np.sqrt(0.14875 / 8)  # sum of squared deviations from 0.3125 = 0.14875; np.std (ddof 0)
    assert np.isclose(np.mean(window), mean) and np.isclose(np.std(window), std0)
    # float32 arithmetic on O(1) numbers: 1e-6 relative
    np.testing.assert_allclose([metrics[4]["mu_his"], metrics[4]["sigma_his"]], [mean, std0], rtol=1e-6)
    np.testing.assert_allclose(metrics[4]["xi"], (0.4 - mean) / std0, rtol=1e-5)
    # iteration 6: mu1 leaves, mu6 enters: mu2, mu3 x2, mu4 x2, mu5 x2, mu6
    window6 = [0.3, 0.2, 0.2, 0.5, 0.5, 0.4, 0.4, 0.6]
    np.testing.assert_allclose(metrics[5]["xi"], (0.6 - np.mean(window6)) / np.std(window6), rtol=1e-5)


def test_window_twice_alone_changes_only_the_window():
    one = _run(controller.pipo_options(window_twice=True))
    window = np.array([0.1, 0.3, 0.3, 0.2, 0.2, 0.5, 0.5, 0.4])
    np.testing.assert_allclose(one[4]["xi"], (0.4 - window.mean()) / window.std(ddof=1), rtol=1e-5)


def test_std_ddof0():
    window, mu = jnp.array([1.0, 2.0, 3.0, 4.0]), 5.0
    xi0, *_ = controller.improvement_signal(mu, window, 4, lam=0.1, ddof=controller.pipo_options(std_ddof0=True).ddof)
    xi1, *_ = controller.improvement_signal(mu, window, 4, lam=0.1, ddof=controller.PipoOptions().ddof)
    # (5 - 2.5) / sqrt(1.25) and (5 - 2.5) / sqrt(5 / 3)
    np.testing.assert_allclose([float(xi0), float(xi1)], [2.5 / np.sqrt(1.25), 2.5 / np.sqrt(5 / 3)], rtol=1e-6)


def test_xi_clip_at_5_and_std_floor_1e_6():
    flat = jnp.zeros((4,))  # std 0 -> 1.0 in both
    xi, c, _, sigma = controller.improvement_signal(7.0, flat, 4, lam=0.1, xi_clip=True)
    assert float(sigma) == 1.0 and float(xi) == 5.0 and float(c) == 5.0
    xi, c, _, _ = controller.improvement_signal(-7.0, flat, 4, lam=0.1, xi_clip=True)
    np.testing.assert_allclose([float(xi), float(c)], [-5.0, -0.5], rtol=1e-6)
    xi, *_ = controller.improvement_signal(7.0, flat, 4, lam=0.1)
    assert float(xi) == 7.0
    # std 5e-7 (ddof 0 of 0, 1e-6, 0, 1e-6): below the authors' floor 1e-6 -> 1.0; above the paper's 1e-8
    tiny = jnp.array([0.0, 1e-6, 0.0, 1e-6])
    _, _, mu_his, sigma_a = controller.improvement_signal(0.1, tiny, 4, lam=0.1, ddof=0, xi_clip=True)
    _, _, _, sigma_p = controller.improvement_signal(0.1, tiny, 4, lam=0.1, ddof=0)
    assert float(sigma_a) == 1.0
    np.testing.assert_allclose(float(sigma_p), 5e-7, rtol=1e-4)  # float32 rounding of 1e-6 and its square


LOGP_OLD = jnp.array([[-1.0, -2.0, -0.5, -1.0]])
NU = np.array([[0.5, 1.1, 1.5, 1.25]])
LOGP = LOGP_OLD + jnp.asarray(np.log(NU), jnp.float32)
MASK = jnp.ones((1, 4))


def test_pi_clip_for_negative_rhat():
    rhat = jnp.array([[-0.3, -0.3, -0.3, 0.4]])

    def loss(lp, **kw):
        return pipo.pi_surrogate_loss(lp, LOGP_OLD, rhat, MASK, agg=Aggregation("token-mean"), **kw)[0]

    # authors: -min(nu, clip(nu, .8, 1.2)) * C: 0.3 * [0.5, 1.1, 1.2] and -0.4 * 1.2 for C = 0.4, nu = 1.25
    authors = jnp.float32((0.15 + 0.33 + 0.36 - 0.48) / 4)
    chex.assert_trees_all_close(loss(LOGP, no_lower_clip=True), authors, rtol=1e-5)
    # paper: max(-C nu, -C clip(nu)): 0.3 * [0.8 (lower clip), 1.1, 1.5], -0.48
    chex.assert_trees_all_close(loss(LOGP), jnp.float32((0.24 + 0.33 + 0.45 - 0.48) / 4), rtol=1e-5)
    # gradient -C nu where nu is not clipped: zero once nu > 1.2 for C < 0, no lower clip
    grad = jax.grad(lambda lp: loss(lp, no_lower_clip=True))(LOGP)
    chex.assert_trees_all_close(grad, jnp.array([[0.15, 0.33, 0.0, 0.0]]) / 4, atol=1e-6)
    # GSPO's PI step (sequence ratio) keeps both clips in the authors' code
    seq = dict(ratio="sequence", ratio_low=1 - 3e-4, ratio_high=1 + 4e-4)
    chex.assert_trees_all_close(loss(LOGP, no_lower_clip=True, **seq), loss(LOGP, **seq))


def test_dapo_pi_step_symmetric_clip():
    """The authors' symmetric PI clip is the upper bound 1 + eps_low (`rl/hyper.py:pi_ratio_bounds`, tested in
    tests/rl/test_hyper.py): with it the loss clips nu = 1.25 at 1.2, with DAPO's 1 + 0.28 it does not."""
    rhat = jnp.array([[0.0, 0.0, 0.0, 1.0]])  # only the nu = 1.25 token counts

    def loss(high, **kw):
        return float(pipo.pi_surrogate_loss(LOGP, LOGP_OLD, rhat, MASK, ratio_low=1 - 0.2, ratio_high=1 + high,
                                            agg=Aggregation("token-mean"), **kw)[0])

    # 0.2 / 0.28: 1.25 is inside [0.8, 1.28] -> -1.25; symmetric 0.2: clipped to 1.2
    np.testing.assert_allclose([loss(0.28), loss(0.2)], [-1.25 / 4, -1.2 / 4], rtol=1e-6)


def test_rhat_clamp_before_the_rectifier():
    attr, mask = jnp.array([[3.0, -4.0, 0.5]]), jnp.ones((1, 3))
    up = pipo.pi_rewards(attr, 4.0, mask, xi=4.0, lam=0.1, clamp=True)
    chex.assert_trees_all_close(up, jnp.array([[10.0, -10.0, 2.0]]))  # clamp(a * 4, -10, 10)
    down = pipo.pi_rewards(attr, -0.4, mask, xi=-4.0, lam=0.1, clamp=True)
    # clamp([-12, 16, -2]) = [-10, 10, -2], then the loss scale lam = 0.1 of xi < 0
    chex.assert_trees_all_close(down, jnp.array([[-1.0, 1.0, -0.2]]), rtol=1e-6)
    chex.assert_trees_all_close(pipo.pi_rewards(attr, -0.4, mask), jnp.array([[-1.2, 1.6, -0.2]]), rtol=1e-6)


def _full_state(window):
    state = controller.init_pipo_state(len(window), _batch())
    for mu in window:
        state = controller.push(state, mu, _batch(mu))
    return state


def test_lam_zero_skips_and_xi_zero_runs():
    state = _full_state([1.0, 2.0, 3.0, 4.0])  # mean 2.5
    for options in (controller.PipoOptions(), AUTHORS):
        rhat, m = controller.pi_verification(state, 2.0, lam=0.0, options=options)  # xi < 0, lam = 0: c = 0
        assert float(m["c"]) == 0.0 and not bool(m["pi_step_applied"]) and not np.any(np.asarray(rhat))
    # xi == 0 exactly (mu_t = mean): the authors' gate returns (True, 1.0): a step with zero coefficients
    _, m = controller.pi_verification(state, 2.5, lam=0.1, options=AUTHORS)
    assert float(m["xi"]) == 0.0 and bool(m["pi_step_applied"])
    _, m = controller.pi_verification(state, 2.5, lam=0.1, options=controller.pipo_options(run_at_xi_zero=True))
    assert bool(m["pi_step_applied"])
    _, m = controller.pi_verification(state, 2.5, lam=0.1)
    assert not bool(m["pi_step_applied"])
    # lam > 0 and xi < 0: both run, the authors' rewards clamped then scaled by lam
    rhat, m = controller.pi_verification(state, 1.0, lam=0.1, options=AUTHORS)
    xi = (1.0 - 2.5) / np.sqrt(1.25)  # ddof 0
    np.testing.assert_allclose(float(m["xi"]), xi, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(rhat), np.array([[1.0] * 3, [-1.0] * 3]) * xi * 0.1, rtol=1e-5)


def test_attribution_eps_added():
    adv = jnp.array([[1e-6], [0.0], [2.0], [-3.0]])
    mask = jnp.ones((4, 1))
    # group 0: sum |abar| = 1e-6: max(1e-6, 1e-6) -> 2 * 1e-6 / 1e-6 = 2; authors 2 * 1e-6 / 2e-6 = 1
    paper = pipo.group_attribution(adv, mask, 2)[:, 0]
    authors = pipo.group_attribution(adv, mask, 2, additive_eps=True)[:, 0]
    chex.assert_trees_all_close(paper, jnp.array([2.0, 0.0, 0.8, -1.2]), rtol=1e-5)
    chex.assert_trees_all_close(authors, jnp.array([1.0, 0.0, 4.0 / (5 + 1e-6), -6.0 / (5 + 1e-6)]), rtol=1e-5)


def test_options_one_by_one():
    assert controller.pipo_options() == controller.PipoOptions() and not any(controller.PipoOptions())
    assert all(AUTHORS) and AUTHORS.ddof == 0
    one = controller.pipo_options(rhat_clamp=True)
    assert one.rhat_clamp and sum(one) == 1 and one.ddof == 1
    with pytest.raises(ValueError, match="unknown PIPO behaviour 'clamp'"):
        controller.pipo_options(clamp=True)
