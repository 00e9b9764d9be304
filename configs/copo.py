"""COPO (Han, Chen, Shao et al. 2025, "COPO: Consistency-Aware Policy Optimization", arXiv 2508.04138): GRPO's
group advantage (the local one) beside a global one, each prompt's mean reward standardised over the
batch's prompts, so a group whose responses all earn the same reward still has a signal; each response's
loss blends the token clip on the local advantage (weight w = sigmoid(gamma (H - rho)), H the entropy of
its group's outcomes, zeroed on responses of reward 0: the released COPO) with the token clip on the
global one (weight 1 - w) (docs/math.md §1 "COPO"). gamma = 5, rho = 1, G's std by torch.std, the clip
0.2 / 0.2 with verl's dual clip 3, seq-mean-token-mean, no KL loss: the authors' run_copo.sh. PIPO: COPO's
blended advantage w A_local + (1 - w) A_global as the attribution.
"""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.algorithm_config("copo", preset)
    c.advantage.std_ddof = 1  # torch.std in their advantage code
    c.loss.clip_low, c.loss.clip_high, c.loss.clip_ratio_c = 0.2, 0.2, 3.0
    c.loss.agg_mode = "seq-mean-token-mean"
    c.loss.kl_coef = 0.0  # use_kl_loss=false
    return c
