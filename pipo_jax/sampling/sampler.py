"""One-jit batched generation: prefill, then a `lax.while_loop` of decode steps.

`generate` is a pure function of fixed shapes, so the trainer can call it inside its
own jit (or `lax.scan` of iterations). It stops early once every row is done.

Layout (the trainer's convention):
  * prompts come in **left-padded** `[B, P]` with a 0/1 mask (positions count real
    tokens, so any padding is accepted for the prefill, but only left padding makes
    `prompt ++ response` contiguous);
  * responses go out right-padded `[B, R]` (`R = max_new_tokens`) with a response mask;
    a stop token is part of the response; after the end, `pad_id` and log-prob 0;
  * `SampleOutput.sequence_bl` / `sequence_mask_bl` = prompt ++ response `[B, P + R]`,
    on which `qwen3.forward` (default positions) recomputes exactly the sampler's
    logits.

Randomness: row `b` uses key `fold_in(rng, b)` (or `rng[b]` when per-row keys are
given) and its response token `i` uses `fold_in(row_key, i)`, so a row's samples depend
only on its key, prompt and budget (see `token_sampling`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pipo_jax.models.qwen3 import Params, Qwen3Config
from pipo_jax.sampling import decode
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.sampling.token_sampling import is_stop_token, sample_tokens

DEFAULT_ATTN_BLOCK = 128


class SampleOutput(NamedTuple):
    """Result of `generate` (arrays have a leading batch axis `B`, except `num_steps`)."""

    tokens_br: jax.Array  # int32 [B, R] response tokens, pad_id after the end
    logprobs_br: jax.Array  # float32 [B, R] behaviour log-probs (SamplingParams.logprobs), 0 after the end
    mask_br: jax.Array  # int32 [B, R] 1 on response tokens (stop token included)
    lengths_b: jax.Array  # int32 [B] response lengths
    stopped_b: jax.Array  # bool [B] ended by a stop token (else by its budget)
    prompt_tokens_bp: jax.Array  # int32 [B, P] the prompts as given
    prompt_mask_bp: jax.Array  # int32 [B, P]
    num_steps: jax.Array  # int32 scalar: decode steps run (< R - 1 when every row ended early)

    @property
    def sequence_bl(self) -> jax.Array:
        """int32 `[B, P + R]`: prompt ++ response."""
        return jnp.concatenate([self.prompt_tokens_bp, self.tokens_br], axis=1)

    @property
    def sequence_mask_bl(self) -> jax.Array:
        """int32 `[B, P + R]`: prompt mask ++ response mask."""
        return jnp.concatenate([self.prompt_mask_bp, self.mask_br], axis=1)


def attention_lengths(min_len: int, max_len: int, block: int = DEFAULT_ATTN_BLOCK) -> tuple[int, ...]:
    """Ladder of attention widths `block * 2^j` (capped at `max_len`) that are `>= min_len`.

    The last entry is always `max_len`. Bounding the ladder keeps compiles few while a
    step never reads more than ~2x the cache slots it needs.
    """
    if block < 1:
        raise ValueError(f"attention block={block} must be >= 1")
    out = []
    width = block
    while width < max_len:
        if width >= min_len:
            out.append(width)
        width *= 2
    out.append(max_len)
    return tuple(out)


def row_keys(rng: jax.Array, batch: int) -> jax.Array:
    """Typed per-row keys `[B]` from one key (`fold_in(rng, b)`) or from `[B]` keys as given.

    Accepts typed keys (`jax.random.key`) or raw uint32 keys (`jax.random.PRNGKey`).
    """
    rng = jnp.asarray(rng) if not isinstance(rng, jax.Array) else rng
    if not jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
        if rng.dtype != jnp.uint32 or rng.shape[-1:] != (2,):
            raise ValueError(f"rng must be a PRNG key (typed, or raw uint32 [..., 2]); got {rng.dtype}{rng.shape}")
        rng = jax.random.wrap_key_data(rng)
    if rng.shape == ():
        return jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(batch, dtype=jnp.uint32))
    if rng.shape != (batch,):
        raise ValueError(f"rng has key shape {rng.shape}; expected one key or one per row ({batch},)")
    return rng


class _Loop(NamedTuple):
    """While-loop carry of `generate` (t = response index being sampled next)."""

    t: jax.Array
    last_b: jax.Array
    done_b: jax.Array
    stopped_b: jax.Array
    n_b: jax.Array
    tokens_br: jax.Array
    logprobs_br: jax.Array
    cache: object


@functools.partial(
    jax.jit,
    static_argnames=("config", "sampling", "cache_dtype", "attn_block"),
)
def generate(
    config: Qwen3Config,
    params: Params,
    prompt_tokens_bp: jax.Array,
    prompt_mask_bp: jax.Array,
    rng: jax.Array,
    sampling: SamplingParams = SamplingParams(),
    *,
    max_new_b: jax.Array | None = None,
    cache_dtype=None,
    attn_block: int = DEFAULT_ATTN_BLOCK,
) -> SampleOutput:
    """Samples a response for every prompt row, in one jit.

    Args:
      config, params: the Qwen3 model (`qwen3.init_params` / `hf.load` layout), used
        as stored (cast once to the compute dtype if stored in another).
      prompt_tokens_bp, prompt_mask_bp: left-padded prompts and their 0/1 mask `[B, P]`;
        every row needs at least one real token.
      rng: one PRNG key (row b uses `fold_in(rng, b)`) or per-row keys `[B]`.
      sampling: the `SamplingParams` (static): temperature, truncation, budget, stops, pad id,
        log-prob mode.
      max_new_b: optional per-row budgets `[B]` (each clipped to `sampling.max_new_tokens`).
      cache_dtype: KV-cache dtype (default the compute dtype).
      attn_block: granularity of the cache-width ladder (`attention_lengths`): the
        cache grows along it as responses lengthen.

    Returns:
      `SampleOutput` with responses `[B, max_new_tokens]`.
    """
    sp = sampling
    sp.validate_vocab(config.vocab_size)
    b, p = prompt_tokens_bp.shape
    if prompt_mask_bp.shape != (b, p):
        raise ValueError(f"prompt_mask_bp shape {prompt_mask_bp.shape} != prompt_tokens_bp shape {(b, p)}")
    r = sp.max_new_tokens
    keys_b = row_keys(rng, b)
    budget_b = jnp.full((b,), r, jnp.int32)
    if max_new_b is not None:
        budget_b = jnp.clip(jnp.asarray(max_new_b, jnp.int32), 1, r)

    weights = decode.compute_params(config, params, rows=b)
    # Cache widths: a ladder of attention windows (one while-loop each), so a step
    # reads only ~the slots it needs; the last sampled token is never fed back, so
    # positions stay below P + R - 1.
    widths = attention_lengths(p + 1, p + r - 1, attn_block) if r > 1 else (p,)
    logits_bv, lengths_b, cache = decode.prefill(config, weights, prompt_tokens_bp, prompt_mask_bp, widths[0],
                                                 cache_dtype)
    tok_b, lp_b = sample_tokens(logits_bv, keys_b, jnp.zeros((b,), jnp.int32), sp)
    stop_b = is_stop_token(tok_b, sp.stop_token_ids)
    carry = _Loop(
        t=jnp.int32(1),
        last_b=tok_b,
        done_b=stop_b | (budget_b <= 1),
        stopped_b=stop_b,
        n_b=jnp.ones((b,), jnp.int32),
        tokens_br=jnp.full((b, r), sp.pad_id, jnp.int32).at[:, 0].set(tok_b),
        logprobs_br=jnp.zeros((b, r), jnp.float32).at[:, 0].set(lp_b),
        cache=cache,
    )

    def body(s: _Loop) -> _Loop:
        active_b = ~s.done_b
        # Step t feeds token t-1 at position len + t - 1; finished rows write nothing.
        pos_b = jnp.where(active_b, lengths_b + s.t - 1, s.cache.max_len)
        logits, cache = decode.decode_step(config, weights, s.cache, s.last_b, pos_b)
        tok, lp = sample_tokens(logits, keys_b, jnp.full((b,), s.t, jnp.int32), sp)
        tok = jnp.where(active_b, tok, sp.pad_id)
        lp = jnp.where(active_b, lp, 0.0)
        stop = active_b & is_stop_token(tok, sp.stop_token_ids)
        n_b = s.n_b + active_b.astype(jnp.int32)
        return _Loop(
            t=s.t + 1,
            last_b=tok,
            done_b=s.done_b | stop | (n_b >= budget_b),
            stopped_b=s.stopped_b | stop,
            n_b=n_b,
            tokens_br=jax.lax.dynamic_update_slice(s.tokens_br, tok[:, None], (0, s.t)),
            logprobs_br=jax.lax.dynamic_update_slice(s.logprobs_br, lp[:, None], (0, s.t)),
            cache=cache,
        )

    if r > 1:
        for width in widths:
            # In this phase position len + t - 1 <= P + t - 1 must stay < width.
            t_end = min(r, width - p + 1)
            carry = carry._replace(cache=decode.resize_cache(carry.cache, width))
            carry = jax.lax.while_loop(lambda s, t_end=t_end: (s.t < t_end) & ~jnp.all(s.done_b), body, carry)

    mask_br = (jnp.arange(r)[None, :] < carry.n_b[:, None]).astype(jnp.int32)
    return SampleOutput(
        tokens_br=carry.tokens_br,
        logprobs_br=carry.logprobs_br,
        mask_br=mask_br,
        lengths_b=carry.n_b,
        stopped_b=carry.stopped_b,
        prompt_tokens_bp=jnp.asarray(prompt_tokens_bp, jnp.int32),
        prompt_mask_bp=jnp.asarray(prompt_mask_bp, jnp.int32),
        num_steps=carry.t - 1,
    )
