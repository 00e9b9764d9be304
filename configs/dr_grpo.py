"""Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like training: a critical perspective"):
GRPO without its two normalisations. The advantage is the group-centred reward A_i = R_i - mean_g
(no division by the group std: docs/math.md §1, `norm_by_std=False`), and the token clip loss of a response
is summed over its tokens and divided by a constant, the maximum response length
`rollout.max_new_tokens`, not by the response's own length (`seq-mean-token-sum-norm`: the mean over
responses of sum_t l_t / max_new_tokens, the paper's Eq. for Dr. GRPO with 1/|o_i| removed). The clip,
KL and PIPO settings are GRPO's.
"""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.algorithm_config("dr_grpo", preset)
    c.advantage.norm_by_std = False  # A_i = R_i - mean_g
    c.loss.clip_low, c.loss.clip_high, c.loss.clip_ratio_c = 0.2, 0.2, 3.0
    c.loss.agg_mode = "seq-mean-token-sum-norm"  # sum over tokens / max_new_tokens, mean over responses
    return c
