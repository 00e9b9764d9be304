"""REINFORCE++ (Hu et al. 2025, arXiv 2501.03262): PPO without a critic. The KL to the reference is in
the reward per token, r_t = -beta * KL_t with KL_t = logp_old - logp_ref (k1), plus the outcome
reward at the last token; the advantage of token t is the return sum_{s >= t} gamma^(s-t) r_s
(gamma = 1: A_t = r - beta * sum_{s >= t} KL_s), whitened over every valid token of the batch (global,
not per group); the loss is the token clip (docs/math.md §1 "REINFORCE++"). Any G (the paper's
general variant samples k >= 1 responses per prompt).

The baseline variant (REINFORCE++-baseline, k > 1): `--config.advantage.estimator=reinforce_pp_baseline`:
the sequence reward minus its group's mean on every token, then the same global whitening.
PIPO: the advantages themselves are the attribution, as PPO's GAE advantages (`pipo.attribution=gae`).
"""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.algorithm_config("reinforce_pp", preset)
    c.advantage.gamma = 1.0
    c.loss.clip_low, c.loss.clip_high, c.loss.clip_ratio_c = 0.2, 0.2, 3.0
    c.loss.agg_mode = "token-mean"  # the loss over the batch's tokens, as its advantages are normalised
    c.loss.kl_in_reward = True  # r_t = -beta * KL_t (+ the outcome reward at the last token)
    c.loss.kl_estimator = "k1"
    return c
