"""Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv 2505.22617): GRPO's group advantages and the token clip 0.2 / 0.2 (no dual clip), with
r = 2e-4 of the batch's tokens, drawn uniformly among the unclipped ones whose centred covariance
cov_t = (logp_t - mean logp)(A_t - mean A) lies in [omega_low, omega_high] = [1, 5], left out of the
loss (docs/math.md §1 "KL-Cov and Clip-Cov"). The clip is GRPO's; the authors' released scripts clip at
1 / 1 (ratio bounds [0, 2]: --config.loss.clip_low=1 --config.loss.clip_high=1). token-mean as the
authors' verl recipe, no KL to the reference (the paper's runs fix it at 0). PIPO: the group attribution.
"""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.algorithm_config("clip_cov", preset)
    c.loss.clip_low, c.loss.clip_high, c.loss.clip_ratio_c = 0.2, 0.2, 0.0
    c.loss.agg_mode = "token-mean"
    c.loss.kl_coef = 0.0
    return c
