"""KL-Cov and Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for
Reasoning Language Models", arXiv 2505.22617): the policy gradient restricted on the few tokens
whose centred covariance of log-probability and advantage is largest (docs/math.md §1 "KL-Cov
and Clip-Cov"), minimised.

Over the N valid tokens of the batch at hand (the loss's micro-batch, as the authors' code),
    cov_t = (logp_t - (1/N) sum_j logp_j) * (A_t - (1/N) sum_j A_j)        (no gradient)
KL-Cov: I_KL = the max(floor(k N), 1) tokens of largest cov_t;
    L_t = -A_t r_t + beta |logp_t - logp_old_t| on t in I_KL,  -A_t r_t elsewhere (no clip).
Clip-Cov: among the valid tokens the ratio clip leaves alone (the token clip is not active) with
    omega_low <= cov_t <= omega_high, min(max(floor(r N), 1), #candidates) drawn uniformly at
    random (a key the loss receives) form I_clip;
    L_t = 0 on t in I_clip (no value, no gradient), the token clip max(-A r, -A clip(r)) elsewhere.
r_t = exp(clip(logp - logp_old, -20, 20)) as in `losses/policy.py`. Ties in cov_t (KL-Cov) are
broken by the lower flat index (row-major), so exactly the stated number of tokens is chosen.

Both share `losses/policy.py`'s signature (+ their settings) and metrics, plus "cov_frac": the
selected tokens over `agg.num_tokens`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pipo_jax.config.schema import Section, at_least, key, need, within
from pipo_jax.losses.aggregation import Aggregation, aggregate, token_mean
from pipo_jax.losses.masking import as_mask
from pipo_jax.losses.policy import check_clip_config, clipped_surrogate, jit_clip, token_log_ratio


@dataclasses.dataclass(frozen=True)
class KlCovSettings(Section):
    """config.loss.kl_cov: KL-Cov's share of penalised tokens and penalty weight (loss.policy=kl_cov)."""

    _section = "loss.kl_cov"
    ratio: float = key(2e-3, "k, the share of the batch's tokens, those of largest covariance of log-prob and "
                       "advantage, that get the |log ratio| penalty", within(0, 1, open_low=True))
    coef: float = key(1.0, "beta, the weight of |logp - logp_old| on the selected tokens", at_least(0))


@dataclasses.dataclass(frozen=True)
class ClipCovSettings(Section):
    """config.loss.clip_cov: Clip-Cov's share of detached tokens and their covariance range (loss.policy=clip_cov)."""

    _section = "loss.clip_cov"
    ratio: float = key(2e-4, "r, the share of the batch's tokens drawn among those of covariance in [low, high] and "
                       "left out of the loss", within(0, 1, open_low=True))
    low: float = key(1.0, "omega_low, the covariance's lower bound")
    high: float = key(5.0, "omega_high, the covariance's upper bound")

    def check(self):
        need(self.low <= self.high, "loss.clip_cov.low", f"{self.low} must be <= loss.clip_cov.high={self.high}")



def check_cov_config(ratio, low=None, high=None) -> None:
    """ValueError naming the field unless 0 < ratio <= 1 and low <= high (Python numbers)."""
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"cov ratio={ratio} must be in (0, 1]")
    if low is not None and high is not None and not low <= high:
        raise ValueError(f"cov bounds [{low}, {high}]: low must be <= high")


def token_covariance(logp_br, adv_br, mask_br):
    """cov_t = (logp_t - mean logp)(A_t - mean A), the means over the valid tokens; no gradient;
    -inf at padding. [B, R]."""
    valid = as_mask(mask_br) > 0
    n = jnp.maximum(jnp.sum(valid), 1)
    logp = jax.lax.stop_gradient(logp_br)
    adv = jax.lax.stop_gradient(adv_br)
    mean_logp = jnp.sum(jnp.where(valid, logp, 0.0)) / n
    mean_adv = jnp.sum(jnp.where(valid, adv, 0.0)) / n
    return jnp.where(valid, (logp - mean_logp) * (adv - mean_adv), -jnp.inf)


def selection_count(ratio: float, mask_br):
    """max(floor(ratio * N), 1), N the valid tokens (int32 scalar; traced)."""
    n = jnp.sum(as_mask(mask_br))
    return jnp.maximum(jnp.floor(ratio * n), 1.0).astype(jnp.int32)


def top_k_mask(score_br, k, eligible_br):
    """True on the min(k, #eligible) eligible entries of largest score (ties: lower flat index
    first); `k` may be traced. [B, R] bool."""
    flat = jnp.where(eligible_br, score_br, -jnp.inf).reshape(-1)
    order = jnp.argsort(-flat, stable=True)
    rank = jnp.zeros_like(order).at[order].set(jnp.arange(flat.size, dtype=order.dtype))
    return (rank.reshape(score_br.shape) < k) & eligible_br


def _finish(loss_br, clipped_br, selected_br, logp_br, logp_old_br, mask_br, agg: Aggregation):
    loss = aggregate(loss_br, mask_br, agg)
    n = agg.num_tokens
    return loss, {
        "pg_loss": loss,
        "pg_clipfrac": token_mean(clipped_br.astype(jnp.float32), mask_br, n),
        "pg_clipfrac_lower": jnp.zeros((), jnp.float32),
        "ppo_kl": token_mean(jax.lax.stop_gradient(logp_old_br - logp_br), mask_br, n),
        "cov_frac": token_mean(selected_br.astype(jnp.float32), mask_br, n),
    }


@functools.partial(jax.jit, static_argnames=("ratio", "coef"))
def kl_cov_loss(logp_br, logp_old_br, adv_br, mask_br, *, agg: Aggregation = Aggregation("token-mean"),
                ratio: float = 2e-3, coef: float = 1.0):
    """KL-Cov: -A r on every token, + coef |logp - logp_old| on the top max(floor(ratio N), 1) tokens
    by covariance. (loss, metrics)."""
    check_cov_config(ratio)
    pg_br = -adv_br * jnp.exp(token_log_ratio(logp_br, logp_old_br))
    selected = top_k_mask(token_covariance(logp_br, adv_br, mask_br), selection_count(ratio, mask_br),
                          as_mask(mask_br) > 0)
    loss_br = pg_br + jnp.where(selected, coef * jnp.abs(logp_br - logp_old_br), 0.0)
    return _finish(loss_br, jnp.zeros_like(selected), selected, logp_br, logp_old_br, mask_br, agg)


@jit_clip(static_argnames=("ratio", "cov_low", "cov_high"))
def clip_cov_loss(logp_br, logp_old_br, adv_br, mask_br, *, key, agg: Aggregation = Aggregation("token-mean"),
                  ratio_low: float = 1 - 0.2, ratio_high: float = 1 + 0.2, ratio: float = 2e-4, cov_low: float = 1.0,
                  cov_high: float = 5.0):
    """Clip-Cov: the token clip (no dual clip) with max(floor(ratio N), 1) unclipped tokens of
    covariance in [cov_low, cov_high], drawn uniformly with `key`, left out. (loss, metrics)."""
    check_clip_config(ratio_low, ratio_high, 0.0)
    check_cov_config(ratio, cov_low, cov_high)
    loss_br, clipped_br, _ = clipped_surrogate(token_log_ratio(logp_br, logp_old_br), adv_br, ratio_low=ratio_low,
                                               ratio_high=ratio_high, clip_ratio_c=0.0)
    valid = as_mask(mask_br) > 0
    cov = token_covariance(logp_br, adv_br, mask_br)
    candidates = valid & ~clipped_br & (cov >= cov_low) & (cov <= cov_high)
    selected = top_k_mask(jax.random.uniform(key, cov.shape), selection_count(ratio, mask_br), candidates)
    loss_br = jnp.where(selected, 0.0, loss_br)
    return _finish(loss_br, clipped_br & valid, selected, logp_br, logp_old_br, mask_br, agg)
