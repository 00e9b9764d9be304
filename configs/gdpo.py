"""GDPO (Liu, Dong, Lu et al. 2026, "GDPO: Group reward-Decoupled Normalization Policy Optimization for
Multi-reward RL Optimization", arXiv 2601.05242): the task's reward components (`Task.reward_weights`: the
built-in task's `answer` and `stop`) each normalised within its prompt's group of G responses, summed with
the reward's weights, and the sum normalised over the batch, so that distinct combinations of the components
with the same total keep distinct advantages (docs/math.md §1 "GDPO"); a task without reward components is
refused. The loss is the token clip of the authors' TRL code (NVlabs/GDPO `trl-GDPO`, trl 0.18's GRPO
trainer): 0.2 / 0.2 without dual clip, the token mean over the batch (its `loss_type="bnpo"`), the k3 KL loss
at 0.04 (its `beta`), the std by torch.std. PIPO: the group attribution of GDPO's advantage.
"""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.algorithm_config("gdpo", preset)
    c.advantage.std_ddof = 1  # torch.std in both of GDPO's normalisations
    c.loss.clip_low, c.loss.clip_high, c.loss.clip_ratio_c = 0.2, 0.2, 0.0  # epsilon 0.2, delta None
    c.loss.agg_mode = "token-mean"  # loss_type="bnpo", trl 0.18's default
    c.loss.kl_estimator, c.loss.kl_coef = "k3", 0.04  # beta, trl 0.18's default
    return c
