"""Per-token entropy of the policy from its logits (SPEC 1; `entropy_coef` default 0)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.jit
def token_entropy(logits_btv):
    """H = logsumexp(z) - sum_v softmax(z)_v z_v over the last axis, computed in float32. [B, T]."""
    z = jnp.asarray(logits_btv, jnp.float32)
    return jax.nn.logsumexp(z, axis=-1) - jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1)
