"""Clipped value loss of the PPO critic (SPEC 1).

    L_V = 0.5 * agg(max((V - R)^2, (clip(V, V_old - eps_v, V_old + eps_v) - R)^2)),  eps_v = 0.5

`values_bt` are the current critic values, `values_old_bt` the values at rollout time,
`returns_bt` the GAE returns, all [B, T] with `mask_bt`. Aggregation as in `aggregation.py`
(global counts). The PI step never calls this (the critic is not updated by verification).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pipo_jax.losses.aggregation import aggregate, token_mean


@functools.partial(jax.jit, static_argnames=("cliprange_value", "loss_agg_mode", "norm_length"))
def clipped_value_loss(
    values_bt,
    values_old_bt,
    returns_bt,
    mask_bt,
    *,
    cliprange_value: float = 0.5,
    loss_agg_mode: str,
    num_tokens=None,
    num_seqs=None,
    norm_length=None,
):
    """Returns (loss scalar, {"vf_loss", "vf_clipfrac"}); vf_clipfrac is normalised by `num_tokens`."""
    if cliprange_value < 0:
        raise ValueError(f"cliprange_value={cliprange_value} must be >= 0")
    clipped_values_bt = jnp.clip(values_bt, values_old_bt - cliprange_value, values_old_bt + cliprange_value)
    unclipped_bt = jnp.square(values_bt - returns_bt)
    clipped_bt = jnp.square(clipped_values_bt - returns_bt)
    per_token_bt = jnp.maximum(unclipped_bt, clipped_bt)
    loss = 0.5 * aggregate(
        per_token_bt, mask_bt, loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=norm_length
    )
    clipfrac = token_mean((clipped_bt > unclipped_bt).astype(jnp.float32), mask_bt, num_tokens)
    return loss, {"vf_loss": loss, "vf_clipfrac": clipfrac}
