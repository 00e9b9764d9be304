"""GRPO: group-relative advantages, token clip 0.2/0.2 with dual clip, k3 KL loss 0.001."""

from configs import base


def get_config(preset: str = "tiny"):
    size, authors = base.paper_preset(preset, "grpo")
    c = base.algorithm_config("grpo", size)
    c.loss.clip_low, c.loss.clip_high, c.loss.clip_ratio_c = 0.2, 0.2, 3.0
    c.loss.agg_mode = "seq-mean-token-mean"  # paper appendix A.2
    if authors:  # experiments/math/grpo_pipo.yaml and the verl defaults it keeps
        base.apply_authors(c)
        c.rollout.temperature, c.rollout.top_p = 0.7, 0.95
        c.loss.agg_mode = "token-mean"  # actor.loss_agg_mode default
    return c
