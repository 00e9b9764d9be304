"""ADORA (Ren, Huang, Fang et al. 2026, "ADORA: Training Reasoning Models with Dynamic Advantage Estimation on
Reinforcement Learning", arXiv 2602.10019; docs/math.md §1 "ADORA"). The paper's method section was out of reach;
the rule is the authors' released code's (ShadeCloak/ADORA: `compute_grpo_outcome_advantage_ADORA` of the LLM
verl fork, the "Length Advantage" of their blog), named here as what it is.

A batch is P prompts x G responses, row b = p*G + g. Each time a prompt is rolled out its group is classified
anew from its own responses (temporarily, online: no state across iterations):
    correct_b = r_b > threshold
    counted_b = not correct_b and len_b < max_length        (cut-off responses do not count)
    advantageous_p = max_{correct} len > mean_{counted} len  (no correct response: no; none counted: yes)
    w_p = 1 if advantageous_p else lambda
    A_b = w_p x GRPO's group advantage of r_b
A prompt is temporarily advantageous when its longest correct response is longer than its incorrect ones on
average: the group shows that reasoning longer pays; the others' advantages are scaled down by lambda.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pipo_jax.config.schema import Section, at_least, key, within
from pipo_jax.losses.advantages import group_relative_advantages
from pipo_jax.losses.pipo import group_attribution


@dataclasses.dataclass(frozen=True)
class AdoraSettings(Section):
    """config.advantage.adora: ADORA's weight of the temporarily disadvantageous prompts (advantage.estimator=adora)."""

    _section = "advantage.adora"
    tds_weight: float = key(0.1, "lambda (the authors' Length_weight.lamda), the weight of the advantages of a "
                            "temporarily disadvantageous prompt (no correct response longer than its incorrect ones' "
                            "mean length); 1: GRPO", within(0, 1))
    success_threshold: float = key(0.5, "a response is correct when its reward exceeds this (the rewards' midpoint; "
                                   "the authors' 1.01 is for Logic-RL's -3..3 scale)")
    max_length: int = key(0, "an incorrect response this many tokens long or longer (cut off) is left out of the "
                          "incorrect ones' mean length; 0 = rollout.max_new_tokens", at_least(0))



@functools.partial(jax.jit, static_argnames=("group_size", "max_length"))
def length_advantageous(rewards_b, lengths_b, group_size: int, *, success_threshold, max_length: int):
    """bool [P]: the prompt's longest correct response (reward > `success_threshold`) is longer than the mean
    length of its incorrect ones shorter than `max_length` tokens; False without a correct response, True with
    correct ones but no incorrect one counted. `lengths_b` [B]: each response's valid tokens."""
    r_pg = jnp.asarray(rewards_b, jnp.float32).reshape(-1, group_size)
    len_pg = jnp.asarray(lengths_b, jnp.float32).reshape(-1, group_size)
    correct_pg = r_pg > success_threshold
    counted_pg = ~correct_pg & (len_pg < max_length)
    longest_p = jnp.max(jnp.where(correct_pg, len_pg, -jnp.inf), axis=-1)
    n_counted_p = jnp.sum(counted_pg, axis=-1)
    mean_p = jnp.sum(jnp.where(counted_pg, len_pg, 0.0), axis=-1) / jnp.maximum(n_counted_p, 1)
    return jnp.any(correct_pg, axis=-1) & ((n_counted_p == 0) | (longest_p > mean_p))


def adora_weights(rewards_b, lengths_b, group_size: int, *, success_threshold, max_length: int, tds_weight):
    """w_b [B]: 1 on the rows of a temporarily advantageous prompt (`length_advantageous`), `tds_weight` on the
    others'."""
    tas_p = length_advantageous(rewards_b, lengths_b, group_size, success_threshold=success_threshold,
                                max_length=max_length)
    return jnp.repeat(jnp.where(tas_p, 1.0, tds_weight).astype(jnp.float32), group_size)


def adora_advantages(rewards_b, lengths_b, group_size: int, *, success_threshold, max_length: int, tds_weight,
                     std_ddof: int = 1, norm_by_std: bool = True):
    """(A_b [B], w_b [B]): GRPO's group advantage of `rewards_b` (ddof `std_ddof`, + 1e-6) times ADORA's weight
    of the row's prompt (`adora_weights`)."""
    w_b = adora_weights(rewards_b, lengths_b, group_size, success_threshold=success_threshold, max_length=max_length,
                        tds_weight=tds_weight)
    adv_b = group_relative_advantages(rewards_b, group_size, std_ddof=std_ddof, norm_by_std=norm_by_std)
    return adv_b * w_b, w_b


def adora_attribution(adv_br, weight_b, mask_br, group_size: int, additive_eps: bool = False):
    """PIPO's attribution of ADORA [B, R]: the group attribution G abar_i / sum_j |abar_j| (which divides the
    prompt's weight out of its advantages) times the prompt's weight `weight_b` [B] again."""
    return weight_b[:, None] * group_attribution(adv_br, mask_br, group_size, additive_eps)
