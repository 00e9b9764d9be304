"""DisCO (Li, Lin, Galanti, Tu, Yang 2025, "DisCO: Reinforcing Large Reasoning Models with Discriminative
Constrained Optimization", arXiv 2505.12366; docs/math.md §1 "DisCO"), minimised, on whole groups of G rows.

A non-clipping score of each response o_i (valid tokens t):
    log_likelihood:    s_i = (1/|o_i|) sum_t logp_it
    likelihood_ratio:  s_i = (1/|o_i|) sum_t r_it,   r = exp(clip(logp - logp_old, -20, 20))
In each group with both positive (A_i > 0) and negative (A_i < 0) responses (GRPO's advantages on binary
rewards: A_i > 0 iff r_i = 1), the discriminative objective
    log_sum_exp (DisCO):  J_q = mean_{i+} s_i - tau * log( mean_{j-} exp(s_j / tau) )
    mean (DisCO-b):       J_q = mean_{i+} s_i - mean_{j-} s_j
and groups without both kinds contribute 0. The KL trust region KL(pi_old || pi) <= delta is enforced by
the squared-hinge penalty in the form of the authors' code,
    kl = token mean of (logp_old - logp),   C = sg(max(beta (kl - delta), 0)) * kl,
    L = -(sum_q J_q) / num_prompts + C.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pipo_jax.config.schema import Section, above, at_least, key
from pipo_jax.losses.masking import as_mask
from pipo_jax.losses.policy import token_log_ratio

SCORES = ("log_likelihood", "likelihood_ratio")
NEGATIVES = ("log_sum_exp", "mean")


@dataclasses.dataclass(frozen=True)
class DiscoSettings(Section):
    """config.loss.disco: DisCO's score, negatives' aggregation and KL trust region (loss.policy=disco)."""

    _section = "loss.disco"
    score: str = key("log_likelihood", "the non-clipping score of a response, the token mean of logp or of the "
                     "ratio to the behaviour policy", choices=SCORES)
    negatives: str = key("log_sum_exp", "log_sum_exp: tau x the log-mean-exp of the negative responses' scores / tau "
                         "(DisCO) | mean: their mean (DisCO-b)", choices=NEGATIVES)
    tau: float = key(10.0, "tau of log_sum_exp (the authors: 10 with log_likelihood, 1 with likelihood_ratio)",
                     above(0))
    beta: float = key(1e3, "beta, the squared-hinge penalty's weight on KL(pi_old || pi) above delta", at_least(0))
    delta: float = key(1e-4, "delta, the KL trust region's radius", at_least(0))



def sequence_scores(logp_br, logp_old_br, mask_br, score: str):
    """s_i [B]: the token mean over each response's valid tokens of logp (`log_likelihood`) or of the
    ratio to the behaviour policy (`likelihood_ratio`); 0 for an empty row."""
    if score not in SCORES:
        raise ValueError(f"DisCO score {score!r} is not one of {SCORES}")
    m = as_mask(mask_br)
    per_token = logp_br if score == "log_likelihood" else jnp.exp(token_log_ratio(logp_br, logp_old_br))
    return jnp.sum(jnp.where(m > 0, per_token, 0.0), axis=-1) / jnp.maximum(jnp.sum(m, axis=-1), 1.0)


def group_signs(adv_br, mask_br, group_size: int):
    """(positive [P, G], negative [P, G], valid [P]) from the sign of each response's token-mean advantage;
    valid: the group has both kinds. Rows in order, whole groups of `group_size`."""
    m = as_mask(mask_br)
    abar = jnp.sum(adv_br * m, axis=-1) / jnp.maximum(jnp.sum(m, axis=-1), 1.0)
    abar = abar.reshape(-1, group_size)
    pos, neg = abar > 0, abar < 0
    return pos, neg, jnp.any(pos, axis=-1) & jnp.any(neg, axis=-1)


def negative_term(s_pg, neg_pg, negatives: str, tau: float):
    """[P]: tau log mean_{j-} exp(s_j / tau) (`log_sum_exp`, max-shifted) or mean_{j-} s_j (`mean`);
    0 for a group without negatives."""
    if negatives not in NEGATIVES:
        raise ValueError(f"DisCO negatives {negatives!r} is not one of {NEGATIVES}")
    n_neg = jnp.sum(neg_pg, axis=-1)
    if negatives == "mean":
        return jnp.sum(jnp.where(neg_pg, s_pg, 0.0), axis=-1) / jnp.maximum(n_neg, 1)
    z = jnp.where(neg_pg, s_pg / tau, -jnp.inf)
    top = jax.lax.stop_gradient(jnp.max(z, axis=-1))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    total = jnp.sum(jnp.where(neg_pg, jnp.exp(jnp.where(neg_pg, z, 0.0) - top[:, None]), 0.0), axis=-1)
    lme = jnp.log(jnp.where(n_neg > 0, total, 1.0)) + top - jnp.log(jnp.maximum(n_neg, 1))
    return jnp.where(n_neg > 0, tau * lme, 0.0)


def kl_penalty(logp_br, logp_old_br, mask_br, beta: float, delta: float):
    """(C, kl): kl = token mean of logp_old - logp over the valid tokens, C = sg(max(beta (kl - delta), 0)) kl,
    whose gradient beta [kl - delta]_+ d kl is that of the squared hinge beta/2 [kl - delta]_+^2."""
    m = as_mask(mask_br)
    kl = jnp.sum(jnp.where(m > 0, logp_old_br - logp_br, 0.0)) / jnp.maximum(jnp.sum(m), 1.0)
    return jax.lax.stop_gradient(jnp.maximum(beta * (kl - delta), 0.0)) * kl, kl


@functools.partial(jax.jit, static_argnames=("group_size", "num_prompts", "score", "negatives", "tau", "beta",
                                             "delta"))
def disco_loss(logp_br, logp_old_br, adv_br, mask_br, *, group_size: int, num_prompts: int,
               score: str = "log_likelihood", negatives: str = "log_sum_exp", tau: float = 10.0, beta: float = 1e3,
               delta: float = 1e-4):
    """(loss, metrics) over the rows of `logp_br` [B, R], whole groups of `group_size` in order; the group
    sum is divided by `num_prompts` (the mini-batch's). Defaults: DisCO with the log-likelihood score and
    the authors' tau = 10, beta = 1e3, delta = 1e-4."""
    s = sequence_scores(logp_br, logp_old_br, mask_br, score).reshape(-1, group_size)
    pos, neg, valid = group_signs(adv_br, mask_br, group_size)
    pos_mean = jnp.sum(jnp.where(pos, s, 0.0), axis=-1) / jnp.maximum(jnp.sum(pos, axis=-1), 1)
    j_q = jnp.where(valid, pos_mean - negative_term(s, neg, negatives, tau), 0.0)
    objective = jnp.sum(j_q) / num_prompts
    constraint, kl = kl_penalty(logp_br, logp_old_br, mask_br, beta, delta)
    metrics = {"pg_loss": -objective, "disco_constraint": constraint, "ppo_kl": jax.lax.stop_gradient(kl),
               "pg_clipfrac": (kl > delta).astype(jnp.float32),
               "disco_valid_groups_frac": jnp.sum(valid.astype(jnp.float32)) / num_prompts}
    return -objective + constraint, metrics
