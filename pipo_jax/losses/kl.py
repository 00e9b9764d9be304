"""KL-to-reference estimators per token (docs/math.md §1) and the KL loss term.

Each estimator maps `logp_br`, `logp_ref_br` [B, R] (log-probs of the sampled token under
the current and the reference policy) to a per-token estimate [B, R]:

- ``k1``: logp - logp_ref
- ``k2``: 0.5 * (logp - logp_ref)^2
- ``k3``: x = clip(logp_ref - logp, -20, 20); clip(exp(x) - x - 1, -10, 10)   (low-variance KL)

GRPO/GSPO/DAPO use `kl_loss(..., estimator="k3")` as a loss term (coef 0.001, applied by the
trainer); PPO puts k1 into the reward (`advantages.kl_penalized_token_rewards`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pipo_jax.config.registry import register_names
from pipo_jax.losses.aggregation import Aggregation, aggregate


def kl_k1(logp_br, logp_ref_br):
    """k1 = logp - logp_ref, [B, R]."""
    return logp_br - logp_ref_br


def kl_k2(logp_br, logp_ref_br):
    """k2 = 0.5 (logp - logp_ref)^2, [B, R]."""
    return 0.5 * jnp.square(logp_br - logp_ref_br)


def kl_k3(logp_br, logp_ref_br):
    """k3 = exp(x) - x - 1 with x = clip(logp_ref - logp, -20, 20), clipped to [-10, 10], [B, R]."""
    x = jnp.clip(logp_ref_br - logp_br, -20.0, 20.0)
    return jnp.clip(jnp.exp(x) - x - 1.0, -10.0, 10.0)


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}
register_names("kl_estimator", *KL_ESTIMATORS)  # `config/registry.py`: the schema's choices


@functools.partial(jax.jit, static_argnames=("estimator",))
def kl_estimate(logp_br, logp_ref_br, estimator: str):
    """Per-token KL estimate [B, R] by name ("k1", "k2", "k3")."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl estimator={estimator!r} is not one of {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[estimator](logp_br, logp_ref_br)


@functools.partial(jax.jit, static_argnames=("estimator",))
def kl_loss(
    logp_br,
    logp_ref_br,
    mask_br,
    *,
    estimator: str = "k3",
    agg: Aggregation,
):
    """Aggregated KL-to-reference loss (unscaled; the trainer multiplies by the KL coef).

    Returns (loss scalar, {"kl": loss}).
    """
    kl_br = kl_estimate(logp_br, logp_ref_br, estimator)
    loss = aggregate(kl_br, mask_br, agg)
    return loss, {"kl": loss}
