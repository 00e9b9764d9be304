"""Reduce a per-token loss matrix to a scalar (docs/math.md §1, `loss_agg_mode`), with global counts.

Inputs: `loss_br` [B, R] float, `mask_br` [B, R] (1 = valid response token, 0 = padding).
Let `|y_b| = sum_t mask[b, t]`. The four modes:

- ``token-mean``:               sum_{b,t} m*l / num_tokens                       (DAPO, SDPO)
- ``seq-mean-token-mean``:      sum_b [sum_t m*l / max(|y_b|, 1)] / num_seqs     (GRPO, GSPO, PPO)
- ``seq-mean-token-sum``:       sum_b  sum_t m*l / num_seqs
- ``seq-mean-token-sum-norm``:  sum_b  sum_t m*l / norm_length / num_seqs       (Dr.GRPO style)

`num_tokens` is the number of valid tokens and `num_seqs` the number of non-empty sequences,
both **global over the mini-batch**. When `loss_br` is one micro-batch (or one shard) of a
larger mini-batch, pass the mini-batch counts from `aggregation_counts(mini_batch_mask_br)`:
every piece then contributes its share, and the sum of the pieces' losses (and gradients)
equals the loss of the whole mini-batch. Left as ``None``, the counts are computed from
`mask_br` (the arrays are the whole mini-batch). Micro-batches must split along B (a
sequence's tokens stay together; the per-sequence token mean is local to a row).

`norm_length` (``seq-mean-token-sum-norm`` only) defaults to the padded length R; pass a
constant (the configured max response length) so that the loss does not depend on padding.

The four settings travel together as one `Aggregation` record (a pytree: `mode` and
`norm_length` static, the counts traced), the `agg=` argument of every loss in this package:
    aggregate(loss_br, mask_br, agg: Aggregation) -> scalar
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from pipo_jax.config.registry import register_names
from pipo_jax.losses.masking import as_mask

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
register_names("agg_mode", *AGG_MODES)  # `config/registry.py`: the schema's choices


def check_agg_mode(mode: str) -> str:
    """Return `mode` or raise a ValueError naming the `loss_agg_mode` field."""
    if mode not in AGG_MODES:
        raise ValueError(f"loss_agg_mode={mode!r} is not one of {AGG_MODES}")
    return mode


@struct.dataclass
class Aggregation:
    """How a per-token loss becomes a scalar: `mode` (one of `AGG_MODES`, static), the global
    counts `num_tokens` / `num_seqs` of the mini-batch (f32 scalars; None: counted from the
    mask at hand) and `norm_length` (``seq-mean-token-sum-norm``'s divisor, static; None: R)."""

    mode: str = struct.field(pytree_node=False, default="token-mean")
    num_tokens: Any = None
    num_seqs: Any = None
    norm_length: float | None = struct.field(pytree_node=False, default=None)

    def __post_init__(self):
        check_agg_mode(self.mode)

    @classmethod
    def of(cls, mode: str, counts: dict, norm_length: float | None = None) -> "Aggregation":
        """`mode` with the counts of `aggregation_counts`."""
        return cls(mode, counts["num_tokens"], counts["num_seqs"], norm_length)


def aggregation_counts(mask_br) -> dict:
    """Global counts of a (mini-)batch: {"num_tokens": valid tokens, "num_seqs": non-empty rows} (f32 scalars)."""
    m = as_mask(mask_br)
    return {
        "num_tokens": jnp.sum(m),
        "num_seqs": jnp.sum((jnp.sum(m, axis=-1) > 0).astype(jnp.float32)),
    }


def _count_or_local(count, local):
    count = local if count is None else jnp.asarray(count, jnp.float32)
    return jnp.maximum(count, 1.0)


def token_mean(values_br, mask_br, num_tokens=None):
    """sum(m * values) / max(num_tokens, 1); `num_tokens` defaults to sum(m). Scalar."""
    m = as_mask(mask_br)
    return jnp.sum(values_br * m) / _count_or_local(num_tokens, jnp.sum(m))


@jax.jit
def aggregate(loss_br, mask_br, agg: Aggregation):
    """Scalar loss from `loss_br` [B, R] by `agg.mode` (see module docstring for the formulas)."""
    m = as_mask(mask_br)
    masked_br = jnp.where(m > 0, loss_br, 0.0)  # where, not *, so inf/nan in padding cannot leak
    if agg.mode == "token-mean":
        return jnp.sum(masked_br) / _count_or_local(agg.num_tokens, jnp.sum(m))
    seq_len_b = jnp.sum(m, axis=-1)
    seq_sum_b = jnp.sum(masked_br, axis=-1)
    local_seqs = jnp.sum((seq_len_b > 0).astype(jnp.float32))
    seqs = _count_or_local(agg.num_seqs, local_seqs)
    if agg.mode == "seq-mean-token-mean":
        return jnp.sum(seq_sum_b / jnp.maximum(seq_len_b, 1.0)) / seqs
    if agg.mode == "seq-mean-token-sum":
        return jnp.sum(seq_sum_b) / seqs
    length = loss_br.shape[-1] if agg.norm_length is None else agg.norm_length
    return jnp.sum(seq_sum_b) / length / seqs
