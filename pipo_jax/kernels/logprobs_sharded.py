"""The fused LM-head log-prob under `shard_map` with the head split over vocab on `tensor`.

Each `tensor` shard holds `[D, V / tensor]` columns of the head and computes its partial
(lse, target logit, entropy) with the fused kernel; `kernels.logprobs.
token_logprobs_vocab_parallel` merges them with `pmax` / `psum` of per-token vectors, so
the `[N, V]` logits are never gathered. Tokens (rows) are split over the `batch` rule's
mesh axes at the same time.

`token_logprobs` is a drop-in for `kernels.logprobs.token_logprobs`: inside a
`sharding_context` whose mesh has `tensor > 1` it runs the sharded version; the Pallas
kernels run under `shard_map` on every mesh (tensor = 1 included: a Mosaic / Triton
custom call cannot be partitioned automatically, so each device runs the kernel on its
own rows); otherwise the plain kernel.
"""

from __future__ import annotations

import functools

import jax
from jax.sharding import Mesh, PartitionSpec as P

from pipo_jax.kernels import logprobs as kernel
from pipo_jax.kernels.softmax_stats import KernelConfig
from pipo_jax.parallel.context import active_context
from pipo_jax.parallel.mesh import mesh_sizes
from pipo_jax.parallel.rules import Rules, spec_for

TENSOR = "tensor"


def _row_axes(n: int, mesh: Mesh, rules: Rules | None):
    """Mesh axes the N token rows are split over (the batch rule minus `tensor`), or None."""
    spec = spec_for(("batch",), (n,), mesh, rules)[0]
    axes = () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)
    axes = tuple(a for a in axes if a != TENSOR)
    return None if not axes else axes[0] if len(axes) == 1 else axes


def token_logprobs_tensor_parallel(hidden_nd: jax.Array, w_dv: jax.Array, targets_n: jax.Array,
                                   cfg: KernelConfig | None = None, *, mesh: Mesh, rules: Rules | None = None,
                                   valid_n: jax.Array | None = None):
    """`kernels.logprobs.token_logprobs` with `w_dv` split over vocab on the `tensor` axis of `mesh`.

    hidden_nd [N, D], w_dv [D, V] (V divisible by the tensor size), targets_n [N] global
    ids, valid_n [N] bool or None. Returns logp_n [N] fp32 (and entropy_n [N]), rows split
    like the batch. Differentiable in hidden_nd and w_dv; equal to the unsharded kernel.
    """
    v = w_dv.shape[1]
    t = mesh_sizes(mesh).get(TENSOR, 1)
    if v % t:
        raise ValueError(f"vocab-parallel log-probs: vocab size {v} is not divisible by mesh tensor={t}")
    cfg = kernel.kernel_config() if cfg is None else cfg
    rows = _row_axes(hidden_nd.shape[0], mesh, rules)
    fn = functools.partial(kernel.token_logprobs_vocab_parallel, cfg=cfg, axis_name=TENSOR)
    out_specs = (P(rows), P(rows)) if cfg.with_entropy else P(rows)
    # The Pallas kernels carry no varying-axes types (see kernels/logprobs_pallas.py);
    # without the check shard_map still differentiates correctly, with psums it cannot elide.
    check_vma = cfg.impl != "pallas"
    if valid_n is None:
        sharded = jax.shard_map(lambda h, w, tg: fn(h, w, tg), mesh=mesh, check_vma=check_vma,
                                in_specs=(P(rows, None), P(None, TENSOR), P(rows)), out_specs=out_specs)
        return sharded(hidden_nd, w_dv, targets_n)
    sharded = jax.shard_map(lambda h, w, tg, ok: fn(h, w, tg, valid_n=ok), mesh=mesh, check_vma=check_vma,
                            in_specs=(P(rows, None), P(None, TENSOR), P(rows), P(rows)), out_specs=out_specs)
    return sharded(hidden_nd, w_dv, targets_n, valid_n)


def token_logprobs_row_parallel(hidden_nd: jax.Array, w_dv: jax.Array, targets_n: jax.Array,
                                cfg: KernelConfig | None = None, *, mesh: Mesh, rules: Rules | None = None,
                                valid_n: jax.Array | None = None):
    """`kernels.logprobs.token_logprobs` under `shard_map` with rows split like the batch and
    `w_dv` whole on every device (for kernels that cannot be partitioned automatically)."""
    cfg = kernel.kernel_config() if cfg is None else cfg
    rows = _row_axes(hidden_nd.shape[0], mesh, rules)
    fn = functools.partial(kernel.token_logprobs, cfg=cfg)
    out_specs = (P(rows), P(rows)) if cfg.with_entropy else P(rows)
    if valid_n is None:
        return jax.shard_map(lambda h, w, tg: fn(h, w, tg), mesh=mesh, check_vma=False,
                             in_specs=(P(rows, None), P(), P(rows)), out_specs=out_specs)(hidden_nd, w_dv, targets_n)
    return jax.shard_map(lambda h, w, tg, ok: fn(h, w, tg, valid_n=ok), mesh=mesh, check_vma=False,
                         in_specs=(P(rows, None), P(), P(rows), P(rows)),
                         out_specs=out_specs)(hidden_nd, w_dv, targets_n, valid_n)


def token_logprobs(hidden_nd: jax.Array, w_dv: jax.Array, targets_n: jax.Array, cfg: KernelConfig | None = None, *,
                   valid_n: jax.Array | None = None):
    """Drop-in `kernels.logprobs.token_logprobs`, placed for the active `sharding_context`.

    No context: the plain kernel. tensor > 1 dividing the vocab: vocab-parallel. Else
    with `cfg.impl == "pallas"`: row-parallel under `shard_map`. Else the plain kernel, which
    XLA partitions.
    """
    cfg = kernel.kernel_config() if cfg is None else cfg
    ctx = active_context()
    if ctx is None:
        return kernel.token_logprobs(hidden_nd, w_dv, targets_n, cfg, valid_n=valid_n)
    if ctx.tensor_size > 1 and w_dv.shape[1] % ctx.tensor_size == 0:
        return token_logprobs_tensor_parallel(hidden_nd, w_dv, targets_n, cfg, mesh=ctx.mesh, rules=ctx.rules,
                                              valid_n=valid_n)
    if cfg.impl == "pallas":
        return token_logprobs_row_parallel(hidden_nd, w_dv, targets_n, cfg, mesh=ctx.mesh, rules=ctx.rules,
                                           valid_n=valid_n)
    return kernel.token_logprobs(hidden_nd, w_dv, targets_n, cfg, valid_n=valid_n)
