"""Fused LM head + log-softmax + gather (+ entropy) without materialising the logits.

For every token n with final hidden state `h_n` and target id `t_n`:

    z_nv    = (h_n . w_:,v) / temperature          (fp32 accumulation)
    lse_n   = logsumexp_v z_nv
    logp_n  = z_n,t_n - lse_n
    entropy_n = lse_n - sum_v softmax(z_n)_v * z_nv

Implementations (all behind `token_logprobs(h, w, t, cfg)`, `cfg.impl`; `kernel_config(...)`
validates and resolves the static settings into a `KernelConfig`):

* `reference`: the full [N, V] fp32 logits and plain autodiff. The spec.
* `chunked`: pure XLA. Loops over vocab blocks (outer) and token blocks (inner) with an
  online fp32 (max, sum-exp, sum (z-max)*exp, target logit) accumulation. A
  `jax.custom_vjp` saves only the per-token lse (and entropy) and recomputes each logits
  block in the backward pass, so at most one [block_n, block_v] block of logits exists.
* `pallas`: Pallas kernels (`logprobs_pallas.py`) with the same forward/backward split:
  a Mosaic-TPU grid kernel and a Triton (GPU) kernel; both run on CPU in interpret mode.

Both fast paths share the block math of `softmax_stats.py` (`online_update`, `finalize`,
`dlogits`) and one `custom_vjp` (`_softmax_stats`), whose outputs are the per-token
(lse, target logit[, entropy]) and whose backward takes a cotangent for each of them.
`token_logprobs_vocab_parallel` composes the same primitive with collectives for a
vocab-sharded head under `shard_map`.

Padding rows: pass `valid_n` (bool [N]); invalid rows give logp = entropy = 0 and zero
gradients, whatever their hidden state or target holds (their hidden state is replaced
by zeros before the matmul, so even NaN padding cannot leak). A *valid* row whose
target lies outside [0, V) yields NaN (a bad-input signal; eager calls raise instead).
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pipo_jax import platforms
from pipo_jax.kernels import logprobs_pallas
from pipo_jax.kernels.softmax_stats import (KernelConfig, align_varying, compute_dtype, dlogits, dot_f32, dot_nt,
                                            finalize, init_stats, online_update, pad_rows, token_entropy,
                                            varying_axes, vary_like)

IMPLS = ("auto", "reference", "chunked", "pallas")
PALLAS_VARIANTS = ("auto", "mosaic_tpu", "triton")

# Chunked-XLA (block_n, block_v) per target platform. Each inner step multiplies a
# [block_n, D] slice of h by a [D, block_v] slice of w and holds a few fp32
# [block_n, block_v] blocks (logits, exp, cotangent).
CHUNKED_BLOCKS = {
    # Measured on a 2-core CPU for D in {2560, 4096}, V = 151,936
    # (experiments/benchmarks/logprobs.py): one fp32 block = 32 MiB.
    "cpu": (1024, 8192),
    # Accelerators, not yet timed on hardware. The w block is loaded once per vocab step
    # and the h block once per inner step, so the inner matmul does block_v FLOP per
    # byte of h (bf16): 8192 is far above every target's ridge (H20 148 TFLOP/s / 4 TB/s
    # ~ 37, TPU v5p ~ 166, H100 ~ 295). block_n = 2048 halves the loop trips of the CPU
    # choice (each trip is a few kernel launches on a GPU) at 64 MiB per fp32 block, small
    # next to the 48 GB per-device budget.
    "cuda": (2048, 8192),
    "tpu": (2048, 8192),
}

# ----------------------------------------------------------------------------------------
# chunked: pure XLA
# ----------------------------------------------------------------------------------------

_HALF_FLOATS = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))

# XLA:CPU specifics (KernelConfig.xla_cpu). (1) It has no native 16-bit-float data
# movement: float normalisation turns a bf16 dynamic-slice of w inside a loop into a
# slice of an fp32 copy of the *whole* w (hoisted out of the loop: 2x the size of w in
# extra memory), and a bf16 dynamic-update-slice of dw into an fp32 carry converted back
# on every iteration. So w is sliced inside a trivially-true `lax.cond` (whose branch the
# hoisting cannot reach) and 16-bit loop state is kept as uint16 bit patterns (the bf16
# dw is then one bit-cast copy of the uint16 accumulator: a second w-sized buffer that
# other backends, which update bf16 in place, do not need). (2) CPUs
# without bf16 units run fp32 matmuls ~1.5x faster than bf16 ones, so the block
# matmuls take fp32 operands (exact upcasts; accumulation is fp32 either way).


def _to_bits(x: jax.Array, xla_cpu: bool) -> jax.Array:
    """On XLA:CPU, 16-bit floats as uint16 bit patterns; otherwise x unchanged."""
    return lax.bitcast_convert_type(x, jnp.uint16) if xla_cpu and x.dtype in _HALF_FLOATS else x


def _from_bits(x: jax.Array, dtype) -> jax.Array:
    """Inverse of `_to_bits`."""
    return lax.bitcast_convert_type(x, dtype) if x.dtype != jnp.dtype(dtype) else x


def _slice_columns(w: jax.Array, start, width: int, xla_cpu: bool) -> jax.Array:
    """w[:, start : start + width] for a traced start (see the XLA:CPU note above)."""

    def take(w):
        return lax.dynamic_slice_in_dim(w, start, width, axis=1)

    if not xla_cpu:
        return take(w)
    return lax.cond(start >= 0, take, take, w)


def _matmul_dtype(cfg: KernelConfig, h: jax.Array, w: jax.Array):
    """Operand dtype of the chunked block matmuls (and of the logits cotangent)."""
    return jnp.dtype(jnp.float32) if cfg.xla_cpu else compute_dtype(h, w)


def _token_blocks(n: int, block_n: int) -> tuple[int, int]:
    """(block size, number of blocks) covering n tokens."""
    bn = max(1, min(block_n, n))
    return bn, -(-n // bn)


def _vocab_blocks(v: int, block_v: int) -> tuple[int, int, int]:
    """(block size, number of full blocks, tail width) covering v columns."""
    bv = max(1, min(block_v, v))
    return bv, v // bv, v % bv


def _chunked_forward(cfg: KernelConfig, h, w, t):
    """h [N, D], w [D, V], t [N] int32 -> (lse, zt, ent) [N] fp32 (ent None if unused).

    Outer loop over the full vocab blocks (then the static tail block), inner loop over
    token blocks; the per-token online-softmax state is [nb, bn, 1] fp32.
    """
    n, d = h.shape
    v = w.shape[1]
    bn, nb = _token_blocks(n, cfg.block_n)
    bv, nvf, tail = _vocab_blocks(v, cfg.block_v)
    mdt = _matmul_dtype(cfg, h, w)
    h_b = pad_rows(h.astype(mdt), nb * bn).reshape(nb, bn, d)
    t_b = pad_rows(t, nb * bn).reshape(nb, bn, 1)

    def vocab_step(stats, w_blk, col0):
        w_blk = w_blk.astype(mdt)
        cols = col0 + lax.broadcasted_iota(jnp.int32, (1, w_blk.shape[1]), 1)

        def token_step(i, stats):
            z = dot_f32(h_b[i], w_blk) * cfg.inv_temperature
            block = tuple(x[i] for x in stats)
            new = online_update(block, z, cols == t_b[i], cfg.with_entropy)
            return tuple(x.at[i].set(y) for x, y in zip(stats, new))

        return lax.fori_loop(0, nb, token_step, stats)

    def full_block(j, stats):
        return vocab_step(stats, _slice_columns(w, j * bv, bv, cfg.xla_cpu), j * bv)

    stats = lax.fori_loop(0, nvf, full_block, vary_like(init_stats((nb, bn, 1)), h, w, t))
    if tail:
        stats = vocab_step(stats, w[:, nvf * bv :], nvf * bv)
    lse, zt, ent = (x.reshape(nb * bn)[:n] for x in finalize(stats))
    return lse, zt, (ent if cfg.with_entropy else None)


def _chunked_backward(cfg: KernelConfig, h, w, t, lse, ent, g_lse, g_zt, g_ent):
    """Recomputes logits blockwise; returns (dh [N, D] h.dtype, dw [D, V] w.dtype).

    Outer loop over vocab blocks, inner over token blocks: dw of a vocab block is
    complete after its inner loop (an fp32 [D, block_v] accumulator), while dh
    accumulates in fp32 [N, D] across vocab blocks. Fixed loop order: deterministic.
    """
    n, d = h.shape
    v = w.shape[1]
    bn, nb = _token_blocks(n, cfg.block_n)
    bv, nvf, tail = _vocab_blocks(v, cfg.block_v)
    mdt = _matmul_dtype(cfg, h, w)
    refs = (h, w, t, lse, ent, g_lse, g_zt, g_ent)  # loop carries vary like these under shard_map
    h_b = pad_rows(h.astype(mdt), nb * bn).reshape(nb, bn, d)
    # h^T blocks so that dw_blk = h_i^T dz is a plain [D, bn] x [bn, bv] matmul (XLA:CPU
    # runs the transposed-lhs form at about half speed).
    ht_b = h_b.transpose(0, 2, 1)

    def per_token(x):  # [N] -> [nb, bn, 1]
        return pad_rows(x.reshape(n, 1), nb * bn).reshape(nb, bn, 1)

    t_b, lse_b, g_lse_b, g_zt_b = map(per_token, (t, lse, g_lse, g_zt))
    ent_b = per_token(ent) if cfg.with_entropy else None
    g_ent_b = per_token(g_ent) if cfg.with_entropy else None

    def vocab_step(dh_acc, w_blk, col0):
        w_blk = w_blk.astype(mdt)
        width = w_blk.shape[1]
        cols = col0 + lax.broadcasted_iota(jnp.int32, (1, width), 1)

        def token_step(i, carry):
            dh_acc, dw_blk = carry
            z = dot_f32(h_b[i], w_blk) * cfg.inv_temperature
            dz = dlogits(
                z,
                cols == t_b[i],
                lse_b[i],
                ent_b[i] if cfg.with_entropy else None,
                g_lse_b[i],
                g_zt_b[i],
                g_ent_b[i] if cfg.with_entropy else None,
                cfg.with_entropy,
            )
            dz = (dz * cfg.inv_temperature).astype(mdt)
            dh_acc = dh_acc.at[i].add(dot_nt(dz, w_blk))
            return dh_acc, dw_blk + dot_f32(ht_b[i], dz)

        init = (dh_acc, vary_like(jnp.zeros((d, width), jnp.float32), *refs))
        return lax.fori_loop(0, nb, token_step, init)

    def write_dw(dw_bits, dw_blk, col0):
        update = _to_bits(dw_blk.astype(w.dtype), cfg.xla_cpu)
        return lax.dynamic_update_slice_in_dim(dw_bits, update, col0, axis=1)

    def full_block(j, carry):
        dh_acc, dw_bits = carry
        w_blk = _slice_columns(w, j * bv, bv, cfg.xla_cpu)
        dh_acc, dw_blk = vocab_step(dh_acc, w_blk, j * bv)
        return dh_acc, write_dw(dw_bits, dw_blk, j * bv)

    # dw is built in place, block by block (as uint16 bits on XLA:CPU, see above).
    dw_bits = jnp.zeros((d, v), _to_bits(jnp.zeros((), w.dtype), cfg.xla_cpu).dtype)
    carry = vary_like((jnp.zeros((nb, bn, d), jnp.float32), dw_bits), *refs)
    dh_acc, dw_bits = lax.fori_loop(0, nvf, full_block, carry)
    if tail:
        dh_acc, dw_blk = vocab_step(dh_acc, w[:, nvf * bv :], nvf * bv)
        dw_bits = write_dw(dw_bits, dw_blk, nvf * bv)
    dh = dh_acc.reshape(nb * bn, d)[:n].astype(h.dtype)
    return dh, _from_bits(dw_bits, w.dtype)


# ----------------------------------------------------------------------------------------
# The differentiable primitive: per-token (lse, target logit[, entropy]).
# ----------------------------------------------------------------------------------------


def _stats_forward(cfg: KernelConfig, h, w, t):
    if cfg.impl == "chunked":
        return _chunked_forward(cfg, h, w, t)
    return logprobs_pallas.forward(cfg, h, w, t)


def _stats_backward(cfg: KernelConfig, h, w, t, lse, ent, g_lse, g_zt, g_ent):
    if cfg.impl == "chunked":
        return _chunked_backward(cfg, h, w, t, lse, ent, g_lse, g_zt, g_ent)
    return logprobs_pallas.backward(cfg, h, w, t, lse, ent, g_lse, g_zt, g_ent)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _softmax_stats(cfg: KernelConfig, h, w, t):
    """h [N, D], w [D, V], t [N] int32 -> (lse [N], zt [N]) or (lse, zt, entropy), fp32.

    zt is the logit at column t (0 when t is outside [0, V)).
    """
    lse, zt, ent = _stats_forward(cfg, h, w, t)
    return (lse, zt, ent) if cfg.with_entropy else (lse, zt)


def _softmax_stats_fwd(cfg: KernelConfig, h, w, t):
    lse, zt, ent = _stats_forward(cfg, h, w, t)
    out = (lse, zt, ent) if cfg.with_entropy else (lse, zt)
    return out, (h, w, t, lse, ent)


def _softmax_stats_bwd(cfg: KernelConfig, residuals, cotangents):
    h, w, t, lse, ent = residuals
    g_lse, g_zt = cotangents[0], cotangents[1]
    g_ent = cotangents[2] if cfg.with_entropy else None
    dh, dw = _stats_backward(cfg, h, w, t, lse, ent, g_lse, g_zt, g_ent)
    return _sum_to_primal(dh, h), _sum_to_primal(dw, w), None


_softmax_stats.defvjp(_softmax_stats_fwd, _softmax_stats_bwd)


def _reference_stats(h, w, t, inv_temperature: float, with_entropy: bool):
    """Plain-autodiff twin of `_softmax_stats` (full fp32 logits)."""
    z = dot_f32(h, w) * inv_temperature
    lse = jax.nn.logsumexp(z, axis=-1)
    cols = jnp.arange(w.shape[1], dtype=jnp.int32)
    zt = jnp.sum(jnp.where(cols[None, :] == t[:, None], z, 0.0), axis=-1)
    if not with_entropy:
        return lse, zt
    return lse, zt, token_entropy(z)


# ----------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------


def _resolve_impl(impl: str) -> str:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        # The Pallas kernels are validated in interpret mode and lower for TPU (Mosaic)
        # and GPU (Triton), but have not been compiled and timed on hardware yet, so the
        # chunked XLA path is the default on every backend.
        return "chunked"
    return impl


def _resolve_temperature(temperature: Any) -> float:
    if isinstance(temperature, jax.core.Tracer):
        raise TypeError(
            "temperature must be a static Python float (it is folded into the kernel); "
            "got a traced value. Mark it static in jax.jit."
        )
    value = float(temperature)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"temperature must be a finite float > 0, got {temperature!r}")
    return value


def kernel_config(
    *,
    impl: str = "auto",
    temperature: float = 1.0,
    with_entropy: bool = False,
    block_n: int | None = None,
    block_v: int | None = None,
    block_d: int | None = None,
    interpret: bool | None = None,
    pallas_variant: str = "auto",
    platform: str = "cpu",
) -> KernelConfig:
    """The `KernelConfig` of a `token_logprobs` call, validated (a ValueError names the setting).

    impl: "auto" (= "chunked" on every backend), "reference", "chunked" or "pallas".
    temperature: static Python float > 0. with_entropy: also return the per-token entropy (nats).
    block_n, block_v: token / vocab block sizes (chunked defaults per platform in
    `CHUNKED_BLOCKS`; Pallas defaults depend on the kernel variant). block_d: hidden chunk of
    the Triton kernel (default: the largest of 64, 32, 16 dividing D). interpret: Pallas
    interpret mode; None = True exactly when `platform` is "cpu". pallas_variant: "auto"
    (Triton for "cuda", the Mosaic TPU kernel otherwise), "mosaic_tpu" or "triton".
    platform: the platform the program is for (`pipo_jax.platforms.PLATFORMS`), not the
    host's: it picks the block sizes, interpret mode and the XLA:CPU workarounds.
    """
    impl = _resolve_impl(impl)
    temperature = _resolve_temperature(temperature)
    platforms.check(platform)
    if impl == "pallas":
        variant = logprobs_pallas.resolve_variant(pallas_variant, platform)
        defaults = logprobs_pallas.default_blocks(variant)
        interpret = platform == "cpu" if interpret is None else bool(interpret)
    else:
        if pallas_variant not in PALLAS_VARIANTS:
            raise ValueError(f"pallas_variant must be one of {PALLAS_VARIANTS}, got {pallas_variant!r}")
        variant = "mosaic_tpu"
        defaults = (*CHUNKED_BLOCKS[platform], None)
        interpret = False
    blocks = []
    for name, given, default in zip(("block_n", "block_v", "block_d"), (block_n, block_v, block_d), defaults):
        value = default if given is None else given
        if value is not None and (int(value) != value or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {given!r}")
        blocks.append(None if value is None else int(value))
    return KernelConfig(
        impl=impl,
        inv_temperature=1.0 / temperature,
        with_entropy=with_entropy,
        block_n=blocks[0],
        block_v=blocks[1],
        block_d=blocks[2],
        interpret=interpret,
        variant=variant,
        xla_cpu=platform == "cpu",
    )


def _check_inputs(hidden_nd, w_dv, targets_n, valid_n) -> None:
    if hidden_nd.ndim != 2:
        raise ValueError(f"hidden_nd must be [N, D], got shape {hidden_nd.shape}")
    if w_dv.ndim != 2 or w_dv.shape[0] != hidden_nd.shape[1]:
        raise ValueError(
            f"w_dv must be [D, V] with D = hidden_nd.shape[1] = {hidden_nd.shape[1]}, "
            f"got shape {w_dv.shape}"
        )
    if targets_n.shape != hidden_nd.shape[:1]:
        raise ValueError(f"targets_n must be [N] = {hidden_nd.shape[:1]}, got shape {targets_n.shape}")
    if not jnp.issubdtype(targets_n.dtype, jnp.integer):
        raise ValueError(f"targets_n must be integer token ids, got dtype {targets_n.dtype}")
    for name, x in (("hidden_nd", hidden_nd), ("w_dv", w_dv)):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name} must be floating point, got dtype {x.dtype}")
    if valid_n is not None and valid_n.shape != targets_n.shape:
        raise ValueError(f"valid_n must have the shape of targets_n {targets_n.shape}, got {valid_n.shape}")


def _check_target_range(targets_n, valid_n, lo: int, hi: int, name: str) -> None:
    """Eagerly rejects out-of-range targets on valid rows when the values are concrete."""
    if isinstance(targets_n, jax.core.Tracer) or isinstance(valid_n, jax.core.Tracer):
        return
    t = np.asarray(targets_n)
    bad = (t < lo) | (t >= hi)
    if valid_n is not None:
        bad &= np.asarray(valid_n, dtype=bool)
    if bad.any():
        row = int(np.argmax(bad))
        raise ValueError(f"{name}[{row}] = {int(t[row])} is outside the vocabulary [{lo}, {hi})")


def _reference_logprobs(h, w, t, inv_temperature: float, with_entropy: bool):
    """The spec: full [N, V] fp32 logits, log_softmax, gather; plain autodiff."""
    z = dot_f32(h, w) * inv_temperature
    logp_all = jax.nn.log_softmax(z, axis=-1)
    logp = jnp.take_along_axis(logp_all, t[:, None], axis=-1, mode="fill", fill_value=jnp.nan)[:, 0]
    if not with_entropy:
        return logp, None
    return logp, token_entropy(z)


def token_logprobs(
    hidden_nd: jax.Array,
    w_dv: jax.Array,
    targets_n: jax.Array,
    cfg: KernelConfig | None = None,
    *,
    valid_n: jax.Array | None = None,
):
    """Per-token log p(target) (and entropy) under softmax((hidden @ w) * cfg.inv_temperature).

    Args:
      hidden_nd: [N, D] final hidden states (fp32 or bf16).
      w_dv: [D, V] LM-head weight (fp32 or bf16).
      targets_n: [N] integer target ids in [0, V).
      cfg: the static settings (`kernel_config(...)`; None: `kernel_config()`).
      valid_n: optional [N] bool; invalid rows return 0 and get zero gradients.

    Returns:
      logp_n [N] fp32 (NaN on valid rows whose target is outside [0, V)), and if
      cfg.with_entropy also entropy_n [N] fp32. Differentiable in hidden_nd and w_dv.
    """
    _check_inputs(hidden_nd, w_dv, targets_n, valid_n)
    cfg = kernel_config() if cfg is None else cfg
    return_entropy = cfg.with_entropy
    v = w_dv.shape[1]
    _check_target_range(targets_n, valid_n, 0, v, "targets_n")
    t = targets_n.astype(jnp.int32)
    h = hidden_nd
    if valid_n is not None:
        h = jnp.where(valid_n[:, None], h, jnp.zeros((), h.dtype))

    if cfg.impl == "reference":
        logp, ent = _reference_logprobs(h, w_dv, t, cfg.inv_temperature, return_entropy)
    else:
        h, w_dv, t = align_varying(h, w_dv, t)
        stats = _softmax_stats(cfg, h, w_dv, t)
        in_vocab = (t >= 0) & (t < v)
        logp = jnp.where(in_vocab, stats[1] - stats[0], jnp.nan)
        ent = stats[2] if return_entropy else None

    if valid_n is not None:
        logp = jnp.where(valid_n, logp, 0.0)
        ent = None if ent is None else jnp.where(valid_n, ent, 0.0)
    return (logp, ent) if return_entropy else logp


def token_logprobs_vocab_parallel(
    hidden_nd: jax.Array,
    w_dv_shard: jax.Array,
    targets_n: jax.Array,
    cfg: KernelConfig | None = None,
    *,
    axis_name: str,
    valid_n: jax.Array | None = None,
):
    """`token_logprobs` for a vocab-sharded LM head; call inside `shard_map`.

    w_dv_shard is this shard's [D, V_local] column slice of w; shard k (its index along
    `axis_name`) must own global columns [k * V_local, (k+1) * V_local), which is what
    `shard_map(..., in_specs=P(None, axis_name))` gives. hidden_nd, targets_n, valid_n
    are the same on every shard of `axis_name`; targets are global ids. Each shard
    computes its partial (lse, entropy, target logit) over its slice; these are merged
    with pmax / psum: lse = logsumexp_k lse_k, entropy = sum_k q_k (H_k - log q_k) with
    q_k = exp(lse_k - lse), and the target logit comes only from the shard owning it.
    Only per-token [N] vectors cross the axis; the [N, V] logits are never gathered.
    Returns logp_n (, entropy_n), replicated over `axis_name`. `cfg` and `valid_n` as in
    `token_logprobs`; impl="pallas" in interpret mode (CPU) needs the enclosing
    shard_map to use check_vma=False (see logprobs_pallas.py).
    """
    _check_inputs(hidden_nd, w_dv_shard, targets_n, valid_n)
    cfg = kernel_config() if cfg is None else cfg
    return_entropy = cfg.with_entropy
    v_local = w_dv_shard.shape[1]
    t = targets_n.astype(jnp.int32)
    t_local = t - lax.axis_index(axis_name) * v_local
    h = hidden_nd
    if valid_n is not None:
        h = jnp.where(valid_n[:, None], h, jnp.zeros((), h.dtype))
    h, w_dv_shard, t_local = align_varying(h, w_dv_shard, t_local, extra_axes=(axis_name,))

    if cfg.impl == "reference":
        stats = _reference_stats(h, w_dv_shard, t_local, cfg.inv_temperature, return_entropy)
    else:
        stats = _softmax_stats(cfg, h, w_dv_shard, t_local)
    lse_local, zt_local = stats[0], stats[1]

    # Any finite shift is exact; stop_gradient goes first because pmax has no derivative rule.
    m = lax.pmax(lax.stop_gradient(lse_local), axis_name)
    lse = m + jnp.log(lax.psum(jnp.exp(lse_local - m), axis_name))
    owned = ((t_local >= 0) & (t_local < v_local)).astype(jnp.int32)
    found = lax.psum(owned, axis_name) == 1
    logp = jnp.where(found, lax.psum(zt_local, axis_name) - lse, jnp.nan)
    ent = None
    if return_entropy:
        log_q = lse_local - lse  # log of this shard's share of the probability mass
        ent = lax.psum(jnp.exp(log_q) * (stats[2] - log_q), axis_name)
    if valid_n is not None:
        logp = jnp.where(valid_n, logp, 0.0)
        ent = None if ent is None else jnp.where(valid_n, ent, 0.0)
    return (logp, ent) if return_entropy else logp


def _sum_to_primal(ct, primal):
    """Under `shard_map`, sums a cotangent over the mesh axes it varies over but its primal
    does not (e.g. dw of a head replicated over the batch axes); identity elsewhere."""
    extra = tuple(sorted(varying_axes(ct) - varying_axes(primal)))
    return lax.psum(ct, extra) if extra else ct
