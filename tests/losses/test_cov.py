"""KL-Cov and Clip-Cov (docs/math.md §1 "KL-Cov and Clip-Cov", `losses/cov.py`): hand-computed values
and gradients, and a numpy transcription of the paper's selection (the authors' verl code: centred
covariance over the valid tokens, top max(floor(k N), 1) for KL-Cov; for Clip-Cov a uniform draw of
max(floor(r N), 1) among the unclipped tokens with covariance in [omega_low, omega_high])."""

import importlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.losses import cov
from pipo_jax.losses.aggregation import Aggregation
from pipo_jax.rl.spec import ConfigError
from tests.typed import spec_of

AGG = Aggregation("token-mean")

# one response of 4 tokens: mean logp = -2, mean A = 1; cov_t = (logp_t + 2)(A_t - 1)
LOGP = jnp.array([[-1.0, -3.0, -1.0, -3.0]])
ADV_KL = jnp.array([[3.0, 0.0, 0.0, 1.0]])  # cov = (1)(2), (-1)(-1), (1)(-1), (-1)(0) = 2, 1, -1, 0
ADV_CLIP = jnp.array([[3.0, -1.0, 0.0, 2.0]])  # cov = 2, (-1)(-2) = 2, -1, (-1)(1) = -1
MASK = jnp.ones((1, 4))


def cov_reference(logp, adv, mask):
    v = mask > 0
    return np.where(v, (logp - logp[v].mean()) * (adv - adv[v].mean()), -np.inf)


def kl_cov_reference(logp, old, adv, mask, ratio, coef):
    """The authors' loop: -A r everywhere, + coef |logp - logp_old| on the top-k covariance tokens; token-mean."""
    logp, old, adv, mask = (np.asarray(x, np.float64) for x in (logp, old, adv, mask))
    loss = (-adv * np.exp(logp - old)).reshape(-1)
    valid = np.nonzero(mask.reshape(-1) > 0)[0]
    c = cov_reference(logp, adv, mask).reshape(-1)[valid]
    k = max(1, int(len(c) * ratio))
    top = valid[np.argsort(-c, kind="stable")[:k]]
    loss[top] += coef * np.abs(logp - old).reshape(-1)[top]
    return (loss * mask.reshape(-1)).sum() / mask.sum()


def test_token_covariance_by_hand():
    chex.assert_trees_all_close(cov.token_covariance(LOGP, ADV_KL, MASK), jnp.array([[2.0, 1.0, -1.0, 0.0]]))
    padded = cov.token_covariance(jnp.array([[-1.0, 7.0, -3.0]]), jnp.array([[2.0, 9.0, 0.0]]),
                                  jnp.array([[1.0, 0.0, 1.0]]))  # means over the valid tokens only: -2, 1
    chex.assert_trees_all_close(padded, jnp.array([[1.0, -jnp.inf, 1.0]]))


def test_kl_cov_by_hand():
    """k = 0.25: one token, the first (cov 2); beta = 2; L = (-3 e^0.1 + 2 x 0.1 - 0 - 0 - 1 x e^0) / 4."""
    d = jnp.array([[0.1, 0.2, -0.3, 0.0]])
    loss_fn = lambda lp: cov.kl_cov_loss(lp, LOGP - d, ADV_KL, MASK, agg=AGG, ratio=0.25, coef=2.0)  # noqa: E731
    (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(LOGP)
    np.testing.assert_allclose(float(loss), (-3 * np.exp(0.1) + 0.2 - 1.0) / 4, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["cov_frac"]), 0.25)
    # d/dlogp: -A r (+ beta sign(d) on the selected token); the selection itself has no gradient
    chex.assert_trees_all_close(grad, jnp.array([[(-3 * np.exp(0.1) + 2.0) / 4, 0.0, 0.0, -0.25]]), rtol=1e-6)
    # k = 0.5: tokens 0 and 1 (cov 2 and 1); token 1's A = 0, so only its penalty 2 x 0.2 is added
    loss2, _ = cov.kl_cov_loss(LOGP, LOGP - d, ADV_KL, MASK, agg=AGG, ratio=0.5, coef=2.0)
    np.testing.assert_allclose(float(loss2), (-3 * np.exp(0.1) + 0.2 + 0.4 - 1.0) / 4, rtol=1e-6)


@pytest.mark.parametrize("ratio", [1e-3, 0.1, 0.3, 1.0])
def test_kl_cov_equals_numpy_transcription(ratio):
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    logp = -jax.random.uniform(k[0], (6, 9), minval=0.1, maxval=4.0)
    old = logp + 0.2 * jax.random.normal(k[1], logp.shape)
    adv = jax.random.normal(k[2], (6, 1)) * jnp.ones((6, 9))
    mask = (jnp.arange(9)[None] < jnp.array([9, 3, 7, 1, 9, 5])[:, None]).astype(jnp.float32)
    loss, metrics = cov.kl_cov_loss(logp, old, adv, mask, agg=AGG, ratio=ratio, coef=1.0)
    want = kl_cov_reference(logp, old, adv, mask, ratio, 1.0)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    n = int(mask.sum())
    np.testing.assert_allclose(float(metrics["cov_frac"]), max(1, int(n * ratio)) / n, rtol=1e-6)


def test_clip_cov_by_hand():
    """Candidates: cov in [1, 5] and unclipped. Token 1 (cov 2) is clipped (A = -1, r = e^-0.5 < 0.8), so
    token 0 is the only one and is left out for every key: L = (0 + 0.8 + 0 - 2 e^0.05) / 4."""
    d = jnp.array([[0.1, -0.5, 0.0, 0.05]])
    for seed in range(8):
        loss_fn = lambda lp: cov.clip_cov_loss(lp, LOGP - d, ADV_CLIP, MASK, key=jax.random.PRNGKey(seed),  # noqa: B023,E731
                                               agg=AGG, ratio=0.25)
        (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(LOGP)
        np.testing.assert_allclose(float(loss), (0.8 - 2 * np.exp(0.05)) / 4, rtol=1e-6)
        chex.assert_trees_all_close(grad, jnp.array([[0.0, 0.0, 0.0, -2 * np.exp(0.05) / 4]]), rtol=1e-6)
        np.testing.assert_allclose(float(metrics["cov_frac"]), 0.25)
        np.testing.assert_allclose(float(metrics["pg_clipfrac"]), 0.25)
    # without the selection (bounds that no covariance meets) token 0 keeps -3 e^0.1
    loss, metrics = cov.clip_cov_loss(LOGP, LOGP - d, ADV_CLIP, MASK, key=jax.random.PRNGKey(0), agg=AGG,
                                      ratio=0.25, cov_low=10.0, cov_high=20.0)
    np.testing.assert_allclose(float(loss), (-3 * np.exp(0.1) + 0.8 - 2 * np.exp(0.05)) / 4, rtol=1e-6)
    assert float(metrics["cov_frac"]) == 0.0


def test_clip_cov_draws_uniformly_with_the_key():
    """Tokens 0 and 1 (cov 2, 2) both unclipped: one of them (k = 1) is drawn; over 64 keys each is drawn
    about half the time, and the same key draws the same token."""
    d = jnp.array([[0.1, -0.1, 0.0, 0.05]])
    loss_fn = lambda lp, key: cov.clip_cov_loss(lp, LOGP - d, ADV_CLIP, MASK, key=key, agg=AGG, ratio=0.25)[0]  # noqa: E731
    grad = jax.jit(jax.grad(loss_fn))
    picks = []
    for seed in range(64):
        g = np.asarray(grad(LOGP, jax.random.PRNGKey(seed)))[0]
        left_out = [t for t in (0, 1) if g[t] == 0.0]
        assert len(left_out) == 1 and g[3] != 0.0
        picks.append(left_out[0])
    assert 16 <= picks.count(0) <= 48, picks.count(0)
    again = np.asarray(grad(LOGP, jax.random.PRNGKey(5)))[0]
    assert (again[:2] == 0.0).tolist() == [picks[5] == 0, picks[5] == 1]


def test_clip_cov_selection_against_numpy():
    """A random batch: the left-out tokens (zero gradient although unclipped and A != 0) are candidates of
    the numpy transcription, there are min(max(floor(r N), 1), #candidates) of them, and the loss is the
    token clip over the others."""
    k = jax.random.split(jax.random.PRNGKey(1), 4)
    logp = -jax.random.uniform(k[0], (8, 12), minval=0.1, maxval=6.0)
    old = logp + 0.1 * jax.random.normal(k[1], logp.shape)
    adv = 2.0 * jax.random.normal(k[2], (8, 1)) * jnp.ones((8, 12))
    mask = (jnp.arange(12)[None] < jnp.array([12, 4, 9, 12, 2, 7, 12, 10])[:, None]).astype(jnp.float32)
    ratio, low, high = 0.1, 0.5, 3.0
    fn = lambda lp: cov.clip_cov_loss(lp, old, adv, mask, key=k[3], agg=AGG, ratio=ratio, cov_low=low,  # noqa: E731
                                      cov_high=high)
    (loss, _), grad = jax.value_and_grad(fn, has_aux=True)(logp)
    lp, o, a, m = (np.asarray(x, np.float64) for x in (logp, old, adv, mask))
    r = np.exp(lp - o)
    unclipped, clipped = -a * r, -a * np.clip(r, 0.8, 1.2)
    is_clipped = clipped > unclipped
    c = cov_reference(lp, a, m)
    candidates = (m > 0) & ~is_clipped & (c >= low) & (c <= high)
    left_out = (np.asarray(grad) == 0.0) & (m > 0) & ~is_clipped
    n = int(m.sum())
    assert candidates.sum() > max(1, int(ratio * n))  # a draw happens
    assert not (left_out & ~candidates).any()
    assert left_out.sum() == min(max(1, int(ratio * n)), candidates.sum())
    want = (np.where(left_out, 0.0, np.maximum(unclipped, clipped)) * m).sum() / n
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)


def test_cov_settings_are_checked():
    with pytest.raises(ValueError, match=r"cov ratio=0.0 must be in \(0, 1\]"):
        cov.kl_cov_loss(LOGP, LOGP, ADV_KL, MASK, agg=AGG, ratio=0.0)
    with pytest.raises(ValueError, match=r"cov bounds \[5.0, 1.0\]"):
        cov.clip_cov_loss(LOGP, LOGP, ADV_KL, MASK, key=jax.random.PRNGKey(0), agg=AGG, cov_low=5.0, cov_high=1.0)


def test_clip_cov_at_the_released_scripts_clip():
    """The authors' scripts' clip_ratio_low = clip_ratio_high = 1: ratio bounds [0, 2]. No ratio falls to 0,
    so token 1 (A = -1, r = e^-0.5 ~ 0.61, clipped at 0.8 under eps_low 0.2) keeps -A r and its gradient
    r / 4; token 3 (A = 2, r = e^0.8 ~ 2.23) is clipped at 2. Bounds no covariance meets: no token left out."""
    d = jnp.array([[0.1, -0.5, 0.0, 0.8]])
    kw = dict(key=jax.random.PRNGKey(0), agg=AGG, ratio=0.25, cov_low=10.0, cov_high=20.0)

    def loss_fn(lp, low):
        return cov.clip_cov_loss(lp, LOGP - d, ADV_CLIP, MASK, ratio_low=low, ratio_high=2.0, **kw)

    (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(LOGP, 1.0 - 1.0)
    np.testing.assert_allclose(float(loss), (-3 * np.exp(0.1) + np.exp(-0.5) - 2 * 2.0) / 4, rtol=1e-6)
    chex.assert_trees_all_close(grad, jnp.array([[-3 * np.exp(0.1) / 4, np.exp(-0.5) / 4, 0.0, 0.0]]), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["pg_clipfrac"]), 0.25)  # token 3 only
    (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(LOGP, 1.0 - 0.2)
    np.testing.assert_allclose(float(loss), (-3 * np.exp(0.1) + 0.8 - 2 * 2.0) / 4, rtol=1e-6)
    assert float(grad[0, 1]) == 0.0 and float(metrics["pg_clipfrac"]) == 0.5
    # with [omega_low, omega_high] = [1, 5] token 1 (cov 2) is now a candidate beside token 0: each key
    # leaves out one of the two
    losses = {round(float(cov.clip_cov_loss(LOGP, LOGP - d, ADV_CLIP, MASK, key=jax.random.PRNGKey(s), agg=AGG,
                                            ratio=0.25, ratio_low=0.0, ratio_high=2.0)[0]), 6) for s in range(16)}
    assert losses == {round((np.exp(-0.5) - 4.0) / 4, 6), round((-3 * np.exp(0.1) - 4.0) / 4, 6)}


def test_clip_cov_config_takes_the_released_clip():
    """`loss.clip_low=1` (eps_low = 1, the ratio bound 0) is a valid setting; above 1 it is refused."""
    c = importlib.import_module("configs.clip_cov").get_config("micro")
    c.loss.clip_low, c.loss.clip_high = 1.0, 1.0
    spec = spec_of(c)
    assert (spec.loss.clip_low, spec.loss.clip_high) == (1.0, 1.0)
    c.loss.clip_low = 1.5
    with pytest.raises(ConfigError, match=r"config\.loss\.clip_low: 1\.5 must be in \[0, 1\]"):
        spec_of(c)
