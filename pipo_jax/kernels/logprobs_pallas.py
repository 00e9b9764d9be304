"""Pallas kernels for the fused log-prob primitive of `logprobs.py`.

Two kernel families compute the same per-token (lse, target logit[, entropy]) and, in
the backward pass, dh and dw from per-token cotangents, recomputing logits blockwise:

* `mosaic_tpu` (TPU; also what runs in interpret mode on CPU by default). Grid
  kernels: the forward and the dh kernel use grid (token blocks "parallel", vocab
  blocks "arbitrary") and keep the online-softmax state / dh accumulator in VMEM
  scratch across the minor vocab axis; the dw kernel uses grid (vocab blocks
  "parallel", token blocks "arbitrary") with an fp32 [D, block_v] accumulator.
* `triton` (GPU). Triton programs cannot carry state across grid steps, so each
  program owns rows (forward, dh) or vocab columns (dw) and loops over the other axis
  in-kernel, with the hidden dimension chunked by block_d. Out-of-vocab columns of the
  last w tile are loaded with a mask. dh and dw are accumulated in fp32 outputs owned
  by one program each (no atomics).

Both: the vocabulary tail block (V not divisible by block_v) is masked to -inf in the
logits and to 0 in the logits cotangent and in w (padded HBM reads may hold anything,
NaN included), tokens are padded to a multiple of block_n with zero rows, and the
reduction order is fixed (deterministic).

Validation status: both families are tested against the reference in interpret mode
and lower through Mosaic (TPU) and Triton (GPU) from a CPU host (tests/kernels), but
neither has been compiled or timed on a TPU or GPU yet; `impl="auto"` therefore does
not select them. Under `shard_map` the kernels' outputs carry the operands' varying
axes, so they lower with check_vma=True; JAX's Pallas *interpreter*, however, cannot
evaluate a kernel on vma-typed values, so interpret mode inside `shard_map` needs
check_vma=False (tests/kernels/vocab_parallel_case.py does both).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

from pipo_jax.kernels.softmax_stats import (KernelConfig, align_varying, compute_dtype, dlogits, dot_f32, dot_nt,
                                            finalize, init_stats, online_update, pad_rows, varying_axes)

VARIANTS = ("mosaic_tpu", "triton")
# (block_n, block_v, block_d) per kernel family; not yet timed on hardware (module doc).
_DEFAULT_BLOCKS = {
    # TPU: each grid step holds an h block [256, D] and a w block [D, 512] (bf16, double
    # buffered) and an fp32 [256, 512] logits tile in VMEM: ~13 MiB at D = 4096, inside
    # the 64 MiB limit set below; the w block is reused by 256 rows (256 FLOP per byte of
    # w, above the v5p ridge ~166), and 512 / 256 are multiples of the 128-lane tiles.
    "mosaic_tpu": (256, 512, None),
    # GPU (Triton): a program's [64, 128] fp32 logits tile plus a [64, block_d] h and a
    # [block_d, 128] w tile fit in registers / shared memory at block_d <= 64.
    "triton": (64, 128, None),
}
_TPU_VMEM_LIMIT_BYTES = 64 * 1024 * 1024


def resolve_variant(variant: str, platform: str) -> str:
    """'auto' -> 'triton' for a "cuda" target, 'mosaic_tpu' for TPU and CPU (interpret)."""
    if variant == "auto":
        return "triton" if platform == "cuda" else "mosaic_tpu"
    if variant not in VARIANTS:
        raise ValueError(f"pallas_variant must be 'auto' or one of {VARIANTS}, got {variant!r}")
    return variant


def default_blocks(variant: str) -> tuple[int, int, int | None]:
    return _DEFAULT_BLOCKS[variant]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _per_token(x: jax.Array | None, rows: int) -> jax.Array | None:
    """[N] vector -> zero-padded [rows, 1] column (the kernels' per-token layout)."""
    if x is None:
        return None
    return pad_rows(x.reshape(-1, 1), rows)


def _triton_config(cfg: KernelConfig, d: int) -> KernelConfig:
    """cfg with block_d resolved for hidden size d, after checking the Triton tiling rules."""
    if cfg.block_d is None:
        fits = [b for b in (64, 32, 16) if d % b == 0]
        if not fits:
            raise ValueError(f"triton kernel: hidden size D = {d} must be a multiple of 16")
        cfg = dataclasses.replace(cfg, block_d=fits[0])
    _check_triton_blocks(cfg, d)
    return cfg


def _check_triton_blocks(cfg: KernelConfig, d: int) -> None:
    for name, value in (("block_n", cfg.block_n), ("block_v", cfg.block_v), ("block_d", cfg.block_d)):
        if value < 16 or value & (value - 1):
            raise ValueError(f"triton kernel: {name} must be a power of two >= 16, got {value}")
    if d % cfg.block_d:
        raise ValueError(f"triton kernel: hidden size D = {d} must be divisible by block_d = {cfg.block_d}")


def _out(shape: tuple[int, ...], dtype, like: jax.Array) -> jax.ShapeDtypeStruct:
    """Output struct varying over the same shard_map axes as `like` (operands are aligned)."""
    if not varying_axes(like):
        return jax.ShapeDtypeStruct(shape, dtype)
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=jax.typeof(like).manual_axis_type)


def _padded_tokens(cfg: KernelConfig, n: int) -> tuple[int, int]:
    """(block_n, padded N). TPU blocks get at least 8 rows (sublane tiling)."""
    bn = cfg.block_n if cfg.variant == "triton" else min(cfg.block_n, max(8, -(-n // 8) * 8))
    return bn, _cdiv(n, bn) * bn


def forward(cfg: KernelConfig, h, w, t):
    """h [N, D], w [D, V], t [N] int32 -> (lse, zt, ent or None), each [N] fp32."""
    n = h.shape[0]
    bn, n_pad = _padded_tokens(cfg, n)
    h_p, w, t_p = align_varying(pad_rows(h, n_pad), w, _per_token(t, n_pad))
    if cfg.variant == "triton":
        outs = _triton_forward(_triton_config(cfg, h.shape[1]), h_p, w, t_p, bn)
    else:
        outs = _tpu_forward(cfg, h_p, w, t_p, bn)
    lse, zt = outs[0][:n, 0], outs[1][:n, 0]
    ent = outs[2][:n, 0] if cfg.with_entropy else None
    return lse, zt, ent


def backward(cfg: KernelConfig, h, w, t, lse, ent, g_lse, g_zt, g_ent):
    """Per-token cotangents -> (dh [N, D] h.dtype, dw [D, V] w.dtype)."""
    n = h.shape[0]
    bn, n_pad = _padded_tokens(cfg, n)
    per_token = [_per_token(x, n_pad) for x in (t, lse, g_lse, g_zt)]
    if cfg.with_entropy:
        per_token += [_per_token(ent, n_pad), _per_token(g_ent, n_pad)]
    h_p, w, *per_token = align_varying(pad_rows(h, n_pad), w, *per_token)
    if cfg.variant == "triton":
        dh, dw = _triton_backward(_triton_config(cfg, h.shape[1]), h_p, w, per_token, bn)
    else:
        dh, dw = _tpu_backward(cfg, h_p, w, per_token, bn)
    return dh[:n].astype(h.dtype), dw.astype(w.dtype)


def _logits_cotangent(cfg: KernelConfig, z, hit, col_ok, vectors):
    """dz (already divided by the temperature) from the per-token vectors of a block.

    vectors: [lse, g_lse, g_zt] (+ [ent, g_ent] with entropy), each [bn, 1] fp32.
    """
    lse, g_lse, g_zt = vectors[:3]
    ent, g_ent = (vectors[3], vectors[4]) if cfg.with_entropy else (None, None)
    dz = dlogits(z, hit, lse, ent, g_lse, g_zt, g_ent, cfg.with_entropy, col_ok)
    return dz * cfg.inv_temperature


# ----------------------------------------------------------------------------------------
# Mosaic TPU grid kernels
# ----------------------------------------------------------------------------------------


def _tpu_params(semantics: tuple[str, str]):
    return pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=_TPU_VMEM_LIMIT_BYTES)


def _tpu_cost(h, w, matmuls: int, h_reads: int, w_reads: int, per_token: int, written_bytes: int) -> pl.CostEstimate:
    """What one TPU kernel over h [n, d] and w [d, v] does, for XLA's scheduler and cost counting:
    `matmuls` [n, d] x [d, v]-sized products (the logits; a cotangent product too in the backward
    passes), one exp per logit, h and the `per_token` fp32 inputs (targets, cotangents) read
    `h_reads` times, w `w_reads` times (once per block of the other operand that the grid revisits)."""
    n, d = h.shape
    v = w.shape[1]
    read = h_reads * (n * d * h.dtype.itemsize + per_token * n * 4) + w_reads * d * v * w.dtype.itemsize
    return pl.CostEstimate(flops=2 * n * d * v * matmuls, transcendentals=n * v, bytes_accessed=read + written_bytes)


def _tpu_block_logits(cfg: KernelConfig, h, w, t, j, v: int):
    """Block (., j) of the logits for targets t [bn, 1].

    Returns z [bn, bv] fp32 (out-of-vocab columns at -inf), hit (target column, never a
    padded one: under vocab parallelism a shard's local target may point past its
    slice) and col_ok (column inside the vocabulary).
    """
    bn, bv = h.shape[0], w.shape[1]
    cols = j * bv + lax.broadcasted_iota(jnp.int32, (bn, bv), 1)
    col_ok = cols < v
    z = dot_f32(h, w) * cfg.inv_temperature
    return jnp.where(col_ok, z, -jnp.inf), (cols == t) & col_ok, col_ok


def _tpu_forward_kernel(h_ref, w_ref, t_ref, *refs, cfg: KernelConfig, v: int):
    n_out = 3 if cfg.with_entropy else 2
    out_refs, scratch = refs[:n_out], refs[n_out:]
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        for ref, value in zip(scratch, init_stats(scratch[0].shape)):
            ref[...] = value

    z, hit, _ = _tpu_block_logits(cfg, h_ref[...], w_ref[...], t_ref[...], j, v)
    stats = tuple(ref[...] for ref in scratch)
    stats = online_update(stats, z, hit, cfg.with_entropy)
    for ref, value in zip(scratch, stats):
        ref[...] = value

    @pl.when(j == pl.num_programs(1) - 1)
    def _write():
        for ref, value in zip(out_refs, finalize(stats)):
            ref[...] = value


def _tpu_forward(cfg: KernelConfig, h, w, t, bn: int):
    n_pad, d = h.shape
    v = w.shape[1]
    bv = min(cfg.block_v, v)
    grid = (n_pad // bn, _cdiv(v, bv))
    row = pl.BlockSpec((bn, 1), lambda i, j: (i, 0))
    n_out = 3 if cfg.with_entropy else 2
    return pl.pallas_call(
        functools.partial(_tpu_forward_kernel, cfg=cfg, v=v),
        out_shape=[_out((n_pad, 1), jnp.float32, h)] * n_out,
        grid=grid,
        in_specs=[
            pl.BlockSpec((bn, d), lambda i, j: (i, 0)),
            pl.BlockSpec((d, bv), lambda i, j: (0, j)),
            row,
        ],
        out_specs=[row] * n_out,
        scratch_shapes=[pltpu.VMEM((bn, 1), jnp.float32)] * 4,
        compiler_params=_tpu_params(("parallel", "arbitrary")),
        interpret=cfg.interpret,
        cost_estimate=_tpu_cost(h, w, 1, 1, grid[0], 1, n_out * n_pad * 4),
        name="token_logprobs_fwd",
    )(h, w, t)


def _tpu_dh_kernel(h_ref, w_ref, t_ref, *refs, cfg: KernelConfig, v: int):
    *vector_refs, dh_ref, acc_ref = refs
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    w = w_ref[...]
    z, hit, col_ok = _tpu_block_logits(cfg, h_ref[...], w, t_ref[...], j, v)
    dz = _logits_cotangent(cfg, z, hit, col_ok, [r[...] for r in vector_refs])
    # Padded columns of w may hold anything (NaN included): zero them, since 0 * NaN = NaN.
    w_cols_ok = (j * w.shape[1] + lax.broadcasted_iota(jnp.int32, w.shape, 1)) < v
    w = jnp.where(w_cols_ok, w, jnp.zeros((), w.dtype))
    acc_ref[...] += dot_nt(dz.astype(compute_dtype(h_ref, w_ref)), w)

    @pl.when(j == pl.num_programs(1) - 1)
    def _write():
        dh_ref[...] = acc_ref[...]


def _tpu_dw_kernel(h_ref, w_ref, t_ref, *refs, cfg: KernelConfig, v: int):
    *vector_refs, dw_ref, acc_ref = refs
    j, i = pl.program_id(0), pl.program_id(1)

    @pl.when(i == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    h = h_ref[...]
    z, hit, col_ok = _tpu_block_logits(cfg, h, w_ref[...], t_ref[...], j, v)
    dz = _logits_cotangent(cfg, z, hit, col_ok, [r[...] for r in vector_refs])
    dz = dz.astype(compute_dtype(h_ref, w_ref))
    acc_ref[...] += lax.dot_general(h, dz, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)

    @pl.when(i == pl.num_programs(1) - 1)
    def _write():
        dw_ref[...] = acc_ref[...].astype(dw_ref.dtype)


def _tpu_backward(cfg: KernelConfig, h, w, per_token, bn: int):
    n_pad, d = h.shape
    v = w.shape[1]
    bv = min(cfg.block_v, v)
    nb, nv = n_pad // bn, _cdiv(v, bv)
    t, vectors = per_token[0], per_token[1:]
    kernel_args = {"cfg": cfg, "v": v}

    row = pl.BlockSpec((bn, 1), lambda i, j: (i, 0))
    dh = pl.pallas_call(
        functools.partial(_tpu_dh_kernel, **kernel_args),
        out_shape=_out((n_pad, d), jnp.float32, h),
        grid=(nb, nv),
        in_specs=[
            pl.BlockSpec((bn, d), lambda i, j: (i, 0)),
            pl.BlockSpec((d, bv), lambda i, j: (0, j)),
            row,
        ]
        + [row] * len(vectors),
        out_specs=pl.BlockSpec((bn, d), lambda i, j: (i, 0)),
        scratch_shapes=[pltpu.VMEM((bn, d), jnp.float32)],
        compiler_params=_tpu_params(("parallel", "arbitrary")),
        interpret=cfg.interpret,
        cost_estimate=_tpu_cost(h, w, 2, 1, nb, len(per_token), n_pad * d * 4),
        name="token_logprobs_bwd_dh",
    )(h, w, t, *vectors)

    row_t = pl.BlockSpec((bn, 1), lambda j, i: (i, 0))
    dw = pl.pallas_call(
        functools.partial(_tpu_dw_kernel, **kernel_args),
        out_shape=_out((d, v), w.dtype, h),
        grid=(nv, nb),
        in_specs=[
            pl.BlockSpec((bn, d), lambda j, i: (i, 0)),
            pl.BlockSpec((d, bv), lambda j, i: (0, j)),
            row_t,
        ]
        + [row_t] * len(vectors),
        out_specs=pl.BlockSpec((d, bv), lambda j, i: (0, j)),
        scratch_shapes=[pltpu.VMEM((d, bv), jnp.float32)],
        compiler_params=_tpu_params(("parallel", "arbitrary")),
        interpret=cfg.interpret,
        cost_estimate=_tpu_cost(h, w, 2, nv, 1, len(per_token), d * v * w.dtype.itemsize),
        name="token_logprobs_bwd_dw",
    )(h, w, t, *vectors)
    return dh, dw


# ----------------------------------------------------------------------------------------
# Triton (GPU) kernels: one program per token block (forward, dh) or vocab tile (dw)
# ----------------------------------------------------------------------------------------


def _triton_params():
    return pltriton.CompilerParams(num_warps=4, num_stages=2)


def _triton_w_tile(cfg: KernelConfig, w_ref, k, col0, col_ok):
    """w[k*block_d : (k+1)*block_d, col0 : col0 + block_v], zero outside the vocabulary."""
    rows = pl.ds(k * cfg.block_d, cfg.block_d)
    return pltriton.load(w_ref.at[rows, pl.ds(col0, cfg.block_v)], mask=col_ok, other=0)


def _triton_block_logits(cfg: KernelConfig, h_ref, row0, w_ref, t, j, v: int, d: int):
    """Logits [bn, bv] of token rows [row0, row0 + bn) and vocab tile j, -inf outside V.

    Returns (z, hit, col_ok, tile_ok) as `_tpu_block_logits` plus the [block_d, bv]
    in-vocabulary mask of a w tile.
    """
    bn, bv, bk = cfg.block_n, cfg.block_v, cfg.block_d
    col0 = j * bv
    cols = col0 + lax.broadcasted_iota(jnp.int32, (bn, bv), 1)
    col_ok = cols < v
    tile_ok = (col0 + lax.broadcasted_iota(jnp.int32, (bk, bv), 1)) < v

    def k_step(k, acc):
        h_k = h_ref[pl.ds(row0, bn), pl.ds(k * bk, bk)]
        return acc + dot_f32(h_k, _triton_w_tile(cfg, w_ref, k, col0, tile_ok))

    z = lax.fori_loop(0, d // bk, k_step, jnp.zeros((bn, bv), jnp.float32)) * cfg.inv_temperature
    return jnp.where(col_ok, z, -jnp.inf), (cols == t) & col_ok, col_ok, tile_ok


def _triton_forward_kernel(h_ref, w_ref, t_ref, *out_refs, cfg: KernelConfig, v: int, d: int):
    t = t_ref[...]

    def vocab_tile(j, stats):
        z, hit, _, _ = _triton_block_logits(cfg, h_ref, 0, w_ref, t, j, v, d)
        return online_update(stats, z, hit, cfg.with_entropy)

    stats = lax.fori_loop(0, _cdiv(v, cfg.block_v), vocab_tile, init_stats((cfg.block_n, 1)))
    for ref, value in zip(out_refs, finalize(stats)):
        ref[...] = value


def _triton_forward(cfg: KernelConfig, h, w, t, bn: int):
    n_pad, d = h.shape
    v = w.shape[1]
    row = pl.BlockSpec((bn, 1), lambda i: (i, 0))
    n_out = 3 if cfg.with_entropy else 2
    return pl.pallas_call(
        functools.partial(_triton_forward_kernel, cfg=cfg, v=v, d=d),
        out_shape=[_out((n_pad, 1), jnp.float32, h)] * n_out,
        grid=(n_pad // bn,),
        in_specs=[pl.BlockSpec((bn, d), lambda i: (i, 0)), pl.no_block_spec, row],
        out_specs=[row] * n_out,
        compiler_params=_triton_params(),
        interpret=cfg.interpret,
        name="token_logprobs_fwd",
    )(h, w, t)


def _triton_dh_kernel(h_ref, w_ref, t_ref, *refs, cfg: KernelConfig, v: int, d: int):
    *vector_refs, dh_ref = refs
    bk = cfg.block_d
    nk = d // bk
    t = t_ref[...]
    vectors = [r[...] for r in vector_refs]
    cdt = compute_dtype(h_ref, w_ref)

    def zero(k, carry):
        dh_ref[:, pl.ds(k * bk, bk)] = jnp.zeros((cfg.block_n, bk), jnp.float32)
        return carry

    lax.fori_loop(0, nk, zero, 0)

    def vocab_tile(j, carry):
        z, hit, col_ok, tile_ok = _triton_block_logits(cfg, h_ref, 0, w_ref, t, j, v, d)
        dz = _logits_cotangent(cfg, z, hit, col_ok, vectors).astype(cdt)

        def k_step(k, carry):
            w_k = _triton_w_tile(cfg, w_ref, k, j * cfg.block_v, tile_ok)
            dh_ref[:, pl.ds(k * bk, bk)] += dot_nt(dz, w_k)
            return carry

        return lax.fori_loop(0, nk, k_step, carry)

    lax.fori_loop(0, _cdiv(v, cfg.block_v), vocab_tile, 0)


def _triton_dw_kernel(h_ref, w_ref, *refs, cfg: KernelConfig, v: int, d: int, n_pad: int):
    *vector_refs, t_ref, dw_ref = refs
    bn, bk = cfg.block_n, cfg.block_d
    nk = d // bk
    j = pl.program_id(0)
    cdt = compute_dtype(h_ref, w_ref)

    def zero(k, carry):
        dw_ref[pl.ds(k * bk, bk), :] = jnp.zeros((bk, cfg.block_v), jnp.float32)
        return carry

    lax.fori_loop(0, nk, zero, 0)

    def token_block(i, carry):
        rows = pl.ds(i * bn, bn)
        z, hit, col_ok, _ = _triton_block_logits(cfg, h_ref, i * bn, w_ref, t_ref[rows, :], j, v, d)
        vectors = [r[rows, :] for r in vector_refs]
        dz = _logits_cotangent(cfg, z, hit, col_ok, vectors).astype(cdt)

        def k_step(k, carry):
            h_k = h_ref[rows, pl.ds(k * bk, bk)]
            dw_ref[pl.ds(k * bk, bk), :] += lax.dot_general(
                h_k, dz, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32
            )
            return carry

        return lax.fori_loop(0, nk, k_step, carry)

    lax.fori_loop(0, n_pad // bn, token_block, 0)


def _triton_backward(cfg: KernelConfig, h, w, per_token, bn: int):
    n_pad, d = h.shape
    v = w.shape[1]
    nv = _cdiv(v, cfg.block_v)
    t, vectors = per_token[0], per_token[1:]
    kernel_args = {"cfg": cfg, "v": v, "d": d}

    row = pl.BlockSpec((bn, 1), lambda i: (i, 0))
    dh = pl.pallas_call(
        functools.partial(_triton_dh_kernel, **kernel_args),
        out_shape=_out((n_pad, d), jnp.float32, h),
        grid=(n_pad // bn,),
        in_specs=[pl.BlockSpec((bn, d), lambda i: (i, 0)), pl.no_block_spec, row] + [row] * len(vectors),
        out_specs=pl.BlockSpec((bn, d), lambda i: (i, 0)),
        compiler_params=_triton_params(),
        interpret=cfg.interpret,
        name="token_logprobs_bwd_dh",
    )(h, w, t, *vectors)

    # dw columns are padded to a whole number of tiles and sliced afterwards, so every
    # store of the kernel is in bounds.
    dw = pl.pallas_call(
        functools.partial(_triton_dw_kernel, n_pad=n_pad, **kernel_args),
        out_shape=_out((d, nv * cfg.block_v), jnp.float32, h),
        grid=(nv,),
        in_specs=[pl.no_block_spec, pl.no_block_spec] + [pl.no_block_spec] * (len(vectors) + 1),
        out_specs=pl.BlockSpec((d, cfg.block_v), lambda j: (0, j)),
        compiler_params=_triton_params(),
        interpret=cfg.interpret,
        name="token_logprobs_bwd_dw",
    )(h, w, *vectors, t)
    return dh, dw[:, :v]
