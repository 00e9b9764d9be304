"""Theory of docs/math.md §3: the GRPO gradient scale eta(p, G) (paper Theorem 6.2, Corollary 6.3).

For a query with success probability p and G i.i.d. binary-reward responses, conditioned on a
non-degenerate group (1 <= S <= G-1 successes) and at ratio 1, the expected GRPO update
(1/G) sum_i A_i grad log pi(y_i), A_i = (R_i - mean) / std (population std), equals
eta(p) * grad p, with

    eta(p, G) = sum_{k=1}^{G-1} sqrt(k (G-k)) C(G,k) p^k (1-p)^(G-k)
                / (G p (1-p) (1 - p^G - (1-p)^G)),

i.e. E[sqrt(S (G-S)) | 1 <= S <= G-1] / (G p (1-p)). Near p -> 0 or 1,
eta ~ sqrt(G-1) / (G p (1-p)) (`eta_asymptote`).

`grpo_gradient_scale_mc` measures that scale on a softmax bandit with the package's own
group-relative advantages and token-clip loss; the tests hold it to `eta` within its
Monte-Carlo standard error, and `experiments/figure3a.py` plots both.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax.losses.advantages import group_relative_advantages
from pipo_jax.losses.aggregation import Aggregation
from pipo_jax.losses.policy import token_clip_loss


def _check_group_size(group_size: int) -> int:
    if int(group_size) != group_size or group_size < 2:
        raise ValueError(f"group_size G={group_size} must be an integer >= 2")
    return int(group_size)


@functools.partial(jax.jit, static_argnames=("group_size",))
def eta(p, group_size: int):
    """eta(p, G) of Theorem 6.2 for p in (0, 1) (any shape; jit/vmap-able; G static).

    Evaluated in log space at q = min(p, 1-p) (eta is symmetric), so the non-degenerate
    probability 1 - q^G - (1-q)^G = -expm1(G log1p(-q)) - q^G has no cancellation at the
    boundaries. Log-binomials are float64 constants rounded once.
    """
    g = _check_group_size(group_size)
    p = jnp.asarray(p)
    if not jnp.issubdtype(p.dtype, jnp.floating):
        p = p.astype(jnp.float32)
    q = jnp.minimum(p, 1.0 - p)[..., None]
    k = np.arange(1, g, dtype=np.float64)
    log_binom_k = jnp.asarray([math.lgamma(g + 1) - math.lgamma(i + 1) - math.lgamma(g - i + 1) for i in k], q.dtype)
    weight_k = jnp.asarray(np.sqrt(k * (g - k)), q.dtype)
    k = jnp.asarray(k, q.dtype)
    log_pmf_k = log_binom_k + k * jnp.log(q) + (g - k) * jnp.log1p(-q)
    numerator = jnp.sum(weight_k * jnp.exp(log_pmf_k), axis=-1)
    q = q[..., 0]
    nondegenerate = -jnp.expm1(g * jnp.log1p(-q)) - jnp.exp(g * jnp.log(q))
    return numerator / (g * q * (1.0 - q) * nondegenerate)


@functools.partial(jax.jit, static_argnames=("group_size",))
def eta_asymptote(p, group_size: int):
    """Boundary asymptote sqrt(G-1) / (G p (1-p)) of Corollary 6.3."""
    g = _check_group_size(group_size)
    p = jnp.asarray(p, jnp.float32)
    return math.sqrt(g - 1) / (g * p * (1.0 - p))


def bandit_success_probability(arm_logits_n, success_n):
    """p = sum of softmax(arm_logits) over the successful arms, and grad p wrt the logits [N]."""
    pi_n = jax.nn.softmax(arm_logits_n)
    s_n = jnp.asarray(success_n, pi_n.dtype)
    p = jnp.sum(pi_n * s_n)
    return p, pi_n * (s_n - p)


def _grpo_group_loss(theta_n, arms_g, success_n):
    """GRPO loss of one group of single-token responses (arms) at ratio 1."""
    logp_g1 = jax.nn.log_softmax(theta_n)[arms_g][:, None]
    adv_g = group_relative_advantages(success_n[arms_g], arms_g.shape[0], std_ddof=0, eps=0.0)
    loss, _ = token_clip_loss(
        logp_g1, jax.lax.stop_gradient(logp_g1), adv_g[:, None], jnp.ones_like(logp_g1),
        agg=Aggregation("seq-mean-token-mean"), clip_ratio_c=0.0,
    )
    return loss


_per_group_grpo_grads = jax.jit(jax.vmap(jax.grad(_grpo_group_loss), in_axes=(None, 0, None)))


def grpo_gradient_scale_mc(key, arm_logits_n, success_n, group_size: int, num_groups: int) -> dict:
    """Monte-Carlo GRPO gradient scale on a Bernoulli bandit (softmax over N arms, reward 1 on `success_n`).

    Samples `num_groups` groups of G arms; per group, g = -grad of `token_clip_loss` (one token
    per response, logp_old = sg(logp) so the ratio is 1, `seq-mean-token-mean`) with
    `group_relative_advantages(std_ddof=0)` — i.e. (1/G) sum_i A_i grad log pi(y_i). Keeping the
    non-degenerate groups, eta_hat = mean_n <g_n, grad p> / |grad p|^2 estimates eta(p).

    Returns a dict: p, eta_hat, eta_se (standard error of eta_hat), grad_mean_n / grad_se_n
    (mean and standard error of g per logit), grad_p_n, num_nondegenerate.
    """
    g = _check_group_size(group_size)
    arm_logits_n = jnp.asarray(arm_logits_n, jnp.float32)
    arms_mg = jax.random.categorical(key, arm_logits_n, shape=(num_groups, g))
    success_n = jnp.asarray(success_n, jnp.float32)
    grads_mn = -_per_group_grpo_grads(arm_logits_n, arms_mg, success_n)
    n_success_m = jnp.sum(success_n[arms_mg], axis=-1)
    nondeg_m = np.asarray((n_success_m >= 1) & (n_success_m <= g - 1))
    grads_kn = np.asarray(grads_mn, np.float64)[nondeg_m]
    p, grad_p_n = bandit_success_probability(arm_logits_n, success_n)
    grad_p_n = np.asarray(grad_p_n, np.float64)
    n = grads_kn.shape[0]
    if n < 2:
        raise ValueError(f"only {n} non-degenerate groups among num_groups={num_groups}; raise num_groups")
    proj_k = grads_kn @ grad_p_n / float(grad_p_n @ grad_p_n)
    return {
        "p": float(p),
        "eta_hat": float(proj_k.mean()),
        "eta_se": float(proj_k.std(ddof=1) / math.sqrt(n)),
        "grad_mean_n": grads_kn.mean(axis=0),
        "grad_se_n": grads_kn.std(axis=0, ddof=1) / math.sqrt(n),
        "grad_p_n": grad_p_n,
        "num_nondegenerate": n,
    }
