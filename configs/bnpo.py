"""BNPO (Xiao, Zhang, Cao 2025, "BNPO: Beta Normalization Policy Optimization", arXiv 2506.02864): G
responses per prompt, each advantaged by its reward minus the prompt's success rate p (its group's mean
reward on [0, 1]), divided by the Beta(alpha, beta) density at p; alpha = 1 + a / 3, beta = 1 + b / 3
minimise the gradient's variance when the success rates follow Beta(a, b), whose a, b come from the
moments of a pool of recent success rates carried across iterations (`TrainState.estimator_state`;
`advantage.bnpo.decay`: each earlier batch's weight times 0.9 per iteration, 0 = the current batch alone,
the authors' code) (docs/math.md §1 "BNPO"). The loss is the token clip of the authors' script
(changyi7231/BNPO `recipe/bnpo/run.sh`: clip 0.2 / 0.28, dual clip 10, seq-mean-token-sum, no KL loss).
PIPO: the group attribution (BNPO's advantage is a positive multiple of r - mean in each group).
"""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.algorithm_config("bnpo", preset)
    c.loss.clip_low, c.loss.clip_high, c.loss.clip_ratio_c = 0.2, 0.28, 10.0
    c.loss.agg_mode = "seq-mean-token-sum"  # their actor.loss_agg_mode
    c.loss.kl_coef = 0.0  # use_kl_loss=False, use_kl_in_reward=False in their script
    return c
