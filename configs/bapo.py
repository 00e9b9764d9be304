"""BAPO (Xi et al. 2025, "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced Policy
Optimization with Adaptive Clipping", arXiv 2510.18927): GRPO's group advantages and the PPO surrogate
whose ratio bounds [c_low, c_high] are chosen on each update (Algorithm 1): from [a-, a+], c_high rises by
delta_1 up to b+, then c_low by delta_2 up to b-, until the positive-advantage tokens' share of the
loss's contribution (Eq. 8, each token weighted by pi_old(y_t)) reaches rho_0 (docs/math.md §1 "BAPO").
rho_0 = 0.4, [a-, b-] = [0.6, 0.9], [a+, b+] = [1.2, 3.0], delta_1 = 0.05, delta_2 = 0.02: the paper's
§5.1; no dual clip (the paper's objective); Algorithm 1's search (loss.bapo.variant=paper; the authors'
released code's search: released_code). PIPO: the group attribution; the PI step (Eq. 11) clips at
BAPO's start bounds [a-, a+] (`loss.clip_low` = 1 - a-, `loss.clip_high` = a+ - 1).
"""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.algorithm_config("bapo", preset)
    c.loss.clip_low, c.loss.clip_high, c.loss.clip_ratio_c = 0.4, 0.2, 0.0
    c.loss.agg_mode = "seq-mean-token-mean"  # GRPO's (the paper builds BAPO on GRPO)
    return c
