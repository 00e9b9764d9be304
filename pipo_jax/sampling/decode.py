"""Prompt prefill into a KV cache and the cached one-token decode step, for accelerators.

The same function as `qwen3.forward(config, params, tokens, mask, positions, cache)`
(the plain path; the tests hold them equal), organised for generation:

* the layer loop takes the form `config.layer_loop` picks by target platform: on TPU / GPU
  one `lax.scan` over the stacked `params["layers"]` as stored, so a program's size does
  not grow with depth and nothing is re-laid-out per rollout; on CPU (one device: under a
  mesh it scans, see `qwen3.layers_unrolled`) unrolled over per-layer weights that
  `compute_params` slices out once per call (for one-row decode also stacking the small
  attention projections' column blocks, `one_row_layer`; a scan there copies
  every layer's weights out of the stacked arrays on every token). `compute_params` also
  casts fp32 master weights to a 16-bit compute dtype, once per call, when the two differ;
* the cache is a `qwen3.KVCache` `[layers, B, kv_heads, S, head_dim]` carried whole
  through the scan: each layer writes its new keys / values at their slots in place and
  attends over its own slice, so a decode step writes one slot per row and layer;
* prefill attends over the prompt itself with `qwen3.self_attention` (cuDNN / splash
  on accelerators, no `[T, T]` scores), then writes the prompt's keys / values; a decode
  step attends one query per row over the cache slots `0..position`;
* under a `sharding_context` the cache is constrained to `KV_CACHE_AXES` (rows over the
  batch axes, kv heads over `tensor`).

Positions index the cache as in `qwen3.KVCache`: the token at position p writes slot p;
a position `>= cache.max_len` writes nothing (idle rows).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pipo_jax.models import qwen3
from pipo_jax.models.qwen3 import KVCache, Params, Qwen3Config
from pipo_jax.parallel.context import constrain

# Logical axes of the cache `[layers, B, kv_heads, S, head_dim]`.
KV_CACHE_AXES = ("layers", "batch", "kv_heads", "cache_length", "head_dim")


# One-row decode on CPU (`compute_params`): each product is then a matrix-vector product,
# which XLA:CPU (Eigen) runs on one core for a matrix under about 3 MB (one core streams
# ~13 GB/s from memory on the benchmark VM, two ~28), and the members of a batched one on
# both. So attention projections under `STACK_BELOW_BYTES` become a `qwen3.ColumnStack` of
# `STACK_BLOCK_BYTES` blocks: q, k and v in one stack (one product, not three), o in its own.
# On the ~40M benchmark model (`experiments/benchmarks/vs_tunix.py`; q, k, v 2 MB together,
# o 1 MB: 4 and 2 blocks) this made the batch-1 decode step 7-8% faster than 16 single
# products in column blocks, and the MLP's 4 MB products, which Eigen already spreads, did
# not gain from it. Beyond one row the stacks do not pay (batch 4: 2% faster; 32: 7% slower).
STACK_BELOW_BYTES = 3 * 2**20
STACK_BLOCK_BYTES = 2**19


def stack_blocks(n_in: int, n_out: int, dtype) -> int:
    """How many `ColumnStack` blocks a one-row product with a matrix `[n_in, n_out]` of
    `dtype` takes (1: leave it whole): blocks of about `STACK_BLOCK_BYTES`, a count that
    divides `n_out`."""
    size = n_in * n_out * jnp.dtype(dtype).itemsize
    n = max(1, size // STACK_BLOCK_BYTES) if size < STACK_BELOW_BYTES else 1
    while n_out % n:
        n -= 1
    return n


def one_row_layer(layer: Params) -> Params:
    """One layer's weights for one-row decode: q, k and v as one `qwen3.ColumnStack`
    (`"qkv_proj"`) and o as another, where `stack_blocks` cuts them (else as they were)."""
    out = dict(layer)
    qkv = [layer[name] for name in ("q_proj", "k_proj", "v_proj")]
    d, dt = qkv[0].shape[0], qkv[0].dtype
    if (n := stack_blocks(d, sum(w.size for w in qkv) // d, dt)) > 1:
        out["qkv_proj"] = qwen3.ColumnStack.split(jnp.concatenate([w.reshape(d, -1) for w in qkv], axis=-1), n)
        for name in ("q_proj", "k_proj", "v_proj"):
            del out[name]
    o = layer["o_proj"]
    if (n := stack_blocks(o.size // o.shape[-1], o.shape[-1], o.dtype)) > 1:
        out["o_proj"] = qwen3.ColumnStack.split(o, n, in_dims=2)
    return out


# Multi-row decode on CPU (`compute_params`): with `TRANSPOSED_MIN_ROWS` rows or more, the
# dense weights and the head of `TRANSPOSED_MIN_BYTES` or more are stored transposed
# (`qwen3.TransposedWeight`, `[out, in]`), which XLA:CPU multiplies faster there. On the
# ~40M benchmark model (paired, one process) the decode step was 4% faster at batch 16, 2-6%
# at 32 and 7% at 64; at batch 8 it gained nothing, and the head alone at batch 4 lost 1%.
# On the 0.3M `tiny` model (64 x 64 matrices) it lost 1-5% (batch 256 / 32), hence the floor.
TRANSPOSED_MIN_ROWS = 16
TRANSPOSED_MIN_BYTES = 2**19


def transposed(w: jax.Array, in_dims: int = 1) -> jax.Array | qwen3.TransposedWeight:
    """`w` as a `qwen3.TransposedWeight` when it has `TRANSPOSED_MIN_BYTES` or more, else as is."""
    if w.size * w.dtype.itemsize < TRANSPOSED_MIN_BYTES:
        return w
    return qwen3.TransposedWeight.of(w, in_dims)


def transposed_layer(layer: Params) -> Params:
    """One layer's weights with its dense weights `transposed`."""
    return {name: transposed(w, qwen3.DENSE_IN_DIMS[name]) if name in qwen3.DENSE_IN_DIMS else w
            for name, w in layer.items()}


def in_compute_dtype(config: Qwen3Config, params: Params) -> Params:
    """`params` cast to the compute dtype (leaves already in it kept as they are)."""
    dt = config.jnp_dtype
    return jax.tree.map(lambda x: x if x.dtype == dt else x.astype(dt), params)


def compute_params(config: Qwen3Config, params: Params, rows: int | None = None) -> Params:
    """`params` laid out for the decode loop: in the compute dtype (a no-op when stored in
    it) and, with unrolled layers, `layers` as a tuple of per-layer trees (sliced once here,
    not once per token). With unrolled layers and `rows == 1` (decode steps of one row) the
    small attention projections also become column stacks (`one_row_layer`); with `rows >=
    TRANSPOSED_MIN_ROWS` the dense weights and an untied head are stored `transposed`."""
    params = in_compute_dtype(config, params)
    if qwen3.layers_unrolled(config) and not isinstance(params["layers"], tuple):
        layers = tuple(qwen3.layer_params(params, i) for i in range(config.num_hidden_layers))
        transpose = rows is not None and rows >= TRANSPOSED_MIN_ROWS
        if rows == 1:
            layers = tuple(one_row_layer(layer) for layer in layers)
        elif transpose:
            layers = tuple(transposed_layer(layer) for layer in layers)
        params = dict(params, layers=layers)
        if transpose and not config.tie_word_embeddings:
            params["lm_head"] = transposed(params["lm_head"])
    return params


def _per_layer(config: Qwen3Config, params: Params) -> tuple[Params, ...] | None:
    """The per-layer weights of an unrolled loop (from `compute_params` or sliced now), else None."""
    if isinstance(params["layers"], tuple):
        return params["layers"]
    if qwen3.layers_unrolled(config):
        return tuple(qwen3.layer_params(params, i) for i in range(config.num_hidden_layers))
    return None


def constrain_cache(cache: KVCache) -> KVCache:
    """The cache with its sharding constraint under an active `sharding_context` (else as is)."""
    return KVCache(*(constrain(x, KV_CACHE_AXES) for x in cache))


def init_cache(config: Qwen3Config, batch: int, max_len: int, dtype=None) -> KVCache:
    """An empty (zero) cache for `batch` rows of `max_len` positions (compute dtype by default)."""
    return constrain_cache(qwen3.init_cache(config, batch, max_len, dtype))


def resize_cache(cache: KVCache, max_len: int) -> KVCache:
    """The cache with `max_len` slots: new slots are zero; shrinking drops slots `>= max_len`."""
    if max_len < 1:
        raise ValueError(f"cache length {max_len} must be >= 1")
    old = cache.max_len
    if max_len == old:
        return cache
    if max_len < old:
        return constrain_cache(KVCache(cache.k[:, :, :, :max_len], cache.v[:, :, :, :max_len]))
    pad = ((0, 0), (0, 0), (0, 0), (0, max_len - old), (0, 0))
    return constrain_cache(KVCache(jnp.pad(cache.k, pad), jnp.pad(cache.v, pad)))


def _write(c_lbksd, layer, rows_bt, slots_bt, x_btkd):
    """Writes `x` at (layer, row, slot) of the stacked cache; slots `>= width` write nothing."""
    return c_lbksd.at[layer, rows_bt, :, slots_bt].set(x_btkd.astype(c_lbksd.dtype), mode="drop")


def cached_forward(
    config: Qwen3Config,
    params: Params,
    cache: KVCache,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    valid_bt: jax.Array | None = None,
    *,
    prefill: bool = False,
) -> tuple[jax.Array, KVCache]:
    """Runs `T` tokens per row through the decoder with the cache; returns `(hidden_btd, cache)`.

    Same function as `qwen3.forward(config, params, tokens_bt, valid_bt, positions_bt,
    cache, return_hidden=True)` (final-normed hidden states, compute dtype).

    Args:
      params: as stored, or as `compute_params` lays them out.
      tokens_bt: int token ids `[B, T]`.
      positions_bt: int position of each token `[B, T]`; its key/value is written at
        that cache slot and it attends to slots `0..position`. Positions `>=
        cache.max_len` write nothing (idle rows; their outputs are garbage).
      valid_bt: 0/1 `[B, T]`; invalid (padding) tokens write nothing (default all valid).
      prefill: the cache holds nothing these rows can see (a fresh prompt): attention
        runs over the `T` tokens themselves (`qwen3.self_attention`, fused on
        accelerators) instead of over the cache slots.
    """
    c = config
    b, t = tokens_bt.shape
    width = cache.max_len
    valid_bt = jnp.ones((b, t), bool) if valid_bt is None else valid_bt.astype(bool)
    slots_bt = jnp.where(valid_bt, positions_bt, width)
    rows_bt = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
    allowed_bts = None
    if not prefill:
        allowed_bts = (jnp.arange(width)[None, None, :] <= positions_bt[:, :, None]) & valid_bt[:, :, None]

    x_btd = constrain(jnp.take(params["embed"], tokens_bt, axis=0).astype(c.jnp_dtype), qwen3.RESIDUAL_AXES)
    cos, sin = qwen3.rope_tables(positions_bt, c.head_dim, c.rope_theta)

    def layer(carry, xs):
        x_btd, ck, cv = carry
        lp, i = xs
        q, k, v = qwen3.layer_qkv(c, x_btd, lp, cos, sin)
        ck = _write(ck, i, rows_bt, slots_bt, k)
        cv = _write(cv, i, rows_bt, slots_bt, v)
        if prefill:
            a = qwen3.self_attention(c, q, k, v, valid_bt)
        else:
            a = qwen3.cached_attention(q, ck[i].astype(c.jnp_dtype), cv[i].astype(c.jnp_dtype), allowed_bts,
                                       c.jnp_dtype)
        x_btd = constrain(qwen3.layer_out(c, x_btd, lp, a), qwen3.RESIDUAL_AXES)
        return (x_btd, ck, cv), None

    per_layer = _per_layer(c, params)
    if per_layer is None:
        layers = jnp.arange(c.num_hidden_layers)
        (x_btd, ck, cv), _ = jax.lax.scan(layer, (x_btd, cache.k, cache.v), (params["layers"], layers))
    else:
        carry = (x_btd, cache.k, cache.v)
        for i, lp in enumerate(per_layer):
            carry, _ = layer(carry, (lp, i))
        x_btd, ck, cv = carry
    return qwen3.rms_norm(x_btd, params["final_norm"], c.rms_norm_eps), constrain_cache(KVCache(ck, cv))


def head_logits(config: Qwen3Config, params: Params, hidden_bd: jax.Array) -> jax.Array:
    """Float32 logits `[B, V]` of final-normed hidden states `[B, D]` (the head as stored, or
    `transposed` by `compute_params`)."""
    if config.tie_word_embeddings:
        w, spec = params["embed"], "bd,vd->bv"
    elif isinstance(params["lm_head"], qwen3.TransposedWeight):
        w, spec = params["lm_head"].w_oi, "bd,vd->bv"
    else:
        w, spec = params["lm_head"], "bd,dv->bv"
    return jnp.einsum(spec, hidden_bd, w.astype(config.jnp_dtype), preferred_element_type=jnp.float32)


def decode_step(
    config: Qwen3Config,
    params: Params,
    cache: KVCache,
    tokens_b: jax.Array,
    positions_b: jax.Array,
) -> tuple[jax.Array, KVCache]:
    """Feeds one token per row (`tokens_b`, `positions_b` `[B]`); returns `(logits_bv, cache)`.

    Attention reads the whole cache (keep its width at the needed window with
    `resize_cache`); a position `>= cache.max_len` marks an idle row (writes nothing).
    """
    hidden_b1d, cache = cached_forward(config, params, cache, tokens_b[:, None], positions_b[:, None])
    return head_logits(config, params, hidden_b1d[:, 0]), cache


def prefill(
    config: Qwen3Config, params: Params, tokens_bp: jax.Array, mask_bp: jax.Array, cache_len: int,
    cache_dtype=None,
) -> tuple[jax.Array, jax.Array, KVCache]:
    """Runs padded prompts `[B, P]` into a fresh cache of `cache_len` slots.

    Any padding works: positions count the real tokens (`qwen3.default_positions`), so
    a row's prompt fills slots `0..len-1`. Returns `(logits_bv of each row's last real
    token, lengths_b, cache)`.
    """
    b, p = tokens_bp.shape
    if cache_len < p:
        raise ValueError(f"cache_len={cache_len} is shorter than the padded prompt width {p}")
    mask_bp = mask_bp.astype(jnp.int32)
    cache = init_cache(config, b, cache_len, cache_dtype)
    positions_bp = qwen3.default_positions(mask_bp)
    hidden_bpd, cache = cached_forward(config, params, cache, tokens_bp, positions_bp, mask_bp, prefill=True)
    lengths_b = jnp.sum(mask_bp, axis=1)
    last_b = p - 1 - jnp.argmax(mask_bp[:, ::-1], axis=1)  # index of each row's last real token
    last_bd = jnp.take_along_axis(hidden_bpd, last_b[:, None, None], axis=1)[:, 0]
    return head_logits(config, params, last_bd), lengths_b, cache
