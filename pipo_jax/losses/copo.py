"""COPO (Han, Chen, Shao et al. 2025, "COPO: Consistency-Aware Policy Optimization", arXiv 2508.04138;
docs/math.md §1 "COPO"), minimised. Only the paper's abstract was within reach; the formulas are the
authors' released code's (hijih/copo-code: `compute_score_global`, `compute_grpo_outcome_advantage_with_global`,
`compute_policy_loss_with_global`).

A batch is P prompts x G responses, row b = p*G + g. Per prompt p:
    H_p = -sum_o f_o log2 f_o                 the entropy (bits) of the group's outcomes, f_o = the
                                              share of its G responses with outcome o
    A^l_i = GRPO's group advantage            (the local advantage; 0 for a group of equal rewards)
    R_p = mean_g r_pg  (x (1 - lambda_G H_p), lambda_G = (1 - 1/G) / log2 G, with `consistency_reward`)
    A^g_p = (R_p - mean_p' R_p') / (std_p' R_p' + 1e-6)      the global advantage, over the batch's prompts
    w_i = sigmoid(gamma (H_p - rho)) x gate_i                the local loss's weight
        gate: soft_with_zero [r_i != 0] (the released COPO) | soft_with_forced [A^l_i != 0] | soft 1
and the loss blends two token clips (dual clip included), each on its own advantage:
    L_t = w_i L_clip(A^l_i) + (1 - w_i) L_clip(A^g_i),   aggregated with `agg`.
An outcome is the response itself (`response`: two responses are one outcome when their valid tokens
agree; the extracted answer for tasks whose response is the answer) or its reward (`reward`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from pipo_jax.config.schema import Section, at_least, key
from pipo_jax.losses.aggregation import Aggregation, token_mean
from pipo_jax.losses.masking import as_mask
from pipo_jax.losses.policy import clipped_surrogate, finish_clipped, jit_clip, token_log_ratio

OUTCOMES = ("response", "reward")
BLENDS = ("soft_with_zero", "soft_with_forced", "soft")
STD_EPS = 1e-6  # the authors' epsilon of both standardisations


@dataclasses.dataclass(frozen=True)
class CopoSettings(Section):
    """config.advantage.copo: COPO's local / global blend (advantage.estimator=copo)."""

    _section = "advantage.copo"
    gamma: float = key(5.0, "gamma, the slope of the local loss's weight sigmoid(gamma (H - rho)) in the entropy H "
                       "(bits) of a group's outcomes", at_least(0))
    rho: float = key(1.0, "rho, the outcome entropy (bits) at which the local and global losses weigh the same",
                     at_least(0))
    blend: str = key("soft_with_zero", "where the local weight applies: soft_with_zero (responses of nonzero reward; "
                     "the others take the global loss only: the authors' COPO) | soft_with_forced (responses of a "
                     "nonzero group advantage) | soft (every response)", choices=BLENDS)
    outcome: str = key("response", "what one outcome of the entropy is: response (the same valid tokens; the answer "
                       "for tasks whose response is the answer) | reward (the same reward)", choices=OUTCOMES)
    consistency_reward: bool = key(False, "the global reward is the group's mean reward times 1 - (1 - 1/G) H / "
                                   "log2 G (false: the mean reward, the authors' script)")



def same_outcome(tokens_br, mask_br, rewards_b, group_size: int, outcome: str):
    """bool [P, G, G]: responses g and g' of prompt p have the same outcome. `response`: the same valid
    tokens (same length, same token at every valid position); `reward`: the same reward. `tokens_br`
    int [B, R] (unused for `reward`), `mask_br` [B, R], `rewards_b` [B]."""
    if outcome not in OUTCOMES:
        raise ValueError(f"COPO outcome {outcome!r} is not one of {OUTCOMES}")
    if outcome == "reward":
        r_pg = jnp.asarray(rewards_b, jnp.float32).reshape(-1, group_size)
        return r_pg[:, :, None] == r_pg[:, None, :]
    m = as_mask(mask_br) > 0
    key_pgr = jnp.where(m, tokens_br, -1).reshape(-1, group_size, m.shape[-1])
    return jnp.all(key_pgr[:, :, None, :] == key_pgr[:, None, :, :], axis=-1)


def outcome_entropy(same_pgg):
    """H_p [P] in bits: -sum_o f_o log2 f_o = -(1/G) sum_i log2(c_i / G), c_i the responses sharing i's outcome."""
    g = same_pgg.shape[-1]
    counts_pg = jnp.sum(same_pgg.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.log2(counts_pg / g), axis=-1)


def global_rewards(rewards_b, entropy_p, group_size: int, consistency_reward: bool = False):
    """R_p [P]: the group's mean reward, times 1 - lambda_G H_p with `consistency_reward`
    (lambda_G = (1 - 1/G) / log2 G: the coefficient falls from 1 at one outcome to 1/G at G outcomes)."""
    mean_p = jnp.mean(jnp.asarray(rewards_b, jnp.float32).reshape(-1, group_size), axis=-1)
    if not consistency_reward or group_size < 2:
        return mean_p
    lam = (1.0 - 1.0 / group_size) / math.log2(group_size)
    return mean_p * (1.0 - lam * entropy_p)


def global_advantages(global_rewards_p, *, std_ddof: int = 1, norm_by_std: bool = True):
    """A^g_p [P]: R_p minus the batch mean of R over prompts, divided by their std (ddof `std_ddof`) + 1e-6
    (`norm_by_std`); exactly 0 when every prompt has the same R."""
    r = jnp.asarray(global_rewards_p, jnp.float32)
    centred = r - jnp.mean(r)
    if norm_by_std:
        n = r.shape[0]
        std = jnp.sqrt(jnp.sum(jnp.square(centred)) / max(n - std_ddof, 1))
        centred = centred / (std + STD_EPS)
    return jnp.where(jnp.max(r) == jnp.min(r), 0.0, centred)


def local_weights(entropy_p, rewards_b, local_adv_b, group_size: int, *, gamma: float, rho: float, blend: str):
    """w_i [B]: sigmoid(gamma (H_p - rho)) on each of prompt p's rows, gated per `blend` (module docstring)."""
    if blend not in BLENDS:
        raise ValueError(f"COPO blend {blend!r} is not one of {BLENDS}")
    w_b = jnp.repeat(jax.nn.sigmoid(gamma * (entropy_p - rho)), group_size)
    if blend == "soft_with_zero":
        return w_b * (jnp.asarray(rewards_b) != 0)
    if blend == "soft_with_forced":
        return w_b * (jnp.asarray(local_adv_b) != 0)
    return w_b


@functools.partial(jax.jit, static_argnames=("group_size", "outcome", "gamma", "rho", "blend", "consistency_reward",
                                             "std_ddof", "norm_by_std"))
def copo_advantages(rewards_b, local_adv_b, tokens_br, mask_br, *, group_size: int, outcome: str = "response",
                    gamma: float = 5.0, rho: float = 1.0, blend: str = "soft_with_zero",
                    consistency_reward: bool = False, std_ddof: int = 1, norm_by_std: bool = True):
    """(A^g [B], w [B], H [P]): each row's global advantage (its prompt's), the local loss's weight and the
    groups' outcome entropies, from the rows' rewards [B], their local advantages [B] (GRPO's) and the
    responses (`tokens_br` [B, R], `mask_br` [B, R]). Defaults: the released COPO (gamma 5, rho 1)."""
    entropy_p = outcome_entropy(same_outcome(tokens_br, mask_br, rewards_b, group_size, outcome))
    reward_p = global_rewards(rewards_b, entropy_p, group_size, consistency_reward)
    global_b = jnp.repeat(global_advantages(reward_p, std_ddof=std_ddof, norm_by_std=norm_by_std), group_size)
    weight_b = local_weights(entropy_p, rewards_b, local_adv_b, group_size, gamma=gamma, rho=rho, blend=blend)
    return global_b, weight_b, entropy_p


def blended_advantages(adv_br, global_adv_b, weight_b, mask_br):
    """w A^l + (1 - w) A^g on each valid token [B, R]: the advantage whose clipped loss equals COPO's at
    ratio 1 (both clips inactive), its value and its gradient: PIPO's attribution for COPO."""
    w = weight_b[:, None]
    return jnp.where(as_mask(mask_br) > 0, w * adv_br + (1.0 - w) * global_adv_b[:, None], 0.0)


@jit_clip()
def copo_loss(logp_br, logp_old_br, adv_br, global_adv_b, weight_b, mask_br, *, agg: Aggregation,
              ratio_low: float = 1 - 0.2, ratio_high: float = 1 + 0.2, clip_ratio_c: float = 3.0):
    """(loss, metrics): w L_clip(A^l) + (1 - w) L_clip(A^g) per token (`adv_br` [B, R] the local advantage,
    `global_adv_b`, `weight_b` [B]), aggregated with `agg`. Metrics as `losses/policy.py`'s (token means over
    `agg.num_tokens`, the clip fractions the local loss's), plus "copo_global_clipfrac" and "copo_local_weight"."""
    m = as_mask(mask_br)
    log_ratio = token_log_ratio(logp_br, logp_old_br)
    clip = dict(ratio_low=ratio_low, ratio_high=ratio_high, clip_ratio_c=clip_ratio_c)
    local_br, clipped_br, dual_br = clipped_surrogate(log_ratio, adv_br, **clip)
    global_br = jnp.broadcast_to(global_adv_b[:, None], adv_br.shape)
    glob_br, glob_clipped_br, _ = clipped_surrogate(log_ratio, global_br, **clip)
    w = jnp.broadcast_to(weight_b[:, None], adv_br.shape)
    loss, metrics = finish_clipped(w * local_br + (1.0 - w) * glob_br, clipped_br, dual_br, logp_br, logp_old_br, m,
                                   agg)
    metrics["copo_global_clipfrac"] = token_mean(glob_clipped_br.astype(jnp.float32), m, agg.num_tokens)
    metrics["copo_local_weight"] = token_mean(w, m, agg.num_tokens)
    return loss, metrics
