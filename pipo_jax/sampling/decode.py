"""Cached one-token decode step for generation, and prompt prefill into a cache.

`cached_forward` is the fast path behind both samplers (prefill of `T` prompt tokens
and `decode_step` of one token per row). It computes the same function as
`qwen3.forward(..., cache=cache)` (the plain path; the tests hold them equal) but is
organised for decode speed:

* weights are re-laid-out once per generate call / engine (`prepare_weights`):
  q/k/v fused into one `[D, (H + 2K) * Dh]` matrix and gate/up into one `[D, 2F]`,
  so each layer runs three weight matmuls instead of six;
* each layer's matrices are separate buffers and the layer loop is unrolled (XLA:CPU
  copies a layer's weights out of a stacked array when a scan slices them);
* the KV cache is updated in place (a scatter of one slot per row into the donated
  buffer) instead of being re-stacked per step as a scan's output;
* attention reads only the first `attn_len` cache slots (a static bucket the caller
  picks >= every row's position + 1), not the whole `max_len`;
* RoPE tables are computed once per step, not per layer.

Cache layout is `qwen3.KVCache` (`[layers, batch, max_len, kv_heads, head_dim]`,
indexed by position).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from pipo_jax.models import qwen3
from pipo_jax.models.qwen3 import KVCache, Qwen3Config


class DecodeWeights(NamedTuple):
    """Parameters re-laid-out for decoding (built by `prepare_weights`).

    `layers` is a tuple with one dict per layer (separate buffers, so no per-step
    slicing of stacked weights): attn_norm `[D]`, qkv `[D, (H+2K)*Dh]`, q_norm / k_norm
    `[Dh]`, o `[H*Dh, D]`, mlp_norm `[D]`, gate_up `[D, 2F]`, down `[F, D]`.
    """

    embed: jax.Array  # [V, D]
    lm_head: jax.Array  # [D, V]
    final_norm: jax.Array  # [D]
    layers: tuple


def prepare_weights(config: Qwen3Config, params: qwen3.Params) -> DecodeWeights:
    """Decode layout of `params`: one copy of the weights, matrices in the compute dtype."""
    c = config
    dt = c.jnp_dtype
    lp = params["layers"]
    d = c.hidden_size
    layers = []
    for i in range(c.num_hidden_layers):
        flat = lambda w: w[i].reshape(d, -1).astype(dt)  # noqa: E731
        layers.append({
            "attn_norm": lp["attn_norm"][i],
            "qkv": jnp.concatenate([flat(lp["q_proj"]), flat(lp["k_proj"]), flat(lp["v_proj"])], axis=-1),
            "q_norm": lp["q_norm"][i],
            "k_norm": lp["k_norm"][i],
            "o": lp["o_proj"][i].reshape(-1, d).astype(dt),
            "mlp_norm": lp["mlp_norm"][i],
            "gate_up": jnp.concatenate([lp["gate_proj"][i].astype(dt), lp["up_proj"][i].astype(dt)], axis=-1),
            "down": lp["down_proj"][i].astype(dt),
        })
    return DecodeWeights(
        embed=params["embed"],
        lm_head=qwen3.lm_head_weight(c, params).astype(dt),
        final_norm=params["final_norm"],
        layers=tuple(layers),
    )


def weight_bytes(weights: DecodeWeights) -> int:
    """Bytes one decode step reads from the weights (the embedding: one row per token, ~0)."""
    return sum(x.nbytes for x in jax.tree_util.tree_leaves((weights.lm_head, weights.final_norm, weights.layers)))


def _rope_b(x_bhd: jax.Array, cos_bd: jax.Array, sin_bd: jax.Array) -> jax.Array:
    return qwen3.apply_rope(x_bhd[:, None], cos_bd[:, None], sin_bd[:, None])[:, 0]


def _attend(q_bthd, keys_bakd, vals_bakd, allowed_bta, dtype):
    """Grouped-query attention of `T` queries per row over `a` cache slots -> `[B, T, H*Dh]`."""
    b, t, h, dh = q_bthd.shape
    k = keys_bakd.shape[2]
    q_btkgd = q_bthd.reshape(b, t, k, h // k, dh)
    s = jnp.einsum("btkgd,bakd->bkgta", q_btkgd, keys_bakd, preferred_element_type=jnp.float32) * dh**-0.5
    s = jnp.where(allowed_bta[:, None, None, :, :], s, jnp.finfo(jnp.float32).min)
    p = jax.nn.softmax(s, axis=-1).astype(dtype)
    o_btkgd = jnp.einsum("bkgta,bakd->btkgd", p, vals_bakd, preferred_element_type=jnp.float32)
    return o_btkgd.reshape(b, t, h * dh).astype(dtype)


def cached_forward(
    config: Qwen3Config,
    weights: DecodeWeights,
    cache: KVCache,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    valid_bt: jax.Array | None = None,
    attn_len: int | None = None,
) -> tuple[jax.Array, KVCache]:
    """Runs `T` tokens per row through the decoder with the cache; returns `(hidden_btd, cache)`.

    Same function as `qwen3.forward(config, params, tokens_bt, valid_bt, positions_bt,
    cache, return_hidden=True)` (final-normed hidden states, compute dtype).

    Args:
      tokens_bt: int token ids `[B, T]`.
      positions_bt: int position of each token `[B, T]`; its key/value is written at
        that cache slot and it attends to slots `0..position`. Positions `>= max_len`
        write nothing (use them for idle rows; their outputs are garbage).
      valid_bt: 0/1 `[B, T]`; invalid (padding) tokens write nothing (default all valid).
      attn_len: static number of leading cache slots that attention reads (default
        all); must exceed every valid token's position.
    """
    c = config
    dt = c.jnp_dtype
    eps = c.rms_norm_eps
    b, t = tokens_bt.shape
    h, k, dh = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    max_len = cache.max_len
    a = max_len if attn_len is None else attn_len
    if not 0 < a <= max_len:
        raise ValueError(f"attn_len={attn_len} must be in [1, max_len={max_len}]")
    if valid_bt is None:
        write_bt = positions_bt
        allowed_bta = jnp.arange(a)[None, None, :] <= positions_bt[:, :, None]
    else:
        valid_bt = valid_bt.astype(bool)
        write_bt = jnp.where(valid_bt, positions_bt, max_len)
        allowed_bta = (jnp.arange(a)[None, None, :] <= positions_bt[:, :, None]) & valid_bt[:, :, None]

    x_btd = jnp.take(weights.embed, tokens_bt, axis=0).astype(dt)
    cos, sin = qwen3.rope_tables(positions_bt, dh, c.rope_theta)
    rows_bt = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
    ck, cv = cache.k, cache.v
    # Python loop: each layer's weights are their own buffers (a scan over stacked
    # weights makes XLA:CPU copy every layer's matrices out of the stack each step).
    for i, lw in enumerate(weights.layers):
        hid = qwen3.rms_norm(x_btd, lw["attn_norm"], eps)
        qkv = hid @ lw["qkv"]
        q = qkv[..., : h * dh].reshape(b, t, h, dh)
        kk = qkv[..., h * dh : (h + k) * dh].reshape(b, t, k, dh)
        v = qkv[..., (h + k) * dh :].reshape(b, t, k, dh)
        q = qwen3.apply_rope(qwen3.rms_norm(q, lw["q_norm"], eps), cos, sin)
        kk = qwen3.apply_rope(qwen3.rms_norm(kk, lw["k_norm"], eps), cos, sin)
        # In-place writes into the (donated) cache; out-of-range slots are dropped.
        ck = ck.at[i, rows_bt, write_bt].set(kk.astype(ck.dtype), mode="drop")
        cv = cv.at[i, rows_bt, write_bt].set(v.astype(cv.dtype), mode="drop")
        attn = _attend(q, ck[i, :, :a].astype(dt), cv[i, :, :a].astype(dt), allowed_bta, dt)
        x_btd = x_btd + attn @ lw["o"]
        hid = qwen3.rms_norm(x_btd, lw["mlp_norm"], eps)
        gu = hid @ lw["gate_up"]
        f = gu.shape[-1] // 2
        x_btd = x_btd + (jax.nn.silu(gu[..., :f]) * gu[..., f:]) @ lw["down"]
    return qwen3.rms_norm(x_btd, weights.final_norm, eps), KVCache(ck, cv)


def head_logits(weights: DecodeWeights, hidden_bd: jax.Array) -> jax.Array:
    """Float32 logits `[B, V]` of final-normed hidden states `[B, D]`."""
    return jnp.einsum("bd,dv->bv", hidden_bd, weights.lm_head, preferred_element_type=jnp.float32)


def decode_step(
    config: Qwen3Config,
    weights: DecodeWeights,
    cache: KVCache,
    tokens_b: jax.Array,
    positions_b: jax.Array,
    attn_len: int | None = None,
) -> tuple[jax.Array, KVCache]:
    """Feeds one token per row (`tokens_b`, `positions_b` `[B]`); returns `(logits_bv, cache)`.

    See `cached_forward` for positions (>= max_len: idle row) and `attn_len`.
    """
    hidden_b1d, cache = cached_forward(config, weights, cache, tokens_b[:, None], positions_b[:, None],
                                       attn_len=attn_len)
    return head_logits(weights, hidden_b1d[:, 0]), cache


def widen_cache(cache: KVCache, max_len: int) -> KVCache:
    """The same cache with `max_len` slots (new slots zero)."""
    extra = max_len - cache.max_len
    if extra < 0:
        raise ValueError(f"cannot narrow a cache of {cache.max_len} slots to {max_len}")
    if extra == 0:
        return cache
    pad = ((0, 0), (0, 0), (0, extra), (0, 0), (0, 0))
    return KVCache(jnp.pad(cache.k, pad), jnp.pad(cache.v, pad))


def prefill(
    config: Qwen3Config, weights: DecodeWeights, tokens_bp: jax.Array, mask_bp: jax.Array, cache_len: int,
    cache_dtype=None,
) -> tuple[jax.Array, jax.Array, KVCache]:
    """Runs padded prompts `[B, P]` into a fresh cache of `cache_len` slots.

    Any padding works: positions count the real tokens (`qwen3.default_positions`), so
    a row's prompt fills slots `0..len-1`. Returns `(logits_bv of each row's last real
    token, lengths_b, cache)`. Attention runs over a cache exactly `P` wide, which is
    then widened to `cache_len`.
    """
    b, p = tokens_bp.shape
    if cache_len < p:
        raise ValueError(f"cache_len={cache_len} is shorter than the padded prompt width {p}")
    mask_bp = mask_bp.astype(jnp.int32)
    cache = qwen3.init_cache(config, b, p, cache_dtype)
    positions_bp = qwen3.default_positions(mask_bp)
    hidden_bpd, cache = cached_forward(config, weights, cache, tokens_bp, positions_bp, mask_bp)
    lengths_b = jnp.sum(mask_bp, axis=1)
    last_b = p - 1 - jnp.argmax(mask_bp[:, ::-1], axis=1)  # index of each row's last real token
    last_bd = jnp.take_along_axis(hidden_bpd, last_b[:, None, None], axis=1)[:, 0]
    return head_logits(weights, last_bd), lengths_b, widen_cache(cache, cache_len)
