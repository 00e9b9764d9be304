"""RiskPO (Ren, Jiang, Yang et al. 2025, "RiskPO: Risk-based Policy Optimization via Verifiable Reward for
LLM Post-Training", arXiv 2510.00911; docs/math.md §1 "RiskPO"): the advantages of the Mixed Value-at-Risk
objective over bundles of questions. Only the paper's abstract was within reach; the formulas are the
authors' released code's (RTkenny/RiskPO, `compute_grpo_bundle_rvar_outcome_advantage_quantile_tracking`).

A batch is P prompts x G responses, row b = p*G + g. A bundle is K consecutive prompts (the last one may
hold fewer); its G "papers" take the g-th response of each of its prompts, with the score
    S_ng = sum_{p in bundle n} r_pg                                      [N = ceil(P / K), G]
and q_a, q_b the alpha- and beta-quantiles of bundle n's G scores (linear interpolation). Per paper:
    v = (clip(S, q_a, q_b) - q_b) / (beta - alpha)     RVaR_{alpha,beta}'s term (`natural_baseline`;
                                                       without it: - q_a, the lower end, in place of - q_b)
    c = (min(S, q_a) - q_a) / alpha                    CVaR_alpha's term
    A = (omega c + v) / (omega + 1)  [/ (std_g S + 1e-6) with `norm_by_std`]
and the paper's responses take A by `credit`: `uniform` (each of its K responses A: the likelihood-ratio
gradient of the bundle objective, the paper's probability being the product of its responses'), `std`
(A / (sigma_p + 1e-6), sigma_p question p's reward std, 1 when <= 1e-3) or `sum_mean` (A shared in
proportion to r_pg - mean_p over the paper; equally when that sum is within 1e-6 of 0).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from pipo_jax.config.schema import Section, at_least, key, need, within

CREDITS = ("uniform", "std", "sum_mean")
STD_EPS = 1e-6  # the authors' epsilon of the standardisations
FLAT_STD = 1e-3  # credit=std: a question whose reward std is at most this counts as std 1 (the authors')
FLAT_SUM = 1e-6  # credit=sum_mean: a paper whose deviations sum to within this is shared equally


@dataclasses.dataclass(frozen=True)
class RiskpoSettings(Section):
    """config.advantage.riskpo: RiskPO's bundles and Mixed Value-at-Risk objective (advantage.estimator=riskpo)."""

    _section = "advantage.riskpo"
    bundle_size: int = key(5, "K, consecutive prompts per bundle; a bundle's g-th paper sums the rewards of each "
                           "prompt's g-th response", at_least(1))
    alpha: float = key(0.2, "alpha, the lower quantile level (CVaR_alpha and RVaR's lower end)",
                       within(0, 1, open_low=True, open_high=True))
    beta: float = key(0.8, "beta, RVaR_{alpha,beta}'s upper quantile level", within(0, 1, open_low=True))
    omega: float = key(1.5, "omega, CVaR's weight in the mixed objective (omega CVaR + RVaR) / (omega + 1); 0: RVaR "
                       "alone", at_least(0))
    credit: str = key("uniform", "how a paper's advantage reaches its responses: uniform (each the paper's: the "
                      "bundle objective's gradient) | std (over the question's reward std) | sum_mean (shared in "
                      "proportion to r - the question's mean)", choices=CREDITS)
    natural_baseline: bool = key(True, "RVaR's term clip(S, q_alpha, q_beta) - q_beta (false: - q_alpha)")

    def check(self):
        need(self.alpha < self.beta, "advantage.riskpo.beta",
             f"{self.beta} must be > advantage.riskpo.alpha={self.alpha}")



def _bundled(rewards_b, group_size: int, bundle_size: int):
    """(r_nkg [N, K, G] zero-padded to whole bundles, real_nk bool [N, K]: the prompts that exist)."""
    r_pg = jnp.asarray(rewards_b, jnp.float32).reshape(-1, group_size)
    p = r_pg.shape[0]
    n = math.ceil(p / bundle_size)
    pad = n * bundle_size - p
    r_pg = jnp.concatenate([r_pg, jnp.zeros((pad, group_size), jnp.float32)])
    real = jnp.arange(n * bundle_size) < p
    return r_pg.reshape(n, bundle_size, group_size), real.reshape(n, bundle_size)


def bundle_scores(rewards_b, group_size: int, bundle_size: int):
    """S [N, G]: the g-th responses' reward sum over each bundle of `bundle_size` consecutive prompts."""
    r_nkg, _ = _bundled(rewards_b, group_size, bundle_size)
    return jnp.sum(r_nkg, axis=1)


def bundle_quantiles(scores_ng, alpha: float, beta: float):
    """(q_a [N], q_b [N]): the alpha- and beta-quantiles of each bundle's scores, linear interpolation
    between order statistics (torch.quantile's, numpy's default)."""
    return jnp.quantile(scores_ng, alpha, axis=-1), jnp.quantile(scores_ng, beta, axis=-1)


def mvar_advantages(scores_ng, q_a, q_b, *, alpha: float, beta: float, omega: float, natural_baseline: bool = True):
    """A [N, G] before the std: (omega c + v) / (omega + 1) with v RVaR's and c CVaR's term (module docstring)."""
    s, lo, hi = scores_ng, q_a[:, None], q_b[:, None]
    v = (jnp.clip(s, lo, hi) - (hi if natural_baseline else lo)) / (beta - alpha)
    c = (jnp.minimum(s, lo) - lo) / alpha
    return (omega * c + v) / (omega + 1.0)


def _std(x, axis: int, ddof: int):
    n = x.shape[axis]
    centred = x - jnp.mean(x, axis=axis, keepdims=True)
    return jnp.sqrt(jnp.sum(jnp.square(centred), axis=axis) / max(n - ddof, 1))


@functools.partial(jax.jit, static_argnames=("group_size", "bundle_size", "alpha", "beta", "omega", "natural_baseline",
                                             "credit", "norm_by_std", "std_ddof"))
def riskpo_advantages(rewards_b, group_size: int, *, bundle_size: int = 5, alpha: float = 0.2, beta: float = 0.8,
                      omega: float = 1.5, natural_baseline: bool = True, credit: str = "uniform",
                      norm_by_std: bool = True, std_ddof: int = 1):
    """adv_b [B]: each response's share of its paper's MVaR advantage (module docstring). Defaults: the
    authors' scripts (alpha 0.2, beta 0.8, omega 1.5, K = 5; torch.std's ddof 1) with uniform credit."""
    if credit not in CREDITS:
        raise ValueError(f"RiskPO credit {credit!r} is not one of {CREDITS}")
    if not 0.0 < alpha < beta <= 1.0:
        raise ValueError(f"RiskPO quantile levels must satisfy 0 < alpha < beta <= 1 (got {alpha}, {beta})")
    r_nkg, real_nk = _bundled(rewards_b, group_size, bundle_size)
    scores = bundle_scores(rewards_b, group_size, bundle_size)
    q_a, q_b = bundle_quantiles(scores, alpha, beta)
    paper_ng = mvar_advantages(scores, q_a, q_b, alpha=alpha, beta=beta, omega=omega, natural_baseline=natural_baseline)
    if norm_by_std:
        paper_ng = paper_ng / (_std(scores, -1, std_ddof)[:, None] + STD_EPS)
    share_nkg = jnp.ones_like(r_nkg)
    if credit == "std":
        sigma_nk = _std(r_nkg, -1, std_ddof)
        sigma_nk = jnp.where(sigma_nk > FLAT_STD, sigma_nk, 1.0)
        share_nkg = jnp.broadcast_to(1.0 / (sigma_nk[..., None] + STD_EPS), r_nkg.shape)
    elif credit == "sum_mean":
        dev_nkg = jnp.where(real_nk[..., None], r_nkg - jnp.mean(r_nkg, axis=-1, keepdims=True), 0.0)
        total_ng = jnp.sum(dev_nkg, axis=1)
        flat = jnp.abs(total_ng) <= FLAT_SUM
        equal_n = 1.0 / jnp.sum(real_nk, axis=1).astype(jnp.float32)
        share_nkg = jnp.where(flat[:, None, :], equal_n[:, None, None],
                              dev_nkg / jnp.where(flat, 1.0, total_ng)[:, None, :])
    adv_nkg = paper_ng[:, None, :] * share_nkg
    return adv_nkg.reshape(-1)[: jnp.asarray(rewards_b).shape[0]]
