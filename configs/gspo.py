"""GSPO: group-relative advantages with the sequence-level ratio, clip 3e-4 / 4e-4, no dual clip."""

from configs import base


def get_config(preset: str = "tiny"):
    size, authors = base.paper_preset(preset, "gspo")
    c = base.algorithm_config("gspo", size)
    c.loss.policy = "gspo"
    c.loss.clip_low, c.loss.clip_high, c.loss.clip_ratio_c = 3e-4, 4e-4, 0.0
    c.loss.agg_mode = "seq-mean-token-mean"
    if authors:  # experiments/math/gspo_pipo.yaml: temperature 1.0, top-p 1.0, seq-mean-token-mean
        base.apply_authors(c)
        c.loss.kl_coef = 0.0  # use_kl_loss: False
    return c
