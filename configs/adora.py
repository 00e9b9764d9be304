"""ADORA (Ren, Huang, Fang et al. 2026, "ADORA: Training Reasoning Models with Dynamic Advantage Estimation on
Reinforcement Learning", arXiv 2602.10019): GRPO's group advantages, reweighted each iteration by what the
prompt's own rollouts show: a prompt whose longest correct response is longer than its incorrect responses'
mean length (cut-off ones left out) is temporarily advantageous and keeps its advantages, the others' are
multiplied by lambda = 0.1 (docs/math.md §1 "ADORA"; the rule of the authors' released code, the paper's
method section being out of reach). The loss is that of their verl script (ShadeCloak/ADORA `ADORA/ADORA.sh`
and its verl defaults): the token clip 0.2 / 0.2 without dual clip, the token mean, the k3 KL loss at 0.001,
the entropy bonus 0.001, the group std by torch.std. PIPO: the group attribution times the prompt's weight.
"""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.algorithm_config("adora", preset)
    c.advantage.std_ddof = 1  # torch.std in their GRPO advantage
    c.loss.clip_low, c.loss.clip_high, c.loss.clip_ratio_c = 0.2, 0.2, 0.0  # clip_ratio 0.2, no dual clip
    c.loss.agg_mode = "token-mean"  # verl_F.masked_mean over the micro-batch's tokens
    c.loss.kl_estimator, c.loss.kl_coef = "k3", 0.001  # use_kl_loss, low_var_kl, kl_loss_coef
    c.loss.entropy_coef = 0.001  # entropy_coeff
    return c
