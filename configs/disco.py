"""DisCO (Li, Lin, Galanti, Tu, Yang 2025, "DisCO: Reinforcing Large Reasoning Models with Discriminative
Constrained Optimization", arXiv 2505.12366): per prompt, the positive responses' mean score minus tau x
the log-mean-exp of the negative ones' scores / tau, the score a non-clipping one (the token mean of
log pi, `loss.disco.score=log_likelihood`, or of the ratio to pi_old, `likelihood_ratio`), and the KL
trust region KL(pi_old || pi) <= delta held by the squared-hinge penalty beta (docs/math.md §1 "DisCO").
`loss.disco.negatives=mean` is DisCO-b. GRPO's advantages (binary rewards) mark which responses are
positive. tau = 10, beta = 1e3, delta = 1e-4: the authors' log-likelihood scripts (with
likelihood_ratio they set tau = 1). The loss reads whole groups: unshuffled rows, one micro-batch per
mini-batch. PIPO: the group attribution.
"""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.algorithm_config("disco", preset)
    c.loss.clip_ratio_c = 0.0
    c.loss.kl_coef = 0.0  # use_kl_loss=False in their scripts
    c.train.shuffle = False  # whole groups in each mini-batch (their balance_batch=False)
    c.train.micro_batch_size_per_device = 0
    return c
