"""Cached one-token decode step for generation, and prompt prefill into a cache.

`cached_forward` is the fast path behind both samplers (prefill of `T` prompt tokens
and `decode_step` of one token per row). It computes the same function as
`qwen3.forward(..., cache=cache)` (the plain path; the tests hold them equal) but is
organised for decode speed:

* weights are re-laid-out once per generate call / engine (`prepare_weights`):
  stored `[out, in]`, q/k/v fused into one `[(H + 2K) * Dh, D]` matrix and gate/up
  into one `[2F, D]`, so each layer runs three weight matmuls instead of six;
* each layer's matrices are separate buffers and the layer loop is unrolled (XLA:CPU
  copies a layer's weights out of a stacked array when a scan slices them);
* the KV cache (`DecodeCache`: per-layer buffers, keys stored `[B, K, Dh, S]`) is
  updated in place (a scatter of one slot per row into the donated buffer) and its
  width is the attention window, so attention is two plain batched matmuls over
  exactly the slots it needs (callers grow/shrink it with `resize_cache` along a short
  ladder of widths);
* RoPE tables are computed once per step, not per layer;
* on a single-device CPU in fp32 (`DecodeWeights.cpu_kernels`), C++ FFI kernels take
  the heavy parts of a decode step: products of at most `KERNEL_MAX_ROWS` rows go
  through `kernels.cpu_gemv` (up to 8 rows it streams each weight matrix once over all
  cores; above, a packed-panel GEMM) and one-token attention through
  `kernels.cpu_attention` (streams each row's cache slots up to its position once);
  XLA's ops otherwise (and for larger products, e.g. prefill of many tokens).

Positions index the cache as in `qwen3.KVCache`, which `to_kv_cache` converts to.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from pipo_jax.kernels import cpu_attention, cpu_ffi, cpu_gemv
from pipo_jax.models import qwen3
from pipo_jax.models.qwen3 import KVCache, Qwen3Config

# Row count up to which `cpu_gemv` beats XLA's matmul on the decode step's matrices
# (experiments/benchmarks/cpu_kernels.py).
KERNEL_MAX_ROWS = 32


@struct.dataclass
class DecodeWeights:
    """Parameters re-laid-out for decoding (built by `prepare_weights`).

    Matrices are stored `[out, in]` (as `torch.nn.Linear`): XLA:CPU's small-batch
    matmuls ran 1.3-2.8x faster with the contraction over both operands' minor axis,
    and `cpu_gemv` reads each output's weights as one contiguous row. `layers` is a
    tuple with one dict per layer (separate buffers, so no per-step slicing of stacked
    weights): attn_norm `[D]`, qkv `[(H+2K)*Dh, D]`, q_norm / k_norm `[Dh]`, o
    `[D, H*Dh]`, mlp_norm `[D]`, gate_up `[2F, D]`, down `[D, F]`. `cpu_kernels` (static)
    sends products of at most `KERNEL_MAX_ROWS` rows through `cpu_gemv` and one-token
    attention over an fp32 cache through `cpu_attention`.
    """

    embed: jax.Array  # [V, D]
    lm_head: jax.Array  # [V, D]
    final_norm: jax.Array  # [D]
    layers: tuple
    cpu_kernels: bool = struct.field(pytree_node=False, default=False)


def prepare_weights(config: Qwen3Config, params: qwen3.Params, cpu_kernels: bool | None = None) -> DecodeWeights:
    """Decode layout of `params`: one copy of the weights, matrices in the compute dtype.

    `cpu_kernels`: use the CPU FFI kernels (`cpu_gemv`, `cpu_attention`; default: when
    the compute dtype is float32 and `cpu_ffi.available()`, i.e. a single-device CPU).
    """
    c = config
    if cpu_kernels is None:
        cpu_kernels = c.jnp_dtype == jnp.float32 and cpu_ffi.available()
    elif cpu_kernels and not cpu_ffi.available():
        raise ValueError("cpu_kernels=True but the CPU kernels are not available here (see pipo_jax.kernels.cpu_ffi)")
    dt = c.jnp_dtype
    lp = params["layers"]
    d = c.hidden_size
    layers = []
    for i in range(c.num_hidden_layers):
        out_in = lambda w: w[i].reshape(d, -1).T.astype(dt)  # noqa: E731  [in=D, out] -> [out, D]
        layers.append({
            "attn_norm": lp["attn_norm"][i],
            "qkv": jnp.concatenate([out_in(lp["q_proj"]), out_in(lp["k_proj"]), out_in(lp["v_proj"])], axis=0),
            "q_norm": lp["q_norm"][i],
            "k_norm": lp["k_norm"][i],
            "o": lp["o_proj"][i].reshape(-1, d).T.astype(dt),
            "mlp_norm": lp["mlp_norm"][i],
            "gate_up": jnp.concatenate([lp["gate_proj"][i].T.astype(dt), lp["up_proj"][i].T.astype(dt)], axis=0),
            "down": lp["down_proj"][i].T.astype(dt),
        })
    return DecodeWeights(
        embed=params["embed"],
        lm_head=qwen3.lm_head_weight(c, params).T.astype(dt),
        final_norm=params["final_norm"],
        layers=tuple(layers),
        cpu_kernels=bool(cpu_kernels),
    )


def weight_bytes(weights: DecodeWeights) -> int:
    """Bytes one decode step reads from the weights (the embedding: one row per token, ~0)."""
    return sum(x.nbytes for x in jax.tree_util.tree_leaves((weights.lm_head, weights.final_norm, weights.layers)))


class DecodeCache(NamedTuple):
    """KV cache for generation: one buffer per layer, keys stored transposed.

    `k[i]` is `[B, kv_heads, head_dim, S]` and `v[i]` is `[B, kv_heads, S, head_dim]`
    for layer i; slot s holds the token at position s (as in `qwen3.KVCache`, whose
    `[layers, B, S, kv_heads, head_dim]` layout `to_kv_cache` / `from_kv_cache` convert
    to and from). Why not that layout: on XLA:CPU, slicing a layer out of a stacked
    array copies it every step, and attention over `[B, S, K, D]` keys runs 3-5x slower
    than a plain batched matmul over `[B, K, D, S]`. The width `S` is kept equal to the
    attention window (`resize_cache` grows or shrinks it) because slicing the cache
    inside a step also copies.
    """

    k: tuple  # L arrays [B, K, Dh, S]
    v: tuple  # L arrays [B, K, S, Dh]

    @property
    def max_len(self) -> int:
        return self.k[0].shape[-1]

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]


def init_cache(config: Qwen3Config, batch: int, max_len: int, dtype=None) -> DecodeCache:
    """An empty (zero) cache for `batch` rows of `max_len` positions (compute dtype by default)."""
    dtype = config.jnp_dtype if dtype is None else dtype
    k_shape = (batch, config.num_key_value_heads, config.head_dim, max_len)
    v_shape = (batch, config.num_key_value_heads, max_len, config.head_dim)
    n = config.num_hidden_layers
    return DecodeCache(tuple(jnp.zeros(k_shape, dtype) for _ in range(n)),
                       tuple(jnp.zeros(v_shape, dtype) for _ in range(n)))


def to_kv_cache(cache: DecodeCache) -> KVCache:
    """The same contents as a `qwen3.KVCache` (`[layers, B, S, kv_heads, head_dim]`)."""
    return KVCache(jnp.stack([jnp.transpose(k, (0, 3, 1, 2)) for k in cache.k]),
                   jnp.stack([jnp.transpose(v, (0, 2, 1, 3)) for v in cache.v]))


def from_kv_cache(kv: KVCache) -> DecodeCache:
    """A `qwen3.KVCache` in the decode layout."""
    n = kv.k.shape[0]
    return DecodeCache(tuple(jnp.transpose(kv.k[i], (0, 2, 3, 1)) for i in range(n)),
                       tuple(jnp.transpose(kv.v[i], (0, 2, 1, 3)) for i in range(n)))


def resize_cache(cache: DecodeCache, max_len: int) -> DecodeCache:
    """The cache with `max_len` slots: new slots are zero; shrinking drops slots `>= max_len`."""
    if max_len < 1:
        raise ValueError(f"cache length {max_len} must be >= 1")
    old = cache.max_len
    if max_len == old:
        return cache
    if max_len < old:
        return DecodeCache(tuple(k[..., :max_len] for k in cache.k), tuple(v[:, :, :max_len] for v in cache.v))
    extra = max_len - old
    return DecodeCache(tuple(jnp.pad(k, ((0, 0), (0, 0), (0, 0), (0, extra))) for k in cache.k),
                       tuple(jnp.pad(v, ((0, 0), (0, 0), (0, extra), (0, 0))) for v in cache.v))


def _linear(x: jax.Array, w_out_in: jax.Array, cpu_kernels: bool) -> jax.Array:
    """`x @ w.T` for a weight stored `[out, in]` (`cpu_gemv` for few fp32 rows with `cpu_kernels`)."""
    if cpu_kernels and cpu_gemv.use_for(x, w_out_in, KERNEL_MAX_ROWS):
        return cpu_gemv.gemv(x, w_out_in)
    return jnp.einsum("...i,oi->...o", x, w_out_in)


def _attend(q_bthd, keys_bkds, vals_bksd, allowed_bts, dtype):
    """Grouped-query attention of `T` queries per row over the cache -> `[B, T, H*Dh]`."""
    b, t, h, dh = q_bthd.shape
    k = keys_bkds.shape[1]
    q_bkgtd = jnp.transpose(q_bthd.reshape(b, t, k, h // k, dh), (0, 2, 3, 1, 4))
    s = jnp.einsum("bkgtd,bkds->bkgts", q_bkgtd, keys_bkds, preferred_element_type=jnp.float32) * dh**-0.5
    s = jnp.where(allowed_bts[:, None, None, :, :], s, jnp.finfo(jnp.float32).min)
    p = jax.nn.softmax(s, axis=-1).astype(dtype)
    o_bkgtd = jnp.einsum("bkgts,bksd->bkgtd", p, vals_bksd, preferred_element_type=jnp.float32)
    return jnp.transpose(o_bkgtd, (0, 3, 1, 2, 4)).reshape(b, t, h * dh).astype(dtype)


def _write(ck, cv, rows_bt, write_bt, k_btkd, v_btkd, one_per_row: bool):
    """Writes new keys/values at their slots, in place; slots `>= width` write nothing.

    With one token per row, an out-of-range write becomes a rewrite of slot `width-1`
    with its own old value: XLA then updates the donated buffer in place, where the
    `mode="drop"` scatter turns into a select that copies the whole cache every step.
    """
    k_btkd = k_btkd.astype(ck.dtype)
    v_btkd = v_btkd.astype(cv.dtype)
    if not one_per_row:
        return (ck.at[rows_bt, :, :, write_bt].set(k_btkd, mode="drop"),
                cv.at[rows_bt, :, write_bt, :].set(v_btkd, mode="drop"))
    width = ck.shape[-1]
    keep = (write_bt < width)[:, :, None, None]
    slot_bt = jnp.minimum(write_bt, width - 1)
    k_btkd = jnp.where(keep, k_btkd, ck[rows_bt, :, :, slot_bt])
    v_btkd = jnp.where(keep, v_btkd, cv[rows_bt, :, slot_bt, :])
    if rows_bt.shape[0] == 1:
        # A single-index scatter becomes a dynamic-update-slice that XLA:CPU fuses into
        # each consumer, copying the cache; writing the same value twice keeps a scatter.
        rows_bt, slot_bt, k_btkd, v_btkd = (jnp.concatenate([x, x]) for x in (rows_bt, slot_bt, k_btkd, v_btkd))
    return (ck.at[rows_bt, :, :, slot_bt].set(k_btkd, mode="promise_in_bounds"),
            cv.at[rows_bt, :, slot_bt, :].set(v_btkd, mode="promise_in_bounds"))


def cached_forward(
    config: Qwen3Config,
    weights: DecodeWeights,
    cache: DecodeCache,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    valid_bt: jax.Array | None = None,
) -> tuple[jax.Array, DecodeCache]:
    """Runs `T` tokens per row through the decoder with the cache; returns `(hidden_btd, cache)`.

    Same function as `qwen3.forward(config, params, tokens_bt, valid_bt, positions_bt,
    kv_cache, return_hidden=True)` (final-normed hidden states, compute dtype).

    Args:
      tokens_bt: int token ids `[B, T]`.
      positions_bt: int position of each token `[B, T]`; its key/value is written at
        that cache slot and it attends to slots `0..position`. Positions `>=
        cache.max_len` write nothing (use them for idle rows; their outputs are garbage).
      valid_bt: 0/1 `[B, T]`; invalid (padding) tokens write nothing (default all valid).
    """
    c = config
    dt = c.jnp_dtype
    eps = c.rms_norm_eps
    b, t = tokens_bt.shape
    h, k, dh = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    width = cache.max_len
    slots = jnp.arange(width)
    if valid_bt is None:
        write_bt = positions_bt
        allowed_bts = slots[None, None, :] <= positions_bt[:, :, None]
    else:
        valid_bt = valid_bt.astype(bool)
        write_bt = jnp.where(valid_bt, positions_bt, width)
        allowed_bts = (slots[None, None, :] <= positions_bt[:, :, None]) & valid_bt[:, :, None]

    x_btd = jnp.take(weights.embed, tokens_bt, axis=0).astype(dt)
    cos, sin = qwen3.rope_tables(positions_bt, dh, c.rope_theta)
    rows_bt = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
    one_token = valid_bt is None and t == 1  # a decode step
    new_k, new_v = [], []
    # Python loop: each layer's weights and cache are their own buffers (XLA:CPU copies
    # a layer out of a stacked array when a scan or a static index slices it).
    for lw, ck, cv in zip(weights.layers, cache.k, cache.v):
        hid = qwen3.rms_norm(x_btd, lw["attn_norm"], eps)
        qkv = _linear(hid, lw["qkv"], weights.cpu_kernels)
        q = qkv[..., : h * dh].reshape(b, t, h, dh)
        kk = qkv[..., h * dh : (h + k) * dh].reshape(b, t, k, dh)
        v = qkv[..., (h + k) * dh :].reshape(b, t, k, dh)
        q = qwen3.apply_rope(qwen3.rms_norm(q, lw["q_norm"], eps), cos, sin)
        kk = qwen3.apply_rope(qwen3.rms_norm(kk, lw["k_norm"], eps), cos, sin)
        ck, cv = _write(ck, cv, rows_bt, write_bt, kk, v, one_per_row=one_token)
        new_k.append(ck)
        new_v.append(cv)
        if one_token and weights.cpu_kernels and cpu_attention.use_for(q, ck):
            attn = cpu_attention.decode_attention(q[:, 0], ck, cv, positions_bt[:, 0]).reshape(b, 1, h * dh)
        else:
            attn = _attend(q, ck.astype(dt), cv.astype(dt), allowed_bts, dt)
        x_btd = x_btd + _linear(attn, lw["o"], weights.cpu_kernels)
        hid = qwen3.rms_norm(x_btd, lw["mlp_norm"], eps)
        gu = _linear(hid, lw["gate_up"], weights.cpu_kernels)
        f = gu.shape[-1] // 2
        x_btd = x_btd + _linear(jax.nn.silu(gu[..., :f]) * gu[..., f:], lw["down"], weights.cpu_kernels)
    return qwen3.rms_norm(x_btd, weights.final_norm, eps), DecodeCache(tuple(new_k), tuple(new_v))


def head_logits(weights: DecodeWeights, hidden_bd: jax.Array) -> jax.Array:
    """Float32 logits `[B, V]` of final-normed hidden states `[B, D]`."""
    if weights.cpu_kernels and cpu_gemv.use_for(hidden_bd, weights.lm_head, KERNEL_MAX_ROWS):
        return cpu_gemv.gemv(hidden_bd, weights.lm_head)
    return jnp.einsum("bd,vd->bv", hidden_bd, weights.lm_head, preferred_element_type=jnp.float32)


def decode_step(
    config: Qwen3Config,
    weights: DecodeWeights,
    cache: DecodeCache,
    tokens_b: jax.Array,
    positions_b: jax.Array,
) -> tuple[jax.Array, DecodeCache]:
    """Feeds one token per row (`tokens_b`, `positions_b` `[B]`); returns `(logits_bv, cache)`.

    Attention reads the whole cache (keep its width at the needed window with
    `resize_cache`); a position `>= cache.max_len` marks an idle row (writes nothing).
    """
    hidden_b1d, cache = cached_forward(config, weights, cache, tokens_b[:, None], positions_b[:, None])
    return head_logits(weights, hidden_b1d[:, 0]), cache


def prefill(
    config: Qwen3Config, weights: DecodeWeights, tokens_bp: jax.Array, mask_bp: jax.Array, cache_len: int,
    cache_dtype=None,
) -> tuple[jax.Array, jax.Array, DecodeCache]:
    """Runs padded prompts `[B, P]` into a fresh cache of `cache_len` slots.

    Any padding works: positions count the real tokens (`qwen3.default_positions`), so
    a row's prompt fills slots `0..len-1`. Returns `(logits_bv of each row's last real
    token, lengths_b, cache)`. Attention runs over a cache exactly `P` wide, which is
    then resized to `cache_len`.
    """
    b, p = tokens_bp.shape
    if cache_len < p:
        raise ValueError(f"cache_len={cache_len} is shorter than the padded prompt width {p}")
    mask_bp = mask_bp.astype(jnp.int32)
    cache = init_cache(config, b, p, cache_dtype)
    positions_bp = qwen3.default_positions(mask_bp)
    hidden_bpd, cache = cached_forward(config, weights, cache, tokens_bp, positions_bp, mask_bp)
    lengths_b = jnp.sum(mask_bp, axis=1)
    last_b = p - 1 - jnp.argmax(mask_bp[:, ::-1], axis=1)  # index of each row's last real token
    last_bd = jnp.take_along_axis(hidden_bpd, last_b[:, None, None], axis=1)[:, 0]
    return head_logits(weights, last_bd), lengths_b, resize_cache(cache, cache_len)
