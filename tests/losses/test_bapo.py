"""BAPO (docs/math.md §1 "BAPO", `losses/bapo.py`): Algorithm 1's path of bounds, a batch computed by hand
(with and without Eq. 8's pi_old(y_t) weight), and a numpy transcription of Eq. 8 and Algorithm 1's loop
(a literal while loop) with the clipped surrogate at the bounds it stops at; the released code's search
(`loss.bapo.variant=released_code`) by hand and against a transcription of its loops; the dual clip."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.losses.aggregation import Aggregation
from pipo_jax.losses.bapo import bapo_loss, bound_path, released_code_path
from pipo_jax.rl.spec import ConfigError
from tests.typed import spec_of

TOKEN_MEAN = Aggregation("token-mean")
PAPER = dict(lower_start=0.6, lower_max=0.9, lower_step=0.02, upper_start=1.2, upper_max=3.0, upper_step=0.05)
SMALL = dict(lower_start=0.6, lower_max=0.8, lower_step=0.1, upper_start=1.2, upper_max=1.6, upper_step=0.2)


def algorithm_1(ratio, adv, weight, mask, rho_0, lower_start, lower_max, lower_step, upper_start, upper_max,
                upper_step):
    """Algorithm 1 as the paper writes it, in float64: (c_low, c_high, rho) where the loop stops."""
    ratio, adv, weight, mask = (np.asarray(x, np.float64) for x in (ratio, adv, weight, mask))

    def share(c_low, c_high):  # Eq. 8: |sum_{A>0} w min(rA, clip(r) A)| / sum_t |w min(rA, clip(r) A)|
        term = weight * np.minimum(ratio * adv, np.clip(ratio, c_low, c_high) * adv) * mask
        pos, total = abs(term[adv > 0].sum()), np.abs(term).sum()
        return pos / total if total > 0 else 1.0

    c_low, c_high, eps = lower_start, upper_start, 1e-9
    while share(c_low, c_high) < rho_0 and c_low + lower_step <= lower_max + eps:
        if c_high + upper_step <= upper_max + eps:
            c_high += upper_step
        else:
            c_low += lower_step
    return c_low, c_high, share(c_low, c_high)


def clip_loss(ratio, adv, mask, c_low, c_high):
    ratio, adv, mask = (np.asarray(x, np.float64) for x in (ratio, adv, mask))
    loss = np.maximum(-adv * ratio, -adv * np.clip(ratio, c_low, c_high))
    return (loss * mask).sum() / mask.sum()


def test_bound_path_is_algorithm_1s_states():
    lows, highs = bound_path(**PAPER)
    assert len(lows) == 36 + 15 + 1  # c_high: 1.2 -> 3.0 in 36 steps of 0.05, then c_low: 0.6 -> 0.9 in 15 of 0.02
    np.testing.assert_allclose(highs[:37], 1.2 + 0.05 * np.arange(37))
    np.testing.assert_allclose(lows[:37], 0.6)
    np.testing.assert_allclose(highs[37:], 3.0)
    np.testing.assert_allclose(lows[36:], 0.6 + 0.02 * np.arange(16))
    lows, highs = bound_path(**SMALL)
    np.testing.assert_allclose(np.stack([lows, highs], 1), [[0.6, 1.2], [0.6, 1.4], [0.6, 1.6], [0.7, 1.6], [0.8, 1.6]])
    # no lower step fits: the loop's guard c_low + delta_2 <= b- never holds, nothing moves
    lows, highs = bound_path(**dict(SMALL, lower_max=0.65))
    assert (list(lows), list(highs)) == ([0.6], [1.2])


def _hand_batch():
    """Row 0: A = +1, ratios 2 and 0.5, pi_old 0.5; row 1: A = -1, ratios 0.5 and 1, pi_old 0.25."""
    old = jnp.log(jnp.array([[0.5, 0.5], [0.25, 0.25]]))
    logp = old + jnp.log(jnp.array([[2.0, 0.5], [0.5, 1.0]]))
    adv = jnp.array([[1.0, 1.0], [-1.0, -1.0]])
    return logp, old, adv, jnp.ones((2, 2))


@pytest.mark.parametrize("rho, weighted, want_bounds, want_share, want_loss", [
    # unweighted: P = c_high + 0.5, N = c_low + 1; rho along the path 1.7/3.3, 1.9/3.5, 2.1/3.7, 2.1/3.8, 2.1/3.9
    (0.5, False, (0.6, 1.2), 1.7 / 3.3, (-1.2 - 0.5 + 0.6 + 1.0) / 4),
    (0.55, False, (0.6, 1.6), 2.1 / 3.7, (-1.6 - 0.5 + 0.6 + 1.0) / 4),
    (0.6, False, (0.8, 1.6), 2.1 / 3.9, (-1.6 - 0.5 + 0.8 + 1.0) / 4),  # never met: the path's last state
    # weighted by pi_old: P = 0.5 (c_high + 0.5), N = 0.25 (c_low + 1): 0.85 / 1.25 at the start
    (0.6, True, (0.6, 1.2), 0.85 / 1.25, (-1.2 - 0.5 + 0.6 + 1.0) / 4),
    (0.7, True, (0.6, 1.4), 0.95 / 1.35, (-1.4 - 0.5 + 0.6 + 1.0) / 4),
])
def test_bapo_by_hand(rho, weighted, want_bounds, want_share, want_loss):
    """Token-mean loss max(-A r, -A clip(r, c_low, c_high)): row 0 gives -min(2, c_high) and -0.5 (its
    ratio 0.5 is below c_low, but for A > 0 only the upper bound binds), row 1 max(0.5, c_low) and 1."""
    logp, old, adv, mask = _hand_batch()
    loss, m = bapo_loss(logp, old, adv, mask, agg=TOKEN_MEAN, rho=rho, prob_weight=weighted, **SMALL)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose([float(m["bapo_clip_low"]), float(m["bapo_clip_high"])], want_bounds, rtol=1e-6)
    np.testing.assert_allclose(float(m["bapo_pos_share"]), want_share, rtol=1e-6)
    # the gradient: 0 on the clipped tokens (row 0's ratio 2 above c_high, row 1's 0.5 below c_low),
    # d(-A r)/dlogp = -A r / 4 on the others
    grad = jax.grad(lambda lp: bapo_loss(lp, old, adv, mask, agg=TOKEN_MEAN, rho=rho, prob_weight=weighted,
                                         **SMALL)[0])(logp)
    np.testing.assert_allclose(np.asarray(grad), [[0.0, -0.5 / 4], [0.0, 1.0 / 4]], atol=1e-7)
    np.testing.assert_allclose(float(m["pg_clipfrac"]), 0.5)


def test_bapo_equals_numpy_transcription():
    """A random batch with GRPO-like advantages (one value per row, some rows 0), ragged masks and the
    positive rows' ratios >= 1 (so raising c_high matters); the paper's settings; for rho_0 along the
    shares the path passes (about 0.41 at (a-, a+), 0.55-0.57 at its end) the bounds, share and loss
    equal the literal loop's."""
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    b, r = 12, 9
    a_row = np.array([1.3, -0.4, 0.0, -1.1, 0.7, -0.9] * 2)
    old = -jax.random.uniform(k[0], (b, r), minval=0.05, maxval=3.0)
    noise = jax.random.normal(k[1], (b, r))
    logp = old + jnp.where(jnp.asarray(a_row)[:, None] > 0, jnp.abs(noise), 0.6 * noise)
    lengths = np.asarray(jax.random.randint(k[2], (b,), 2, r + 1))
    mask = jnp.asarray((np.arange(r)[None] < lengths[:, None]).astype(np.float32))
    adv = jnp.asarray(np.repeat(a_row[:, None], r, 1), jnp.float32) * mask
    ratio = np.exp(np.asarray(logp, np.float64) - np.asarray(old, np.float64))
    seen = set()
    for weighted in (True, False):
        weight = np.exp(np.asarray(old, np.float64)) if weighted else np.ones((b, r))
        for rho in (0.0, 0.4, 0.43, 0.47, 0.5, 0.54, 0.56, 0.6, 1.0):
            c_low, c_high, share = algorithm_1(ratio, adv, weight, mask, rho, **PAPER)
            loss, m = bapo_loss(logp, old, adv, mask, agg=TOKEN_MEAN, rho=rho, prob_weight=weighted, **PAPER)
            np.testing.assert_allclose([float(m["bapo_clip_low"]), float(m["bapo_clip_high"])], [c_low, c_high],
                                       rtol=1e-5)
            np.testing.assert_allclose(float(m["bapo_pos_share"]), share, rtol=1e-5)
            np.testing.assert_allclose(float(loss), clip_loss(ratio, adv, mask, c_low, c_high), rtol=1e-5, atol=1e-6)
            seen.add((round(c_low, 6), round(c_high, 6)))
    # the bounds stopped at the start, inside the c_high phase, and at the path's end
    assert len(seen) >= 8 and {(0.6, 1.2), (0.9, 3.0)} <= seen and any(1.2 < hi < 3.0 for _, hi in seen)


def test_bapo_aggregation_and_an_empty_signal():
    """The loss follows `agg` (seq-mean-token-mean here); all-zero advantages: nothing contributes,
    rho = 1 by definition, the bounds stay at (a-, a+) and the loss is 0."""
    logp, old, adv, mask = _hand_batch()
    mask = jnp.array([[1.0, 0.0], [1.0, 1.0]])
    loss, _ = bapo_loss(logp, old, adv, mask, agg=Aggregation("seq-mean-token-mean"), rho=0.6, prob_weight=False,
                        **SMALL)
    # bounds: P = min(2, c_high), N = c_low + 1: 1.2/2.8 < 0.6 ... 1.6/3.4 at the last state (0.8, 1.6)
    np.testing.assert_allclose(float(loss), (-1.6 + (0.8 + 1.0) / 2) / 2, rtol=1e-6)
    loss, m = bapo_loss(logp, old, 0 * adv, mask, agg=TOKEN_MEAN, rho=0.6, **SMALL)
    assert float(loss) == 0.0 and float(m["bapo_pos_share"]) == pytest.approx(1.0)
    np.testing.assert_allclose([float(m["bapo_clip_low"]), float(m["bapo_clip_high"])], [0.6, 1.2], rtol=1e-6)


def released_code_loop(ratio, adv, mask, target, lower_start, lower_max, lower_step, upper_start, upper_max,
                       upper_step, eps=1e-8):
    """The released verl code's search (WooooDyy/BAPO `recipe/bapo/policy_loss.py`) transcribed in float64:
    c_low first, then c_high, each step min(c + delta, max); met when P / (N + eps) >= target (N <= 0: inf)."""
    ratio, adv, mask = (np.asarray(x, np.float64) for x in (ratio, adv, mask))

    def pos_neg(c_low, c_high):
        eff = np.where(adv >= 0, np.minimum(ratio, c_high), np.maximum(ratio, c_low)) * adv * mask
        pos, neg = np.clip(eff, 0, None).sum(), -np.clip(eff, None, 0).sum()
        return np.inf if neg <= 0 else pos / (neg + eps)

    low, high = lower_start, upper_start
    value = pos_neg(low, high)
    while value < target and low < lower_max:
        low = min(low + lower_step, lower_max)
        value = pos_neg(low, high)
    while value < target and high < upper_max:
        high = min(high + upper_step, upper_max)
        value = pos_neg(low, high)
    return low, high


def test_released_code_path_lowers_first_in_python_floats():
    """c_low first, then c_high; in floats 0.6 + 0.1 + 0.1 = 0.7999999999999999 < 0.8 and 1.2 + 0.2 + 0.2 =
    1.5999999999999999 < 1.6, so the code takes one more clamped step on each (seven states where exact
    steps give five)."""
    lows, highs = released_code_path(**SMALL)
    assert list(lows) == [0.6, 0.7, 0.7999999999999999, 0.8, 0.8, 0.8, 0.8]
    assert list(highs) == [1.2, 1.2, 1.2, 1.2, 1.4, 1.5999999999999999, 1.6]
    lows, highs = released_code_path(**dict(SMALL, lower_max=0.65))  # a partial step still moves, clamped
    assert list(lows)[:2] == [0.6, 0.65] and list(highs)[-1] == 1.6


@pytest.mark.parametrize("target, weighted, want_bounds, want_share, want_loss", [
    # unweighted: P = c_high + 0.5, N = c_low + 1: P / N = 1.7 / 1.6 at the start, falling while c_low rises
    (1.0, False, (0.6, 1.2), 1.7 / 3.3, (-1.2 - 0.5 + 0.6 + 1.0) / 4),  # the yaml's target: met at once
    (1.1, False, (0.8, 1.6), 2.1 / 3.9, (-1.6 - 0.5 + 0.8 + 1.0) / 4),  # 1.9 / 1.8 < 1.1 <= 2.1 / 1.8: the end
    (1.2, False, (0.8, 1.6), 2.1 / 3.9, (-1.6 - 0.5 + 0.8 + 1.0) / 4),  # never met: the path's last state
    # weighted by pi_old: P = 0.5 (c_high + 0.5) = 0.85, N = 0.25 (c_low + 1) = 0.4 at the start
    (2.1, True, (0.6, 1.2), 0.85 / 1.25, (-1.2 - 0.5 + 0.6 + 1.0) / 4),
    (2.3, True, (0.8, 1.6), 1.05 / 1.5, (-1.6 - 0.5 + 0.8 + 1.0) / 4),  # 0.95 / 0.45 < 2.3 <= 1.05 / 0.45
])
def test_released_code_variant_by_hand(target, weighted, want_bounds, want_share, want_loss):
    logp, old, adv, mask = _hand_batch()
    loss, m = bapo_loss(logp, old, adv, mask, agg=TOKEN_MEAN, rho=target, prob_weight=weighted,
                        variant="released_code", **SMALL)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose([float(m["bapo_clip_low"]), float(m["bapo_clip_high"])], want_bounds, rtol=1e-6)
    np.testing.assert_allclose(float(m["bapo_pos_share"]), want_share, rtol=1e-6)


def test_dual_clip_by_hand():
    """Row 1's second token (A = -1, ratio 4) is capped at -A c = 3 by the dual clip (the released code's
    c = 3), its gradient 0. Unweighted P = c_high + 0.5, N = c_low + 4: the script's target 0.5 is never met
    (2.1 / 4.8 at the end), 0.35 at the start (1.7 / 4.6)."""
    old = jnp.log(jnp.full((2, 2), 0.5))
    logp = old + jnp.log(jnp.array([[2.0, 0.5], [0.5, 4.0]]))
    adv, mask = jnp.array([[1.0, 1.0], [-1.0, -1.0]]), jnp.ones((2, 2))
    kw = dict(agg=TOKEN_MEAN, prob_weight=False, variant="released_code", **SMALL)
    for target, c, want in [(0.5, 3.0, (-1.6 - 0.5 + 0.8 + 3.0) / 4), (0.35, 3.0, (-1.2 - 0.5 + 0.6 + 3.0) / 4),
                            (0.35, 0.0, (-1.2 - 0.5 + 0.6 + 4.0) / 4)]:
        loss, m = bapo_loss(logp, old, adv, mask, rho=target, clip_ratio_c=c, **kw)
        np.testing.assert_allclose(float(loss), want, rtol=1e-6)
        np.testing.assert_allclose(float(m["pg_clipfrac_lower"]), 0.25 if c else 0.0)
    grad = jax.grad(lambda lp: bapo_loss(lp, old, adv, mask, rho=0.5, clip_ratio_c=3.0, **kw)[0])(logp)
    np.testing.assert_allclose(np.asarray(grad), [[0.0, -0.5 / 4], [0.0, 0.0]], atol=1e-7)
    # the paper's search applies the same dual clip: rho_0 = 0.25 is met at the start (1.7 / 6.3 = 0.27)
    loss, _ = bapo_loss(logp, old, adv, mask, agg=TOKEN_MEAN, rho=0.25, prob_weight=False, clip_ratio_c=3.0, **SMALL)
    np.testing.assert_allclose(float(loss), (-1.2 - 0.5 + 0.6 + 3.0) / 4, rtol=1e-6)


def test_released_code_variant_equals_its_loop():
    """The random batch of `test_bapo_equals_numpy_transcription`, the released script's ranges and steps
    ([0.8, 0.95] by 0.05, [1.2, 2.0] by 0.1): the bounds equal the transcribed loop's for targets across the
    ratios P / N the path passes."""
    k = jax.random.split(jax.random.PRNGKey(1), 3)
    b, r = 12, 9
    a_row = np.array([1.3, -0.4, 0.0, -1.1, 0.7, -0.9] * 2)
    old = -jax.random.uniform(k[0], (b, r), minval=0.05, maxval=3.0)
    noise = jax.random.normal(k[1], (b, r))
    logp = old + jnp.where(jnp.asarray(a_row)[:, None] > 0, jnp.abs(noise), 0.6 * noise)
    mask = jnp.ones((b, r))
    adv = jnp.asarray(np.repeat(a_row[:, None], r, 1), jnp.float32)
    ratio = np.exp(np.asarray(logp, np.float64) - np.asarray(old, np.float64))
    script = dict(lower_start=0.8, lower_max=0.95, lower_step=0.05, upper_start=1.2, upper_max=2.0, upper_step=0.1)
    seen = set()
    for target in (0.3, 0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 1.0, 2.0):
        c_low, c_high = released_code_loop(ratio, adv, mask, target, **script)
        loss, m = bapo_loss(logp, old, adv, mask, agg=TOKEN_MEAN, rho=target, prob_weight=False,
                            variant="released_code", **script)
        np.testing.assert_allclose([float(m["bapo_clip_low"]), float(m["bapo_clip_high"])], [c_low, c_high],
                                   rtol=1e-5)  # a token mean of the bound in float32
        np.testing.assert_allclose(float(loss), clip_loss(ratio, adv, mask, c_low, c_high), rtol=1e-5, atol=1e-6)
        seen.add((round(c_low, 6), round(c_high, 6)))
    assert {(0.8, 1.2), (0.95, 2.0)} <= seen and any(1.2 < hi < 2.0 for _, hi in seen), seen


def test_bapo_variant_settings():
    """The released code's setting is a config (its script's target 0.5 on P / N, the dual clip at 3, no
    pi_old weight, its ranges and steps); a target above 1 is a share only the released test can take."""
    c = importlib.import_module("configs.bapo").get_config("micro")
    assert (c.loss.bapo.variant, c.loss.clip_ratio_c) == ("paper", 0.0)
    c.loss.bapo.variant, c.loss.bapo.rho, c.loss.clip_ratio_c = "released_code", 0.5, 3.0
    c.loss.bapo.prob_weight = False
    c.loss.bapo.lower_start, c.loss.bapo.lower_max, c.loss.bapo.lower_step = 0.8, 0.95, 0.05
    c.loss.bapo.upper_start, c.loss.bapo.upper_max, c.loss.bapo.upper_step = 1.2, 2.0, 0.1
    spec = spec_of(c)
    assert (spec.loss.bapo.variant, spec.loss.clip_ratio_c) == ("released_code", 3.0)
    c.loss.bapo.rho, c.loss.bapo.lower_max = 2.0, 0.82  # P / N >= 2; a partial lower step the code takes
    spec_of(c)
    c.loss.bapo.variant = "paper"
    with pytest.raises(ConfigError, match=r"config\.loss\.bapo\.rho: 2\.0 must be <= 1"):
        spec_of(c)
    c.loss.bapo.variant = "authors"
    with pytest.raises(ConfigError, match=r"config\.loss\.bapo\.variant: 'authors' is not one of"):
        spec_of(c)
