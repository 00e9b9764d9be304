"""PIPO controller: window statistics, xi, rectifier, attributions, state and the scan loop."""

import collections
import statistics

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.losses import pipo
from pipo_jax.losses.aggregation import Aggregation
from pipo_jax.losses.policy import gspo_loss, token_clip_loss
from pipo_jax.rl import controller
from pipo_jax.rl.batch import TrainBatch

K = 4


def make_batch(seed: float, b: int = 4, t: int = 3, l: int = 5) -> TrainBatch:
    base = jnp.arange(b * t, dtype=jnp.float32).reshape(b, t)
    return TrainBatch(
        tokens_bl=(jnp.arange(b * l).reshape(b, l) + int(seed)) % 17,
        mask_bl=jnp.ones((b, l), jnp.int32),
        mask_br=jnp.ones((b, t), jnp.float32).at[0, 2].set(0.0),
        logp_old_br=-0.1 * base - seed,
        logp_ref_br=-0.2 * base - seed,
        attr_br=base * 0.0 + seed,
    )


def test_improvement_signal_hand_computed():
    w = jnp.array([1.0, 2.0, 3.0, 4.0])
    sd1 = np.sqrt(5 / 3)  # mean 2.5, squared deviations sum to 5
    xi, c, mu_his, sigma = controller.improvement_signal(5.0, w, 4, lam=0.1, ddof=1)
    chex.assert_trees_all_close((xi, c, mu_his, sigma), tuple(jnp.float32(x) for x in (2.5 / sd1, 2.5 / sd1, 2.5, sd1)),
                                rtol=1e-6)
    xi, c, _, _ = controller.improvement_signal(2.0, w, 4, lam=0.1, ddof=1)
    chex.assert_trees_all_close((xi, c), (jnp.float32(-0.5 / sd1), jnp.float32(-0.05 / sd1)), rtol=1e-6)
    xi, c, _, sigma = controller.improvement_signal(5.0, w, 4, lam=0.1, ddof=0)  # compat: population std
    chex.assert_trees_all_close((xi, sigma), (jnp.float32(2.5 / np.sqrt(1.25)), jnp.float32(np.sqrt(1.25))), rtol=1e-6)
    xi, c, _, _ = controller.improvement_signal(2.5, w, 4, lam=0.1, ddof=1)
    assert float(xi) == 0.0 and float(c) == 0.0
    _, c, _, _ = controller.improvement_signal(2.0, w, 4, lam=0.0, ddof=1)
    assert float(c) == 0.0  # lam = 0: reinforce-only


def test_window_statistics_direct():
    mu, sd = controller.window_statistics([9.0, 1.0, 2.0, 6.0], 3, ddof=1)  # valid: last three
    chex.assert_trees_all_close((mu, sd), (jnp.float32(3.0), jnp.float32(np.sqrt(7.0))), rtol=1e-6)
    mu, sd = controller.window_statistics(jnp.array([9.0, 1.0, 2.0, 6.0]), 3, ddof=0)
    chex.assert_trees_all_close(sd, jnp.float32(np.sqrt(14.0 / 3)), rtol=1e-6)
    _, sd = controller.window_statistics(jnp.array([9.0, 1.0, 2.0, 6.0]), 1, ddof=1)
    assert float(sd) == 0.0  # one entry has no spread; improvement_signal then falls back to 1
    with pytest.raises(ValueError, match="ddof=2"):
        controller.improvement_signal(0.0, jnp.zeros(4), 4, ddof=2)


def test_rectifier_branches():
    chex.assert_trees_all_close(controller.rectify(jnp.array([2.0, 0.0, -3.0]), 0.1), jnp.array([2.0, 0.0, -0.3]))
    chex.assert_trees_all_close(controller.rectify(jnp.array([-3.0]), 1.0), jnp.array([-3.0]))


def test_sigma_fallback():
    xi, _, mu_his, sigma = controller.improvement_signal(3.5, jnp.full((K,), 3.0), K, lam=0.1, ddof=1)
    assert float(sigma) == 1.0 and float(mu_his) == 3.0
    chex.assert_trees_all_close(xi, jnp.float32(0.5))
    tiny = jnp.array([1.0, 1.0 + 1e-9, 1.0, 1.0])  # std < 1e-8
    _, _, _, sigma = controller.improvement_signal(1.0, tiny, K, lam=0.1, ddof=1)
    assert float(sigma) == 1.0
    _, _, _, sigma = controller.improvement_signal(1.0, jnp.array([0.0, 0.0, 0.0, 1e-3]), K, lam=0.1, ddof=1)
    assert float(sigma) == pytest.approx(5e-4, rel=1e-5)  # above the floor: no fallback


@pytest.mark.parametrize("rows", [8, 32, 96, 256])
@pytest.mark.parametrize("ddof, xi_clip", [(1, False), (0, True)])
def test_every_constant_window_of_batch_means_reads_sigma_zero(rows, ddof, xi_clip):
    # Batch means of 0/1 rewards are k / rows; a window of K equal ones (not exactly representable
    # in float32 for most k) once gave xi ~ 3e6 from a rounding-noise std of ~3e-8. Exact: the
    # fallback sigma 1.0 and xi = mu_t - k/rows, here checked in float64 for every k.
    k_all = np.arange(rows + 1)
    mu_k = (k_all / rows).astype(np.float32)
    windows = jnp.asarray(np.repeat(mu_k[:, None], 8, axis=1))
    mu_t = np.float32(0.5)
    signal = jax.vmap(lambda w: controller.improvement_signal(mu_t, w, 8, lam=0.1, ddof=ddof, xi_clip=xi_clip))
    xi, c, mu_his, sigma = map(np.asarray, signal(windows))
    np.testing.assert_array_equal(sigma, np.ones(rows + 1, np.float32))
    np.testing.assert_array_equal(mu_his, mu_k)  # the mean of equal entries is that entry
    expected = np.float64(mu_t) - mu_k.astype(np.float64)
    np.testing.assert_allclose(xi, expected, rtol=0, atol=1e-7)
    np.testing.assert_allclose(c, np.where(expected >= 0, expected, 0.1 * expected), rtol=0, atol=1e-7)
    # The paper's example: 0.5 against a window of 0.4s reads xi = 0.1.
    xi, _, _, _ = controller.improvement_signal(0.5, jnp.full((8,), 0.4), 8, lam=0.1)
    assert float(xi) == pytest.approx(0.1, abs=1e-7)


def test_window_statistics_match_float64_on_random_windows():
    rng = np.random.default_rng(0)
    for count in (2, 5, 8):
        w = rng.uniform(0, 1, size=(50, 8)).astype(np.float32)
        mu, sd = jax.vmap(lambda x: controller.window_statistics(x, count, ddof=1))(jnp.asarray(w))
        valid = w[:, 8 - count:].astype(np.float64)
        np.testing.assert_allclose(mu, valid.mean(1), rtol=0, atol=1e-6)
        np.testing.assert_allclose(sd, valid.std(1, ddof=1), rtol=1e-5, atol=1e-7)


def test_warm_up_gives_no_signal_until_k_means():
    w = jnp.array([0.0, 1.0, 2.0, 3.0])  # count 3: valid entries are the last three
    xi, c, mu_his, sigma = controller.improvement_signal(10.0, w, 3, lam=0.1, ddof=1)
    assert float(xi) == 0.0 and float(c) == 0.0
    chex.assert_trees_all_close((mu_his, sigma), (jnp.float32(2.0), jnp.float32(1.0)))
    xi, _, mu_his, _ = controller.improvement_signal(10.0, w, 0, lam=0.1, ddof=1)
    assert float(xi) == 0.0 and float(mu_his) == 0.0
    state = controller.init_pipo_state(K, make_batch(0.0))
    for i in range(K):
        xi, c, _, _ = controller.improvement_signal(100.0, state.mu_window_k, state.count, lam=0.1, ddof=1)
        assert float(c) == 0.0 and not bool(controller.pi_step_ready(state, c))
        state = controller.push(state, float(i), make_batch(float(i)))
    xi, c, _, _ = controller.improvement_signal(100.0, state.mu_window_k, state.count, lam=0.1, ddof=1)
    assert float(c) > 0 and bool(controller.pi_step_ready(state, c))


def test_push_wrap_around_and_state_fields():
    state = controller.init_pipo_state(K, make_batch(0.0))
    assert int(state.count) == 0 and not bool(state.has_prev) and state.window_size == K
    for i in range(1, 7):
        state = controller.push(state, float(i), make_batch(float(i)))
    np.testing.assert_array_equal(state.mu_window_k, [3.0, 4.0, 5.0, 6.0])
    assert int(state.count) == K and bool(state.has_prev)
    chex.assert_trees_all_close(state.prev, make_batch(6.0))
    chex.assert_trees_all_equal_shapes_and_dtypes(state.prev, make_batch(0.0))


def test_pi_step_ready_and_compat_for_c_zero():
    state = controller.init_pipo_state(K, make_batch(0.0))
    for i in range(K):
        state = controller.push(state, float(i), make_batch(float(i)))
    assert bool(controller.pi_step_ready(state, jnp.float32(0.3)))
    assert not bool(controller.pi_step_ready(state, jnp.float32(0.0)))
    assert bool(controller.pi_step_ready(state, jnp.float32(0.0), jnp.float32(0.0), run_at_xi_zero=True))
    no_prev = state.replace(has_prev=jnp.zeros((), bool))
    assert not bool(controller.pi_step_ready(no_prev, jnp.float32(0.3), jnp.float32(0.3), run_at_xi_zero=True))
    assert controller.pipo_options(False) == controller.PipoOptions() and controller.pipo_options(False).ddof == 1
    assert all(controller.pipo_options(True)) and controller.pipo_options(True).ddof == 0


def test_push_errors_name_the_field():
    state = controller.init_pipo_state(K, make_batch(0.0))
    bad = make_batch(1.0).replace(logp_old_br=jnp.zeros((4, 7)))
    with pytest.raises(ValueError, match=r"logp_old_br.*\(4, 7\).*\(4, 3\)"):
        controller.push(state, 1.0, bad)
    extra = make_batch(1.0).replace(attr_br={"attr_br": jnp.ones((4, 3)), "teacher_tokens_bq": jnp.ones((4, 2))})
    with pytest.raises(ValueError, match="teacher_tokens_bq"):
        controller.push(state, 1.0, extra)
    with pytest.raises(TypeError, match="TrainBatch"):
        controller.push(state, 1.0, {"tokens_bl": 1})
    with pytest.raises(ValueError, match="window_size K=0"):
        controller.init_pipo_state(0, make_batch(0.0))
    cast = controller.push(state, 1.0, make_batch(1.0).replace(logp_ref_br=jnp.zeros((4, 3), jnp.bfloat16)))
    assert cast.prev.logp_ref_br.dtype == jnp.float32


def test_init_from_shape_dtype_structs():
    template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), make_batch(0.0))
    state = controller.init_pipo_state(3, template)
    chex.assert_trees_all_close(state.prev, jax.tree.map(jnp.zeros_like, make_batch(0.0)))


def test_group_attribution_hand_computed():
    adv = jnp.array([[1.0, 3.0, 100.0], [-3.0, -3.0, -3.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = jnp.array([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0]])
    a = pipo.group_attribution(adv, mask, 2)
    # group 0: abar = [2, -3], sum |abar| = 5 -> a = 2 * [2, -3] / 5; group 1: all zero -> 0 (floor 1e-6)
    expected = jnp.array([[0.8, 0.8, 0.0], [-1.2, -1.2, -1.2], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    chex.assert_trees_all_close(a, expected, rtol=1e-6)
    rng = np.random.default_rng(0)
    adv = jnp.asarray(rng.normal(size=(12, 1)), jnp.float32) * jnp.ones((1, 5))
    a_b = pipo.group_attribution(adv, jnp.ones((12, 5)), 4)[:, 0]
    chex.assert_trees_all_close(jnp.abs(a_b).reshape(3, 4).sum(-1), jnp.full((3,), 4.0), rtol=1e-5)
    with pytest.raises(ValueError, match="group_size=5"):
        pipo.group_attribution(adv, jnp.ones((12, 5)), 5)


def test_gae_attribution_and_pi_rewards():
    adv = jnp.array([[0.5, -1.0, 9.0]])
    mask = jnp.array([[1, 1, 0]])
    chex.assert_trees_all_close(pipo.gae_attribution(adv, mask), jnp.array([[0.5, -1.0, 0.0]]))
    chex.assert_trees_all_close(pipo.pi_rewards(adv, -0.2, mask), jnp.array([[-0.1, 0.2, 0.0]]))


def test_pi_surrogate_loss_is_eq11():
    logp_old = jnp.array([[-1.0, -2.0, -0.5, -1.0]])
    logp = logp_old + jnp.log(jnp.array([[1.5, 0.5, 0.5, 1.1]]))
    rhat = jnp.array([[0.4, 0.4, -0.3, -0.3]])
    mask = jnp.ones((1, 4))
    loss, _ = pipo.pi_surrogate_loss(logp, logp_old, rhat, mask, agg=Aggregation("token-mean"))
    # -min(nu r, clip(nu) r): -0.48, -0.2, 0.24 (lower clip), 0.33
    chex.assert_trees_all_close(loss, jnp.float32((-0.48 - 0.2 + 0.24 + 0.33) / 4), rtol=1e-5)
    loss_c, _ = pipo.pi_surrogate_loss(logp, logp_old, rhat, mask, agg=Aggregation("token-mean"), no_lower_clip=True)
    chex.assert_trees_all_close(loss_c, jnp.float32((-0.48 - 0.2 + 0.15 + 0.33) / 4), rtol=1e-5)
    ref, _ = token_clip_loss(logp, logp_old, rhat, mask, clip_ratio_c=0.0, agg=Aggregation("token-mean"))
    chex.assert_trees_all_close(loss, ref)
    seq, _ = pipo.pi_surrogate_loss(logp, logp_old, rhat, mask, ratio="sequence", ratio_low=1 - 3e-4,
                                    ratio_high=1 + 4e-4,
                                    agg=Aggregation("seq-mean-token-mean"))
    chex.assert_trees_all_close(seq, gspo_loss(logp, logp_old, rhat, mask)[0])
    with pytest.raises(ValueError, match="ratio='seq'"):
        pipo.pi_surrogate_loss(logp, logp_old, rhat, mask, ratio="seq", agg=Aggregation("token-mean"))


def test_pi_verification_combines_the_steps():
    state = controller.init_pipo_state(K, make_batch(0.0))
    for i, mu in enumerate([1.0, 2.0, 3.0, 4.0]):
        state = controller.push(state, mu, make_batch(float(i + 1)))
    rhat, m = controller.pi_verification(state, 5.0, lam=0.1)
    c = 2.5 / np.sqrt(5 / 3)
    chex.assert_trees_all_close(m["c"], jnp.float32(c), rtol=1e-6)
    assert bool(m["pi_step_applied"])
    chex.assert_trees_all_close(rhat, state.prev.attr_br * state.prev.mask_br * c, rtol=1e-6)
    rhat, m = controller.pi_verification(state, 2.5)
    assert not bool(m["pi_step_applied"]) and float(jnp.abs(rhat).sum()) == 0.0


def test_scan_of_20_iterations_matches_python_loop():
    rng = np.random.default_rng(7)
    mus = rng.normal(size=20).astype(np.float32)
    mus[9:13] = 0.25  # a flat stretch exercises the sigma fallback inside the scan
    batches = [make_batch(float(i)) for i in range(20)]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *batches)

    def step(state, inputs):
        mu, batch = inputs
        xi, c, mu_his, sigma = controller.improvement_signal(mu, state.mu_window_k, state.count, lam=0.1, ddof=1)
        ready = controller.pi_step_ready(state, c)
        return controller.push(state, mu, batch), (xi, c, mu_his, sigma, ready)

    final, (xi, c, mu_his, sigma, ready) = jax.jit(lambda s, x: jax.lax.scan(step, s, x))(
        controller.init_pipo_state(K, batches[0]), (jnp.asarray(mus), stacked))

    window = collections.deque(maxlen=K)
    for t, mu in enumerate(mus.astype(np.float64)):
        if len(window) == K:
            m_his, sd = statistics.fmean(window), statistics.stdev(window)
            sd = 1.0 if sd < 1e-8 else sd
            x = (mu - m_his) / sd
            exp = (x, x if x >= 0 else 0.1 * x, m_his, sd, x != 0)
        else:
            exp = (0.0, 0.0, None, None, False)
        assert float(xi[t]) == pytest.approx(exp[0], rel=1e-4, abs=1e-5), t
        assert float(c[t]) == pytest.approx(exp[1], rel=1e-4, abs=1e-5), t
        if exp[2] is not None:
            assert float(mu_his[t]) == pytest.approx(exp[2], rel=1e-5, abs=1e-6), t
            assert float(sigma[t]) == pytest.approx(exp[3], rel=1e-4, abs=1e-6), t
        assert bool(ready[t]) == exp[4], t
        window.append(mu)
    assert bool(jnp.any(sigma[4:] == 1.0))  # the fallback branch ran
    np.testing.assert_allclose(final.mu_window_k, mus[-K:])
    chex.assert_trees_all_close(final.prev, batches[-1])
