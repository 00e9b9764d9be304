"""GRPO: group-relative advantages, token clip 0.2/0.2 with dual clip, k3 KL loss 0.001."""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.apply_preset(base.base_config(), preset)
    c.algorithm = "grpo"
    c.advantage.estimator = "grpo"
    c.loss.policy = "token_clip"
    c.loss.clip_low, c.loss.clip_high, c.loss.clip_ratio_c = 0.2, 0.2, 3.0
    c.loss.agg_mode = "seq-mean-token-mean"  # paper appendix A.2
    c.pipo.attribution = "group"
    return c
