"""BNPO (Xiao, Zhang, Cao 2025, "BNPO: Beta Normalization Policy Optimization", arXiv 2506.02864;
docs/math.md §1 "BNPO"): each response's reward minus its prompt's success rate, divided by a Beta
density at that success rate whose parameters follow the policy's recent success rates.

Rows are whole groups of G responses to one prompt (row b = q * G + g). With rewards mapped to [0, 1],
r~ = (r - reward_min) / (reward_max - reward_min), a prompt's success rate is p_q = mean_g r~_qg, and

    A_qg = (r~_qg - p_q) / f_N(p_q; alpha, beta),   1 / f_N clipped to [0, MAX_WEIGHT],

with f_N the Beta(alpha, beta) density and A = 0 exactly in a group whose rewards are all equal. The
success rates are modelled as Beta(a, b), a and b by the method of moments from their mean mu and
variance sigma^2, and the normaliser takes the variance-minimising alpha = 1 + a / 3, beta = 1 + b / 3:

    k = mu (1 - mu) / sigma^2 - 1,   a = k mu,   b = k (1 - mu),
    alpha = clip(1 + a / 3, 1, MAX_SHAPE),   beta = clip(1 + b / 3, 1, MAX_SHAPE).

mu and sigma^2 are those of a discounted pool of the recent batches' success rates, carried across
iterations in `BnpoState` (all zeros before the first batch): each batch's P rates enter with weight 1
and every earlier one's weight is multiplied by `decay`,

    W1 <- decay W1 + P,  W2 <- decay^2 W2 + P,  S1 <- decay S1 + sum_q p_q,  S2 <- decay S2 + sum_q p_q^2,
    mu = S1 / W1,   sigma^2 = (S2 - S1 mu) / (W1 - W2 / W1)

(the weighted variance with the unbiased, reliability-weights correction; W2 is the sum of the squared
weights). `decay = 0` is the current batch's mean and unbiased variance alone, the authors' released
code (changyi7231/BNPO, `compute_bnpo_outcome_advantage`). A pool worth less than two rates
(W1 - W2 / W1 <= 0: one prompt, nothing before) leaves alpha = beta = 1, the uniform density: the
advantage r~ - p, REINFORCE with the prompt's baseline (what the authors' code gives one prompt).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import struct
from jax.scipy.stats import beta as beta_distribution

from pipo_jax.config.schema import Section, key, need, within

MAX_WEIGHT = 1e6  # the clip of 1 / f_N (the authors' `torch.clamp(1 / weight, max=1e6)`)


@dataclasses.dataclass(frozen=True)
class BnpoSettings(Section):
    """config.advantage.bnpo: BNPO's pool of success rates and reward range (advantage.estimator=bnpo)."""

    _section = "advantage.bnpo"
    decay: float = key(0.9, "each earlier batch's weight in the pool of success rates whose moments set the Beta "
                       "normaliser is multiplied by this every iteration (0: the current batch only, the authors' "
                       "code)", within(0, 1, open_high=True))
    reward_min: float = key(0.0, "the reward mapped to 0 (rewards are put on [0, 1] before the success rates; the "
                            "authors' min_value)")
    reward_max: float = key(1.0, "the reward mapped to 1 (the authors' max_value)")

    def check(self):
        need(self.reward_max > self.reward_min, "advantage.bnpo.reward_max",
             f"{self.reward_max} must be > advantage.bnpo.reward_min={self.reward_min}")

MAX_SHAPE = 1e4  # alpha, beta at most this: a near-constant pool of rates (sigma^2 -> 0) would send them to
# infinity; float32 keeps the Beta log-density to ~1e-3 up to here
VAR_FLOOR = 1e-12  # sigma^2 at least this: a pool of equal rates divides by it, not by 0


@struct.dataclass
class BnpoState:
    """The discounted pool of recent success rates, as four float32 [] sums (module docstring):
    `weight` W1, `weight_sq` W2, `rate_sum` S1, `rate_sq_sum` S2. Replicated; zeros = nothing seen."""

    weight: jax.Array
    weight_sq: jax.Array
    rate_sum: jax.Array
    rate_sq_sum: jax.Array


def init_bnpo_state() -> BnpoState:
    """The empty pool: every sum 0 (a checkpoint saved before the state existed restores it as zeros)."""
    zeros = [jnp.zeros((), jnp.float32) for _ in range(4)]  # four buffers: the state is donated to the steps
    return BnpoState(*zeros)


def _groups(x_b, group_size: int):
    x_b = jnp.asarray(x_b, jnp.float32)
    if group_size < 2 or x_b.shape[-1] % group_size:
        raise ValueError(f"group_size={group_size}: BNPO needs G >= 2 dividing the batch of {x_b.shape[-1]} responses")
    return x_b.reshape(-1, group_size)


def scaled_rewards(rewards_b, *, reward_min: float = 0.0, reward_max: float = 1.0):
    """r~ = (r - reward_min) / (reward_max - reward_min) [B]: the rewards on [0, 1] (the authors' affine map)."""
    if not reward_max > reward_min:
        raise ValueError(f"reward_max={reward_max} must be > reward_min={reward_min}")
    return (jnp.asarray(rewards_b, jnp.float32) - reward_min) / (reward_max - reward_min)


@functools.partial(jax.jit, static_argnames=("group_size", "reward_min", "reward_max"))
def success_rates(rewards_b, group_size: int, *, reward_min: float = 0.0, reward_max: float = 1.0):
    """p_q [P]: each prompt's mean scaled reward over its G responses."""
    return jnp.mean(_groups(scaled_rewards(rewards_b, reward_min=reward_min, reward_max=reward_max), group_size),
                    axis=-1)


@functools.partial(jax.jit, static_argnames=("decay",))
def update_bnpo_state(state: BnpoState, rates_p, *, decay: float) -> BnpoState:
    """The pool with this batch's success rates `rates_p` [P] added and every earlier weight times `decay`."""
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"decay={decay} must be in [0, 1)")
    p = jnp.asarray(rates_p, jnp.float32)
    n = jnp.float32(p.shape[-1])
    return BnpoState(weight=decay * state.weight + n, weight_sq=decay * decay * state.weight_sq + n,
                     rate_sum=decay * state.rate_sum + jnp.sum(p),
                     rate_sq_sum=decay * state.rate_sq_sum + jnp.sum(p * p))


@jax.jit
def beta_parameters(state: BnpoState) -> dict:
    """{"alpha", "beta", "rate_mean", "rate_var", "a", "b"} (float32 []) of the pool: the method of moments'
    Beta(a, b) of the success rates and the normaliser's variance-minimising (alpha, beta) (module docstring).
    Less than two rates' worth: alpha = beta = 1 and a, b, rate_var NaN."""
    w1 = state.weight
    dof = w1 - state.weight_sq / jnp.maximum(w1, 1e-30)
    enough = (w1 > 0) & (dof > 0)
    mean = state.rate_sum / jnp.maximum(w1, 1e-30)
    var = (state.rate_sq_sum - state.rate_sum * mean) / jnp.where(enough, dof, 1.0)
    k = mean * (1.0 - mean) / jnp.maximum(var, VAR_FLOOR) - 1.0
    a, b = k * mean, k * (1.0 - mean)
    alpha = jnp.where(enough, jnp.clip(1.0 + a / 3.0, 1.0, MAX_SHAPE), 1.0)
    beta = jnp.where(enough, jnp.clip(1.0 + b / 3.0, 1.0, MAX_SHAPE), 1.0)
    nan = jnp.float32(jnp.nan)
    return {"alpha": alpha, "beta": beta, "rate_mean": jnp.where(w1 > 0, mean, nan),
            "rate_var": jnp.where(enough, var, nan), "a": jnp.where(enough, a, nan), "b": jnp.where(enough, b, nan)}


def normaliser_weight(rates, alpha, beta):
    """1 / f_N(p; alpha, beta), clipped to [0, MAX_WEIGHT]; p is clipped into [0, 1] (the density's support)."""
    p = jnp.clip(jnp.asarray(rates, jnp.float32), 0.0, 1.0)
    density = jnp.exp(beta_distribution.logpdf(p, alpha, beta))
    return jnp.clip(1.0 / density, 0.0, MAX_WEIGHT)  # a zero density (p at 0 or 1 with alpha or beta > 1): the clip


@functools.partial(jax.jit, static_argnames=("group_size", "reward_min", "reward_max"))
def bnpo_advantages(rewards_b, group_size: int, alpha, beta, *, reward_min: float = 0.0, reward_max: float = 1.0):
    """A [B] = (r~ - p_q) / f_N(p_q; alpha, beta) on each row of prompt q (module docstring); 0 in a group
    whose rewards are all equal (their float mean may differ by an ulp, and 1 / f_N can be 1e6)."""
    r_pg = _groups(scaled_rewards(rewards_b, reward_min=reward_min, reward_max=reward_max), group_size)
    p_p1 = jnp.mean(r_pg, axis=-1, keepdims=True)
    adv_pg = normaliser_weight(p_p1, alpha, beta) * (r_pg - p_p1)
    constant_p1 = jnp.max(r_pg, axis=-1, keepdims=True) == jnp.min(r_pg, axis=-1, keepdims=True)
    return jnp.where(constant_p1, 0.0, adv_pg).reshape(-1)
