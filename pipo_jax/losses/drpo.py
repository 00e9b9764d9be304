"""DRPO (Li, Chen, Lin, Yang 2025, "DRPO: Efficient Reasoning via Decoupled Reward Policy
Optimization", arXiv 2510.04474; docs/math.md §1 "DRPO"), minimised, on whole groups of G rows.

Score s_i = (1/|o_i|) sum_t logp_it. In each group with both correct (A_i > 0) and incorrect (A_i < 0)
responses (GRPO's advantages on binary rewards: A_i > 0 iff r_i = 1),
    J_q = sum_{i+} w_i (s_i - tau * log( (1/n-) sum_{j-} exp(s_j / tau) )) / sum_{i+} w_i,
    w_i = exp((1 - |o_i| / R) / lambda)        (the positive data's length reward, closed form),
groups without both kinds contribute 0. The KL trust region is the penalty of the authors' code,
    kl = token mean of (logp_old - logp),  C = sg(max(beta (kl - delta), 0)) * kl,
    L = -(sum_q J_q) / num_prompts + C.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pipo_jax.config.schema import Section, above, at_least, key
from pipo_jax.losses.masking import as_mask


@dataclasses.dataclass(frozen=True)
class DrpoSettings(Section):
    """config.loss.drpo: DRPO's temperature, length weight and KL trust region (loss.policy=drpo)."""

    _section = "loss.drpo"
    tau: float = key(10.0, "tau, the temperature of the incorrect responses' log-mean-exp", above(0))
    lam: float = key(0.1, "lambda, the KL weight of the positive distribution: length weight exp((1 - |o| / R) / "
                     "lambda)", above(0))
    beta: float = key(1e3, "beta, the penalty weight of the KL trust region", at_least(0))
    delta: float = key(1e-4, "delta, the KL trust region's radius", at_least(0))



@functools.partial(jax.jit, static_argnames=("group_size", "num_prompts", "tau", "lam", "beta", "delta"))
def drpo_loss(logp_br, logp_old_br, adv_br, mask_br, *, group_size: int, num_prompts: int, tau: float = 10.0,
              lam: float = 0.1, beta: float = 1e3, delta: float = 1e-4):
    """(loss, metrics) over the rows of `logp_br`, whole groups of `group_size` in order; the group sum
    is divided by `num_prompts` (the mini-batch's)."""
    m = as_mask(mask_br)
    b, r = logp_br.shape
    lengths = jnp.sum(m, axis=-1)
    score = jnp.sum(jnp.where(m > 0, logp_br, 0.0), axis=-1) / jnp.maximum(lengths, 1.0)
    abar = jnp.sum(adv_br * m, axis=-1) / jnp.maximum(lengths, 1.0)
    g = lambda x: x.reshape(b // group_size, group_size)  # noqa: E731
    s, pos, neg = g(score), g(abar > 0), g(abar < 0)
    valid = jnp.any(pos, axis=-1) & jnp.any(neg, axis=-1)
    n_neg = jnp.maximum(jnp.sum(neg, axis=-1), 1)
    z = jnp.where(neg, s / tau, 0.0)
    top = jax.lax.stop_gradient(jnp.max(jnp.where(neg, z, -jnp.inf), axis=-1))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    total = jnp.sum(jnp.where(neg, jnp.exp(z - top[:, None]), 0.0), axis=-1)
    lme = jnp.where(valid, jnp.log(jnp.where(valid, total, 1.0)) + top - jnp.log(n_neg), 0.0)
    w = jnp.where(pos, jnp.exp((1.0 - g(lengths) / r) / lam), 0.0)
    j_q = jnp.sum(w * (s - tau * lme[:, None]), axis=-1) / jnp.maximum(jnp.sum(w, axis=-1), 1e-30)
    objective = jnp.sum(jnp.where(valid, j_q, 0.0)) / num_prompts
    kl = jnp.sum(jnp.where(m > 0, logp_old_br - logp_br, 0.0)) / jnp.maximum(jnp.sum(m), 1.0)
    constraint = jax.lax.stop_gradient(jnp.maximum(beta * (kl - delta), 0.0)) * kl
    loss = -objective + constraint
    metrics = {"pg_loss": -objective, "drpo_constraint": constraint, "ppo_kl": jax.lax.stop_gradient(kl),
               "pg_clipfrac": (kl > delta).astype(jnp.float32),
               "drpo_valid_groups_frac": jnp.sum(valid.astype(jnp.float32)) / num_prompts}
    return loss, metrics
