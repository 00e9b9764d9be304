"""Clipped value loss of the PPO critic (docs/math.md §1).

    L_V = 0.5 * agg(max((V - R)^2, (clip(V, V_old - eps_v, V_old + eps_v) - R)^2)),  eps_v = 0.5

`values_br` are the current critic values, `values_old_br` the values at rollout time,
`returns_br` the GAE returns, all [B, R] with `mask_br`. Aggregation as in `aggregation.py`
(global counts). The PI step never calls this (the critic is not updated by verification).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pipo_jax.losses.aggregation import Aggregation, aggregate, token_mean


@functools.partial(jax.jit, static_argnames=("cliprange_value",))
def clipped_value_loss(
    values_br,
    values_old_br,
    returns_br,
    mask_br,
    *,
    cliprange_value: float = 0.5,
    agg: Aggregation,
):
    """Returns (loss scalar, {"vf_loss", "vf_clipfrac"}); vf_clipfrac is normalised by `num_tokens`."""
    if cliprange_value < 0:
        raise ValueError(f"cliprange_value={cliprange_value} must be >= 0")
    clipped_values_br = jnp.clip(values_br, values_old_br - cliprange_value, values_old_br + cliprange_value)
    unclipped_br = jnp.square(values_br - returns_br)
    clipped_br = jnp.square(clipped_values_br - returns_br)
    per_token_br = jnp.maximum(unclipped_br, clipped_br)
    loss = 0.5 * aggregate(per_token_br, mask_br, agg)
    clipfrac = token_mean((clipped_br > unclipped_br).astype(jnp.float32), mask_br, agg.num_tokens)
    return loss, {"vf_loss": loss, "vf_clipfrac": clipfrac}
