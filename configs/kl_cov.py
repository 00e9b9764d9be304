"""KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv 2505.22617): GRPO's group advantages; the loss -A r on every token (no clip), plus
beta |logp - logp_old| on the top k of the batch's tokens by the centred covariance
cov_t = (logp_t - mean logp)(A_t - mean A) (docs/math.md §1 "KL-Cov and Clip-Cov"). k = 2e-3 and
beta = 1 are the paper's Qwen2.5-7B settings (2e-4 for 32B), token-mean as the authors' verl
recipe, no KL to the reference (the paper's runs fix it at 0). PIPO: the group attribution.
"""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.algorithm_config("kl_cov", preset)
    c.loss.clip_ratio_c = 0.0  # no clip at all, so no dual clip
    c.loss.agg_mode = "token-mean"
    c.loss.kl_coef = 0.0
    return c
