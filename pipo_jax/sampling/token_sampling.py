"""Drawing the next token from logits: temperature, top-k, top-p, greedy; its log-prob.

Randomness is per request: the token at response index `i` of a request with key `k`
uses Gumbel noise from `fold_in(k, i)` over the whole vocabulary, indexed by token id.
So a request's samples depend only on its key and its own logits, never on its slot or
on the other rows of the batch; this is what lets the continuous-batching engine
reproduce the one-jit `generate`.

Truncation is a per-row logit threshold `tau`: a token is kept iff `z >= tau` where
`z = logits / temperature`. Top-k gives `tau` = the k-th largest `z`; top-p (applied to
the top-k-renormalised distribution, as HF does) gives `tau` = the smallest `z` of the
shortest most-likely-first prefix whose mass reaches `top_p`. Tokens tied with `tau`
are all kept. `reference_truncation_mask` computes the same kept set the plain way
(per-row sort, no thresholds) and the tests hold the two equal.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax.sampling.sampling_params import SamplingParams

_NEG_INF = -jnp.inf


def token_keys(keys_b: jax.Array, indices_b: jax.Array) -> jax.Array:
    """The key of response token `indices_b[b]` of row `b`: `fold_in(keys_b[b], index)`."""
    return jax.vmap(jax.random.fold_in)(keys_b, indices_b.astype(jnp.uint32))


def gumbel_noise(keys_b: jax.Array, indices_b: jax.Array, vocab_size: int) -> jax.Array:
    """Gumbel(0, 1) noise `[B, V]` for response token `indices_b` of each row."""
    return jax.vmap(lambda k: jax.random.gumbel(k, (vocab_size,), jnp.float32))(token_keys(keys_b, indices_b))


def truncation_threshold(z_bv: jax.Array, top_k: int, top_p: float) -> jax.Array | None:
    """Per-row logit threshold `tau_b` `[B]` of top-k then top-p (None when both are off)."""
    if top_k == 0 and top_p >= 1.0:
        return None
    v = z_bv.shape[-1]
    k = top_k if top_k > 0 else v
    sorted_bk = jax.lax.top_k(z_bv, k)[0]  # descending
    tau_b = sorted_bk[:, -1]
    if top_p < 1.0:
        probs_bk = jax.nn.softmax(sorted_bk, axis=-1)
        mass_before_bk = jnp.cumsum(probs_bk, axis=-1) - probs_bk
        n_keep_b = jnp.maximum(jnp.sum(mass_before_bk < top_p, axis=-1), 1)
        tau_b = jnp.take_along_axis(sorted_bk, (n_keep_b - 1)[:, None], axis=-1)[:, 0]
    return tau_b


def reference_truncation_mask(z_v: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """Plain numpy kept-set of one row `[V]` (bool) by the definitions, for tests."""
    z_v = np.asarray(z_v, np.float64)
    order = np.argsort(-z_v, kind="stable")
    sorted_z = z_v[order]
    n = len(z_v) if top_k == 0 else top_k
    if top_p < 1.0:
        p = np.exp(sorted_z[:n] - sorted_z[0])
        p = p / p.sum()
        mass_before = 0.0
        m = 0
        while m < n and mass_before < top_p:
            mass_before += p[m]
            m += 1
        n = max(m, 1)
    # Ties with the last kept value are kept too (threshold semantics).
    return z_v >= sorted_z[n - 1]


def sample_tokens(
    logits_bv: jax.Array, keys_b: jax.Array, indices_b: jax.Array, params: SamplingParams
) -> tuple[jax.Array, jax.Array]:
    """Samples one token per row and returns `(tokens_b int32, logprobs_b float32)`.

    Args:
      logits_bv: float32 logits `[B, V]`.
      keys_b: the requests' typed PRNG keys `[B]`.
      indices_b: response index of the token being drawn `[B]` (0 for the first).
      params: temperature / top-k / top-p / log-prob mode (see `SamplingParams`).
    """
    logits_bv = logits_bv.astype(jnp.float32)
    raw_lse_b = None
    if params.greedy or params.logprobs == "raw":
        raw_lse_b = jax.nn.logsumexp(logits_bv, axis=-1)
    if params.greedy:
        tokens_b = jnp.argmax(logits_bv, axis=-1).astype(jnp.int32)
        chosen_b = jnp.take_along_axis(logits_bv, tokens_b[:, None], axis=-1)[:, 0]
        return tokens_b, chosen_b - raw_lse_b

    z_bv = logits_bv / params.temperature
    tau_b = truncation_threshold(z_bv, params.top_k, params.top_p)
    kept_bv = z_bv if tau_b is None else jnp.where(z_bv >= tau_b[:, None], z_bv, _NEG_INF)
    noise_bv = gumbel_noise(keys_b, indices_b, logits_bv.shape[-1])
    tokens_b = jnp.argmax(kept_bv + noise_bv, axis=-1).astype(jnp.int32)

    pick = lambda a_bv: jnp.take_along_axis(a_bv, tokens_b[:, None], axis=-1)[:, 0]  # noqa: E731
    if params.logprobs == "raw":
        return tokens_b, pick(logits_bv) - raw_lse_b
    source_bv = kept_bv if params.logprobs == "sampled" else z_bv
    return tokens_b, pick(z_bv) - jax.nn.logsumexp(source_bv, axis=-1)


def is_stop_token(tokens_b: jax.Array, stop_token_ids: tuple[int, ...]) -> jax.Array:
    """Bool `[B]`: the token is one of `stop_token_ids`."""
    if not stop_token_ids:
        return jnp.zeros(tokens_b.shape, bool)
    return jnp.any(tokens_b[:, None] == jnp.asarray(stop_token_ids, jnp.int32)[None, :], axis=-1)
