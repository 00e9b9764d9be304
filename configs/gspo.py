"""GSPO: group-relative advantages with the sequence-level ratio, clip 3e-4 / 4e-4, no dual clip."""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.apply_preset(base.base_config(), preset)
    c.algorithm = "gspo"
    c.advantage.estimator = "grpo"
    c.loss.policy = "gspo"
    c.loss.clip_low, c.loss.clip_high, c.loss.clip_ratio_c = 3e-4, 4e-4, 0.0
    c.loss.agg_mode = "seq-mean-token-mean"
    c.pipo.attribution = "group"
    return c
