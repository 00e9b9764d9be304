"""RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning
from Human Feedback in LLMs"; the estimator of Kool et al. 2019): G responses per prompt, each with the
leave-one-out baseline, A_i = R_i - mean_{j != i} R_j = G / (G - 1) * (R_i - mean_g), the same value
on every token of response i (docs/math.md §1 "RLOO"). R_i is the sequence reward with the KL to the
reference folded in, R_i = r_i - beta * sum_t (logp_old - logp_ref) (the paper's sequence-level
KL-shaped reward: `loss.kl_in_reward` with k1). The loss is the token clip with dual clip, as verl's
rloo trains it (verl's actor, token-mean). PIPO: the group attribution (RLOO is group-relative).
"""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.algorithm_config("rloo", preset)
    c.loss.clip_low, c.loss.clip_high, c.loss.clip_ratio_c = 0.2, 0.2, 3.0
    c.loss.agg_mode = "token-mean"  # verl's actor.loss_agg_mode default
    c.loss.kl_in_reward = True  # R_i = r_i - beta * log(pi_old(y|x) / pi_ref(y|x)), the paper's reward
    c.loss.kl_estimator = "k1"
    return c
