"""Shared pieces of the fused log-prob kernels (`logprobs.py` chunked XLA, `logprobs_pallas.py`).

`KernelConfig` (the static configuration of one call); the online-softmax block math
(`init_stats`, `online_update`, `finalize`, `dlogits`) on per-token statistics with a
trailing singleton axis ([..., 1]) so that the same code serves [bn, 1] kernel refs; the
varying-axes helpers for `shard_map`; and `token_entropy`, the entropy from full logits
(the reference path).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_F32_MIN = float(np.finfo(np.float32).min)


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Static configuration of one fused log-prob call (hashable: a custom_vjp nondiff arg).

    Built by `logprobs.kernel_config` (which validates and fills the defaults).
    impl: "reference", "chunked" or "pallas". inv_temperature: 1 / temperature. with_entropy: also
    compute the per-token entropy. block_n / block_v / block_d: token, vocab and hidden
    block sizes (block_d: Triton kernel only; None = the largest of 64, 32, 16 that
    divides D). interpret: run Pallas in interpret mode. variant: Pallas kernel family,
    "mosaic_tpu" or "triton".
    """

    impl: str
    inv_temperature: float
    with_entropy: bool
    block_n: int
    block_v: int
    block_d: int | None = None
    interpret: bool = False
    variant: str = "mosaic_tpu"
    xla_cpu: bool = False


# ----------------------------------------------------------------------------------------
# Block math shared by the chunked and Pallas paths. Per-token statistics carry a
# trailing singleton axis ([..., 1]) so that the same code works on [bn, 1] kernel refs.
# ----------------------------------------------------------------------------------------


def init_stats(shape: tuple[int, ...]) -> tuple[jax.Array, ...]:
    """Empty online-softmax state (max, sum-exp, sum (z-max)exp, target logit), fp32."""
    return (
        jnp.full(shape, _F32_MIN, jnp.float32),
        jnp.zeros(shape, jnp.float32),
        jnp.zeros(shape, jnp.float32),
        jnp.zeros(shape, jnp.float32),
    )


def online_update(stats, z, hit, with_entropy: bool):
    """Folds one logits block into the running statistics.

    stats: (m, s, a, zt), each [..., 1] fp32, where s = sum exp(z - m) and
    a = sum (z - m) exp(z - m) over the columns seen so far, zt = target logit.
    z: [..., bv] fp32 logits of the block, masked (out-of-vocab) columns = -inf.
    hit: [..., bv] bool, True at the target column.
    """
    m, s, a, zt = stats
    m_new = jnp.maximum(m, jnp.max(z, axis=-1, keepdims=True))
    scale = jnp.exp(m - m_new)
    d = z - m_new
    e = jnp.exp(d)
    s_new = s * scale + jnp.sum(e, axis=-1, keepdims=True)
    if with_entropy:
        # (m - m_new) * s rebases the old sum onto the new max; guarded because the
        # initial m is the fp32 minimum and s = 0 there. Masked columns have d = -inf.
        rebase = jnp.where(s > 0, (m - m_new) * s, 0.0)
        a_new = scale * (a + rebase) + jnp.sum(
            jnp.where(e > 0, d * e, 0.0), axis=-1, keepdims=True
        )
    else:
        a_new = a
    zt_new = zt + jnp.sum(jnp.where(hit, z, 0.0), axis=-1, keepdims=True)
    return m_new, s_new, a_new, zt_new


def finalize(stats):
    """(m, s, a, zt) -> (lse, zt, entropy), each [..., 1] fp32."""
    m, s, a, zt = stats
    log_s = jnp.log(s)
    return m + log_s, zt, log_s - a / s


def dlogits(z, hit, lse, ent, g_lse, g_zt, g_ent, with_entropy: bool, col_ok=None):
    """Cotangent of the block's logits z ([..., bv] fp32) from per-token cotangents.

    d lse / dz = p, d zt / dz = onehot(target), d H / dz = -p (log p + H).
    col_ok: optional [..., bv] bool, False on padded columns (their z is -inf); the
    result is exactly 0 there.
    """
    logp = z - lse
    p = jnp.exp(logp)
    dz = g_lse * p + jnp.where(hit, g_zt, 0.0)
    if with_entropy:
        dz = dz - g_ent * p * (logp + ent)
    if col_ok is not None:
        dz = jnp.where(col_ok, dz, 0.0)
    return dz


def compute_dtype(h: jax.Array, w: jax.Array):
    """Dtype in which the backward matmuls consume the logits cotangent."""
    return jnp.result_type(h.dtype, w.dtype)


def dot_f32(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32)


def dot_nt(a, b):
    """a [m, k] . b[n, k]^T -> [m, n] fp32."""
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def pad_rows(x: jax.Array, rows: int) -> jax.Array:
    if x.shape[0] == rows:
        return x
    pad = [(0, rows - x.shape[0])] + [(0, 0)] * (x.ndim - 1)
    return jnp.pad(x, pad)


def align_varying(*xs: jax.Array, extra_axes: tuple[str, ...] = ()) -> list[jax.Array]:
    """Makes all operands vary over the same shard_map axes (a no-op outside shard_map).

    Inside `shard_map` (default check_vma=True) the fused primitive's outputs and
    cotangents vary over the union of its operands' axes. Aligning the operands first,
    outside the custom_vjp, lets autodiff psum the cotangent of an operand that was
    replicated over an axis (w over data-parallel rows, hidden over the vocab axis), and
    gives the Pallas calls one set of axes for their outputs.
    """
    axes = frozenset(extra_axes).union(*(varying_axes(x) for x in xs))
    return [_vary_over(x, axes) for x in xs]


def vary_like(tree, *refs):
    """`tree` cast to vary over every mesh axis that any of `refs` varies over.

    Inside `shard_map` a loop carry built from constants is invariant while the loop
    body makes it vary like its inputs; the carry types must match. No-op outside.
    """
    axes = frozenset().union(*(varying_axes(r) for r in refs if r is not None))
    return jax.tree.map(lambda x: _vary_over(x, axes), tree)


def _vary_over(x: jax.Array, axes: frozenset) -> jax.Array:
    missing = tuple(sorted(axes - varying_axes(x)))
    return lax.pcast(x, missing, to="varying") if missing else x


def varying_axes(x) -> frozenset:
    """Mesh axes `x` varies over inside `shard_map` (empty outside)."""
    aval = jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)  # jax >= 0.9; older releases call it `vma`
    return frozenset(mat.varying) if mat is not None else frozenset(getattr(aval, "vma", frozenset()))


@jax.jit
def token_entropy(logits_btv):
    """H = logsumexp(z) - sum_v softmax(z)_v z_v over the last axis, computed in float32. [B, T]."""
    z = jnp.asarray(logits_btv, jnp.float32)
    return jax.nn.logsumexp(z, axis=-1) - jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1)
