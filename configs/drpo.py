"""DRPO (Li, Chen, Lin, Yang 2025, "DRPO: Efficient Reasoning via Decoupled Reward Policy Optimization",
arXiv 2510.04474): per prompt, the correct responses' scores (mean token log-prob) weighted by the
closed-form length reward exp((1 - |o| / R) / lambda) normalised among the correct ones only, minus
tau x the log-mean-exp of the incorrect ones' scores / tau; the KL to the behaviour policy held near
delta by the penalty beta (docs/math.md §1 "DRPO"). GRPO's advantages (binary rewards) mark which
responses are correct. tau = 10, lambda = 0.1, beta = 1e3, delta = 1e-4: the authors' scripts. The loss
reads whole groups: unshuffled rows, one micro-batch per mini-batch. PIPO: the group attribution.
"""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.algorithm_config("drpo", preset)
    c.loss.clip_ratio_c = 0.0
    c.loss.kl_coef = 0.0  # use_kl_loss=False in their scripts
    c.train.shuffle = False  # whole groups in each mini-batch, as their (unshuffled) split
    c.train.micro_batch_size_per_device = 0
    return c
