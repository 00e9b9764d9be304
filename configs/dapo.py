"""DAPO: clip-higher 0.2 / 0.28, token-mean aggregation, dynamic sampling of informative groups."""

from configs import base


def get_config(preset: str = "tiny"):
    size, authors = base.paper_preset(preset, "dapo")
    c = base.algorithm_config("dapo", size)
    c.loss.clip_low, c.loss.clip_high, c.loss.clip_ratio_c = 0.2, 0.28, 3.0
    c.loss.agg_mode = "token-mean"
    c.dapo.dynamic_sampling = True
    # dapo.gen_prompts_per_batch stays 0: each generation batch is rollout.prompts_per_batch prompts,
    # read when the config is validated, so a command-line override of the batch carries over
    if size in ("qwen3_4b", "qwen3_8b"):
        c.task.epochs = 9.0  # paper Table 5 (filtered groups consume more prompts)
    if authors:  # experiments/math/dapo_pipo.yaml (temperature 1.0, top-p 1.0, k3 KL 0.001, token-mean)
        base.apply_authors(c)
        c.loss.clip_ratio_c = 10.0
        # recipe/dapo/dapo_ray_trainer.py pushes mu_t once, after the base step (line 392)
        c.pipo.authors.window_twice = False
    return c
