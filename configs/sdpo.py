"""SDPO: self-distillation from the feedback-conditioned EMA teacher (generalised JSD, top-100)."""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.algorithm_config("sdpo", preset)
    c.loss.policy = "sdpo_jsd"  # or sdpo_token (the token-level reverse-KL form)
    c.loss.agg_mode = "token-mean"
    c.loss.kl_coef = 0.0  # the teacher anchors the student; no reference KL term
    return c
