"""RiskPO (Ren, Jiang, Yang et al. 2025, "RiskPO: Risk-based Policy Optimization via Verifiable Reward for LLM
Post-Training", arXiv 2510.00911): bundles of K = 5 consecutive prompts, each of their G papers the sum of
one response per prompt, and the advantages of the Mixed Value-at-Risk objective of the bundle score,
(omega CVaR_alpha + RVaR_{alpha,beta}) / (omega + 1) at the bundle's empirical quantiles, divided by the
bundle scores' std, every response of a paper taking its advantage (docs/math.md §1 "RiskPO").
alpha = 0.2, beta = 0.8, omega = 1.5, torch.std, no KL loss: the authors' scripts; their quantile tracking
across iterations is left out (the quantiles are each bundle's own). The token clip as verl's actor
(0.2 / 0.2, dual clip 3, token-mean). PIPO: the advantages themselves as the attribution.
"""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.algorithm_config("riskpo", preset)
    c.advantage.std_ddof, c.advantage.norm_by_std = 1, True  # torch.std of the bundle scores
    c.loss.clip_low, c.loss.clip_high, c.loss.clip_ratio_c = 0.2, 0.2, 3.0
    c.loss.agg_mode = "token-mean"  # verl's actor.loss_agg_mode default
    c.loss.kl_coef = 0.0  # use_kl_loss=False
    return c
