"""Token sampling: top-k / top-p kept sets, log-prob modes, frequencies (chi-square), keys."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.sampling.token_sampling import (
    is_stop_token,
    reference_truncation_mask,
    sample_tokens,
    truncation_threshold,
)

PROBS = np.array([0.5, 0.2, 0.15, 0.1, 0.05])


def request_keys(seeds) -> jax.Array:
    """Typed PRNG keys `[R]`, one per request, from integer seeds `[R]`."""
    return jax.vmap(jax.random.key)(jnp.asarray(seeds, jnp.uint32))


def _kept(logits_bv, top_k, top_p):
    tau = truncation_threshold(jnp.asarray(logits_bv), top_k, top_p)
    if tau is None:
        return np.ones(np.shape(logits_bv), bool)
    return np.asarray(jnp.asarray(logits_bv) >= tau[:, None])


@pytest.mark.parametrize(
    "top_k,top_p,expected",
    [
        (2, 1.0, [0, 1]),
        (0, 0.75, [0, 1, 2]),  # mass before each: 0, .5, .7 (< .75), .85 -> stop
        (3, 0.75, [0, 1]),  # top-3 renormalised: .588, .235, .176; mass before 2nd is .588 < .75, 3rd .824
        (0, 0.4, [0]),  # the first token alone reaches the mass
        (0, 1.0, [0, 1, 2, 3, 4]),
        (5, 0.99, [0, 1, 2, 3, 4]),
    ],
)
def test_kept_set_hand_computed(top_k, top_p, expected):
    logits = np.log(PROBS)[None]
    want = np.zeros(5, bool)
    want[expected] = True
    np.testing.assert_array_equal(_kept(logits, top_k, top_p)[0], want)
    np.testing.assert_array_equal(reference_truncation_mask(logits[0], top_k, top_p), want)


@pytest.mark.parametrize("top_k,top_p", [(1, 1.0), (7, 1.0), (0, 0.3), (0, 0.9), (12, 0.6), (40, 0.95)])
def test_threshold_equals_plain_reference_with_ties(top_k, top_p):
    rng = np.random.RandomState(0)
    logits = np.round(rng.randn(16, 40) * 2, 1).astype(np.float32)  # rounding makes ties
    fast = _kept(logits, top_k, top_p)
    for row in range(16):
        np.testing.assert_array_equal(fast[row], reference_truncation_mask(logits[row], top_k, top_p), err_msg=str(row))


def _one(logits_v, sp, seed=0, index=0):
    tok, lp = sample_tokens(jnp.asarray(logits_v)[None], request_keys([seed]), jnp.array([index]), sp)
    return int(tok[0]), float(lp[0])


def test_logprob_modes_hand_computed():
    logits = np.log(PROBS).astype(np.float32) + 1.7  # shift: log-probs must not depend on it
    temp, top_k = 0.5, 3
    z = np.log(PROBS) / temp
    for seed in range(20):
        tok, lp_sampled = _one(logits, SamplingParams(temperature=temp, top_k=top_k, logprobs="sampled"), seed)
        assert tok in (0, 1, 2)
        kept = np.exp(z[:3] - z[:3].max())
        np.testing.assert_allclose(lp_sampled, np.log(kept[tok] / kept.sum()), atol=1e-6)
        tok2, lp_tempered = _one(logits, SamplingParams(temperature=temp, top_k=top_k, logprobs="tempered"), seed)
        full = np.exp(z - z.max())
        assert tok2 == tok  # the mode only changes what is reported
        np.testing.assert_allclose(lp_tempered, np.log(full[tok] / full.sum()), atol=1e-6)
        _, lp_raw = _one(logits, SamplingParams(temperature=temp, top_k=top_k, logprobs="raw"), seed)
        np.testing.assert_allclose(lp_raw, np.log(PROBS[tok]), atol=1e-6)


def test_greedy_takes_argmax_and_reports_raw_logprob():
    logits = np.log(PROBS[::-1]).astype(np.float32)
    for mode in ("sampled", "tempered", "raw"):
        tok, lp = _one(logits, SamplingParams(temperature=0.0, logprobs=mode), seed=3)
        assert tok == 4
        np.testing.assert_allclose(lp, np.log(0.5), atol=1e-6)


def _chi_square(counts, probs):
    expected = counts.sum() * probs
    return float(np.sum((counts - expected) ** 2 / expected))


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.8), (1.3, 5, 0.9)],
)
def test_frequencies_match_truncated_distribution(temperature, top_k, top_p):
    """Chi-square goodness of fit on an 8-token vocabulary, 20000 draws, fixed seeds.

    Threshold: the statistic's 99.9% quantile under the null (df = kept - 1), so a
    correct sampler fails for 1 seed in 1000; these seeds are fixed, so the test is
    deterministic. Any token outside the kept set is an exact failure; a sampler drawing
    from a distorted kept-set distribution must be rejected (checked below).
    """
    logits = np.log(np.array([0.3, 0.2, 0.15, 0.12, 0.1, 0.07, 0.04, 0.02]))
    n = 20_000
    sp = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    logits_bv = jnp.broadcast_to(jnp.asarray(logits, jnp.float32), (n, 8))
    tokens, lps = sample_tokens(logits_bv, request_keys(np.arange(n) + 1000), jnp.zeros((n,), jnp.int32), sp)
    counts = np.bincount(np.asarray(tokens), minlength=8)

    z = logits / temperature
    kept = reference_truncation_mask(z, top_k, top_p)
    probs = np.where(kept, np.exp(z - z.max()), 0.0)
    probs /= probs.sum()
    assert counts[~kept].sum() == 0  # truncated tokens are never drawn
    df = int(kept.sum()) - 1
    # Reported log-probs are those of the truncated, renormalised distribution.
    np.testing.assert_allclose(np.asarray(lps), np.log(probs[np.asarray(tokens)]), atol=1e-5)
    if df == 0:
        assert counts[kept].sum() == n
        return
    threshold = _chi2_quantile(0.999, df)
    stat = _chi_square(counts[kept], probs[kept])
    assert stat < threshold, (stat, threshold)

    # Power: on the same draws, the kept-set distribution at a temperature 25% off is
    # rejected, so a bug of that size (or a wrong kept set, caught exactly above) fails.
    off = np.where(kept, np.exp(logits / (temperature * 1.25) - (logits / (temperature * 1.25)).max()), 0.0)
    assert _chi_square(counts[kept], (off / off.sum())[kept]) > threshold


def _chi2_quantile(q, df):
    """Quantile of the chi-square distribution by bisection on jax.scipy's CDF."""
    lo, hi = 0.0, 200.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if float(jax.scipy.stats.chi2.cdf(mid, df)) < q:
            lo = mid
        else:
            hi = mid
    return hi


def test_chi2_quantile_matches_table():
    # Standard table values of the 99.9% quantile.
    np.testing.assert_allclose(_chi2_quantile(0.999, 1), 10.828, atol=2e-3)
    np.testing.assert_allclose(_chi2_quantile(0.999, 4), 18.467, atol=2e-3)


def test_a_rows_sample_depends_only_on_its_key_and_index():
    rng = np.random.RandomState(1)
    logits = jnp.asarray(rng.randn(5, 300), jnp.float32)
    keys = request_keys([11, 12, 13, 14, 15])
    idx = jnp.array([0, 3, 3, 9, 1])
    sp = SamplingParams(temperature=1.0, top_p=0.9)
    toks, lps = sample_tokens(logits, keys, idx, sp)
    for b in (0, 3):
        t1, l1 = sample_tokens(logits[b : b + 1], keys[b : b + 1], idx[b : b + 1], sp)
        assert int(t1[0]) == int(toks[b])
        np.testing.assert_allclose(float(l1[0]), float(lps[b]), atol=1e-6)
    # A different response index or key gives different draws (over 5 rows, surely some).
    toks_next, _ = sample_tokens(logits, keys, idx + 1, sp)
    assert np.any(np.asarray(toks_next) != np.asarray(toks))


def test_is_stop_token():
    toks = jnp.array([1, 5, 9, 5])
    np.testing.assert_array_equal(np.asarray(is_stop_token(toks, (5, 9))), [False, True, True, True])
    np.testing.assert_array_equal(np.asarray(is_stop_token(toks, ())), [False] * 4)


@pytest.mark.parametrize(
    "kw,field",
    [({"temperature": -1.0}, "temperature"), ({"top_k": -2}, "top_k"), ({"top_p": 0.0}, "top_p"),
     ({"max_new_tokens": 0}, "max_new_tokens"), ({"logprobs": "nope"}, "logprobs"), ({"stop_token_ids": (-1,)}, "stop")],
)
def test_bad_sampling_params_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kw)


def test_vocab_validation():
    with pytest.raises(ValueError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=(300,)).validate_vocab(256)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=300).validate_vocab(256)
    SamplingParams(stop_token_ids=[3, 4]).validate_vocab(256)  # a list is accepted (stored as a tuple)
