"""Masked reductions over response tokens. A mask is [B, R] with 1 = valid token, 0 = padding."""

from __future__ import annotations

import jax.numpy as jnp


def as_mask(mask_br):
    """The mask as float32 (bool/int/float input)."""
    return jnp.asarray(mask_br).astype(jnp.float32)


def masked_mean(x, mask, axis=None):
    """Mean of `x` over entries with mask 1 (0 where there are none)."""
    m = as_mask(mask)
    return jnp.sum(jnp.where(m > 0, x, 0.0), axis=axis) / jnp.maximum(jnp.sum(m, axis=axis), 1.0)


def last_valid_index(mask_br):
    """Index of the last valid token per row, int32 [B] (-1 for an empty row)."""
    m = as_mask(mask_br) > 0
    t = m.shape[-1]
    idx_from_end = jnp.argmax(m[..., ::-1], axis=-1)
    return jnp.where(jnp.any(m, axis=-1), t - 1 - idx_from_end, -1).astype(jnp.int32)
