"""BAPO (Xi et al. 2025, "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced
Policy Optimization with Adaptive Clipping", arXiv 2510.18927; docs/math.md §1 "BAPO"), minimised.

The PPO surrogate with explicit ratio bounds [c_low, c_high] (Eq. 4 with 1 - eps, 1 + eps replaced)
whose bounds are chosen for each update from the batch at hand (the loss's micro-batch, no gradient):
with r_t = exp(clip(logp - logp_old, -20, 20)) and w_t = pi_old(y_t) = exp(logp_old_t) (1 without the
paper's weight), a token's contribution to the loss is w_t * min(r_t A_t, clip(r_t, c_low, c_high) A_t),
which is w A min(r, c_high) for A > 0 and -w |A| max(r, c_low) for A < 0, so

    P(c_high) = sum_{A>0} w A min(r, c_high),   N(c_low) = sum_{A<0} w |A| max(r, c_low),
    rho = P / (P + N)      (Eq. 8: the positive tokens' share of the contribution; 1 when P + N = 0).

Algorithm 1: start at (c_low, c_high) = (a-, a+); while rho < rho_0 and c_low + delta_2 <= b-, raise
c_high by delta_1 while c_high + delta_1 <= b+, else raise c_low by delta_2. The states it can visit
form one path (`bound_path`, fixed by the settings): the chosen bounds are the first state of the path
with rho >= rho_0, else its last. The loss is then the token clip (without dual clip unless `clip_ratio_c`),
    L_t = max(-A_t r_t, -A_t clip(r_t, c_low, c_high)),   aggregated with `agg`.

`variant="released_code"`: the rule of the authors' released verl code instead (WooooDyy/BAPO,
`recipe/bapo/policy_loss.py:compute_policy_loss_bapo`): c_low rises first, by delta_2 up to b- (each step
`min(c + delta, b)`, in Python floats), then c_high by delta_1 up to b+ (`released_code_path`), and a state
meets the target when P / (N + 1e-8) >= `rho` (N = 0: always), `rho` read as the code's `adv_ratio_target`,
a bound on P / N (its script's 0.5 is a positive share of 1/3, its yaml's 1 the share 1/2). `clip_ratio_c`
(either variant): the dual clip, min(L_t, -A_t c) for A_t < 0 (the released code's, c = 3); 0 / None: off.

Shares `losses/policy.py`'s signature and its metrics "pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl",
plus "bapo_clip_low", "bapo_clip_high" and "bapo_pos_share" (the chosen state's rho) as token means over
`agg.num_tokens`, so they add up over micro-batches to the token-weighted mean of each one's value.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax.config.schema import Section, above, at_least, key, need, within
from pipo_jax.losses.aggregation import Aggregation, aggregate, token_mean
from pipo_jax.losses.masking import as_mask
from pipo_jax.losses.policy import clipped_surrogate, jit_clip, token_log_ratio

_STEPS_EPS = 1e-9  # Algorithm 1 compares sums of steps with the range's end: exact in reals, not in floats
VARIANTS = ("paper", "released_code")
RELEASED_EPS = 1e-8  # the released code's P / (N + eps) (its `policy_loss.eps`)


@dataclasses.dataclass(frozen=True)
class BapoSettings(Section):
    """config.loss.bapo: BAPO's bound search (loss.policy=bapo): the clip bounds' start, range and steps, and the
    target rho_0 of the positive-advantage tokens' contribution; defaults the paper's §5.1 and Algorithm 1."""

    _section = "loss.bapo"
    rho: float = key(0.4, "rho_0, the share of the loss's contribution the positive-advantage tokens must reach "
                     "(Eq. 8) before the clip bounds stop moving; with variant=released_code the code's "
                     "adv_ratio_target, a bound on their ratio P / N", at_least(0))
    variant: str = key("paper", "paper: Algorithm 1 (c_high rises first, the share P / (P + N) >= rho) | "
                       "released_code: the authors' verl code (c_low rises first, P / N >= rho)", choices=VARIANTS)
    lower_start: float = key(0.6, "a-, the lower ratio bound c_low at the start of each update",
                             within(0, 1, open_low=True))
    lower_max: float = key(0.9, "b-, the most c_low may rise to", within(0, 1, open_low=True))
    lower_step: float = key(0.02, "delta_2, c_low's step", above(0))
    upper_start: float = key(1.2, "a+, the upper ratio bound c_high at the start of each update", at_least(1))
    upper_max: float = key(3.0, "b+, the most c_high may rise to", at_least(1))
    upper_step: float = key(0.05, "delta_1, c_high's step", above(0))
    prob_weight: bool = key(True, "each token's contribution in Eq. 8 weighted by its behaviour probability "
                            "pi_old(y_t), as the paper writes it (false: unweighted, the authors' released verl code)")

    def check(self):
        need(self.variant != "paper" or self.rho <= 1, "loss.bapo.rho",
             f"{self.rho} must be <= 1: with loss.bapo.variant=paper it is a share of the contribution")
        need(self.lower_start <= self.lower_max, "loss.bapo.lower_max",
             f"{self.lower_max} must be >= loss.bapo.lower_start={self.lower_start}")
        # Algorithm 1 moves the bounds only while c_low + delta_2 <= b-: a range without one lower step would
        # never adapt (the tolerance of `bound_path`: exact in reals, not in floats)
        need(self.variant != "paper" or (self.lower_max - self.lower_start) / self.lower_step + _STEPS_EPS >= 1,
             "loss.bapo.lower_max", f"{self.lower_max} leaves no step of loss.bapo.lower_step={self.lower_step} above "
             f"loss.bapo.lower_start={self.lower_start} (Algorithm 1 would never move the bounds)")
        need(self.upper_start <= self.upper_max, "loss.bapo.upper_max",
             f"{self.upper_max} must be >= loss.bapo.upper_start={self.upper_start}")



def bound_path(lower_start: float, lower_max: float, lower_step: float, upper_start: float, upper_max: float,
               upper_step: float) -> tuple[np.ndarray, np.ndarray]:
    """(c_low [S], c_high [S]): the states Algorithm 1 visits in order, float64. With k1 upper and k2
    lower steps that fit their ranges, S = k1 + k2 + 1 (the upper bound first); S = 1 when no lower
    step fits (k2 = 0: the loop's guard c_low + delta_2 <= b- never holds, so nothing moves)."""
    if not (lower_step > 0 and upper_step > 0):
        raise ValueError(f"BAPO steps must be > 0 (got delta_2={lower_step}, delta_1={upper_step})")
    k1 = max(int(math.floor((upper_max - upper_start) / upper_step + _STEPS_EPS)), 0)
    k2 = max(int(math.floor((lower_max - lower_start) / lower_step + _STEPS_EPS)), 0)
    if k2 == 0:
        return np.array([lower_start]), np.array([upper_start])
    highs = [upper_start + k * upper_step for k in range(k1 + 1)] + [upper_start + k1 * upper_step] * k2
    lows = [lower_start] * (k1 + 1) + [lower_start + j * lower_step for j in range(1, k2 + 1)]
    return np.array(lows), np.array(highs)


def released_code_path(lower_start: float, lower_max: float, lower_step: float, upper_start: float,
                       upper_max: float, upper_step: float) -> tuple[np.ndarray, np.ndarray]:
    """(c_low [S], c_high [S]): the states the released code's loops visit in order, float64: c_low from a-
    while below b-, each step `min(c_low + delta_2, b-)`, then c_high the same way up to b+ (Python float
    additions, as the code's)."""
    if not (lower_step > 0 and upper_step > 0):
        raise ValueError(f"BAPO steps must be > 0 (got delta_2={lower_step}, delta_1={upper_step})")
    low, high = float(lower_start), float(upper_start)
    lows, highs = [low], [high]
    while low < lower_max:
        low = min(low + lower_step, lower_max)
        lows.append(low), highs.append(high)
    while high < upper_max:
        high = min(high + upper_step, upper_max)
        lows.append(low), highs.append(high)
    return np.array(lows), np.array(highs)


def contributions(ratio_br, adv_br, weight_br, mask_br, lows_s, highs_s):
    """(P [S], N [S]): the positive and (the magnitude of) the negative tokens' contributions of Eq. 8
    at each state (c_low, c_high) = (lows_s[s], highs_s[s]); `ratio_br`, `adv_br`, `weight_br` [B, R]."""
    valid = as_mask(mask_br) > 0
    pos = jnp.where(valid & (adv_br > 0), weight_br * adv_br, 0.0)
    neg = jnp.where(valid & (adv_br < 0), -weight_br * adv_br, 0.0)
    highs = jnp.asarray(highs_s, ratio_br.dtype)[:, None, None]
    lows = jnp.asarray(lows_s, ratio_br.dtype)[:, None, None]
    p = jnp.sum(pos[None] * jnp.minimum(ratio_br[None], highs), axis=(1, 2))
    n = jnp.sum(neg[None] * jnp.maximum(ratio_br[None], lows), axis=(1, 2))
    return p, n


def positive_share(p_s, n_s):
    """rho = P / (P + N) [S]; 1 where P + N = 0 (no token contributes: nothing to balance)."""
    total = p_s + n_s
    return jnp.where(total > 0, p_s / jnp.where(total > 0, total, 1.0), 1.0)


def released_code_met(p_s, n_s, target: float):
    """[S] bool: the released code's test, P / (N + 1e-8) >= target, true where N <= 0 (its infinite ratio)."""
    ratio = p_s / (n_s + jnp.asarray(RELEASED_EPS, n_s.dtype))
    return (n_s <= 0) | (ratio >= target)


def first_met(met_s):
    """Index (int32 scalar) of the first state that meets the target, else the last one (the search's stop)."""
    return jnp.where(jnp.any(met_s), jnp.argmax(met_s), met_s.shape[0] - 1).astype(jnp.int32)


def chosen_state(rho_s, rho_0: float):
    """Index (int32 scalar) of the first state with rho >= rho_0, else the last one (Algorithm 1's stop)."""
    return first_met(rho_s >= rho_0)


_STATIC = ("rho", "lower_start", "lower_max", "lower_step", "upper_start", "upper_max", "upper_step", "prob_weight",
           "variant")


@jit_clip(static_argnames=_STATIC)
def bapo_loss(logp_br, logp_old_br, adv_br, mask_br, *, agg: Aggregation, rho: float = 0.4,
              lower_start: float = 0.6, lower_max: float = 0.9, lower_step: float = 0.02, upper_start: float = 1.2,
              upper_max: float = 3.0, upper_step: float = 0.05, prob_weight: bool = True, variant: str = "paper",
              clip_ratio_c: float = 0.0):
    """(loss, metrics): the token clip at the bounds the search chooses on this batch (module docstring).
    Defaults: the paper's (rho_0 = 0.4, [a-, b-] = [0.6, 0.9], [a+, b+] = [1.2, 3.0], delta_1 = 0.05,
    delta_2 = 0.02, Algorithm 1's search, no dual clip); `prob_weight=False`: Eq. 8's sums without the
    pi_old(y_t) weight; `variant="released_code"`: the released code's search and test; `clip_ratio_c`: the
    dual clip's c (a Python number or a float32 array; 0: off)."""
    if variant not in VARIANTS:
        raise ValueError(f"BAPO variant={variant!r} is not one of {VARIANTS}")
    m = as_mask(mask_br)
    ratio_br = jnp.exp(token_log_ratio(logp_br, logp_old_br))
    path = bound_path if variant == "paper" else released_code_path
    lows_s, highs_s = path(lower_start, lower_max, lower_step, upper_start, upper_max, upper_step)
    r = jax.lax.stop_gradient(ratio_br)
    weight_br = jnp.exp(logp_old_br) if prob_weight else jnp.ones_like(logp_old_br)
    p_s, n_s = contributions(r, jax.lax.stop_gradient(adv_br), jax.lax.stop_gradient(weight_br), m, lows_s, highs_s)
    rho_s = positive_share(p_s, n_s)
    s = chosen_state(rho_s, rho) if variant == "paper" else first_met(released_code_met(p_s, n_s, rho))
    c_low = jnp.asarray(lows_s, jnp.float32)[s]
    c_high = jnp.asarray(highs_s, jnp.float32)[s]
    loss_br, clipped_br, dual_br = clipped_surrogate(token_log_ratio(logp_br, logp_old_br), adv_br, ratio_low=c_low,
                                                     ratio_high=c_high, clip_ratio_c=clip_ratio_c)
    loss = aggregate(loss_br, m, agg)
    n = agg.num_tokens
    ones = jnp.ones_like(m)
    metrics = {
        "pg_loss": loss,
        "pg_clipfrac": token_mean(clipped_br.astype(jnp.float32), m, n),
        "pg_clipfrac_lower": token_mean(dual_br.astype(jnp.float32), m, n),
        "ppo_kl": token_mean(jax.lax.stop_gradient(logp_old_br - logp_br), m, n),
        "bapo_clip_low": token_mean(c_low * ones, m, n),
        "bapo_clip_high": token_mean(c_high * ones, m, n),
        "bapo_pos_share": token_mean(rho_s[s] * ones, m, n),
    }
    return loss, metrics
