"""Advantage estimators and reward shaping (docs/math.md §1): GAE, group-relative, DAPO extras.

Layouts: a batch is `P` prompts x `G` responses stored contiguously, row b = p*G + g.
`*_b` arrays are per response [B = P*G]; `*_br` arrays are per response token [B, R] with
response mask `mask_br` (1 = valid). Outputs are zero at padded positions.

- `outcome_token_rewards(seq_rewards_b, mask_br)`: the sequence reward at the last valid token.
- `kl_penalized_token_rewards(...)`: token rewards minus beta * KL(behaviour || reference) (PPO).
- `gae(token_rewards_br, values_br, mask_br, gamma, lam)` -> (adv_br, returns_br), unwhitened.
- `masked_whiten(x_br, mask_br)`: (x - mean) / sqrt(var + 1e-8), unbiased var over valid tokens.
- `group_relative_advantages(rewards_b, group_size, std_ddof, norm_by_std)` -> adv_b.
- `leave_one_out_advantages(rewards_b, group_size)`: RLOO, r_i - mean_{j != i} r_j -> adv_b.
- `discounted_returns(token_rewards_br, mask_br, gamma)`: sum_{s >= t} gamma^(s-t) r_s, [B, R].
- `reinforce_pp_advantages(token_rewards_br, mask_br, gamma)`: REINFORCE++, whitened returns.
- `reinforce_pp_baseline_advantages(rewards_b, mask_br, group_size)`: REINFORCE++-baseline.
- `dapo_group_filter(rewards_b, group_size)` -> (keep_p, keep_b, counts).
- `group_outcome_counts(rewards_b, group_size)`: all-fail / mixed / all-success group counts.
- `overlong_penalty(lengths_b, max_len, buffer, factor)`: DAPO soft overlong punishment.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pipo_jax.losses.kl import kl_estimate
from pipo_jax.losses.masking import as_mask, last_valid_index, masked_mean


@jax.jit
def outcome_token_rewards(seq_rewards_b, mask_br):
    """[B, R] zeros except the sequence reward at each row's last valid token (empty rows: all 0)."""
    m = as_mask(mask_br)
    last_b = last_valid_index(m)
    at_last_br = jnp.arange(m.shape[-1])[None, :] == last_b[:, None]
    return jnp.where(at_last_br, jnp.asarray(seq_rewards_b, jnp.float32)[:, None], 0.0)


@functools.partial(jax.jit, static_argnames=("estimator",))
def kl_penalized_token_rewards(token_rewards_br, logp_old_br, logp_ref_br, mask_br, *, beta, estimator="k1"):
    """PPO `kl_in_reward`: r_t - beta * KL_t(logp_old, logp_ref) on valid tokens, [B, R]."""
    m = as_mask(mask_br)
    kl_br = kl_estimate(logp_old_br, logp_ref_br, estimator)
    return jnp.where(m > 0, token_rewards_br - beta * kl_br, 0.0)


def sequence_rewards(token_rewards_br, mask_br):
    """Per-sequence reward [B] = sum of the valid token rewards (the quantity averaged into mu_t)."""
    return jnp.sum(jnp.where(as_mask(mask_br) > 0, token_rewards_br, 0.0), axis=-1)


@functools.partial(jax.jit, static_argnames=("gamma", "lam"))
def gae(token_rewards_br, values_br, mask_br, *, gamma: float = 1.0, lam: float = 1.0):
    """Generalised advantage estimation by a reverse scan over time.

    delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}, where "t+1" is the
    next *valid* token: masked positions carry the next value and advantage through unchanged.
    Returns (adv_br, returns_br = adv + V), both zero at masked positions. Not whitened.
    """
    m = as_mask(mask_br)
    r_rb, v_rb, m_rb = (jnp.swapaxes(jnp.asarray(x, jnp.float32), 0, 1) for x in (token_rewards_br, values_br, m))

    def step(carry, x):
        next_value_b, next_adv_b = carry
        r_b, v_b, mt_b = x
        delta_b = r_b + gamma * next_value_b - v_b
        adv_b = delta_b + gamma * lam * next_adv_b
        next_value_b = jnp.where(mt_b > 0, v_b, next_value_b)
        next_adv_b = jnp.where(mt_b > 0, adv_b, next_adv_b)
        return (next_value_b, next_adv_b), next_adv_b

    zeros_b = jnp.zeros(r_rb.shape[1], jnp.float32)
    _, adv_rb = jax.lax.scan(step, (zeros_b, zeros_b), (r_rb, v_rb, m_rb), reverse=True)
    adv_br = jnp.swapaxes(adv_rb, 0, 1) * m
    return adv_br, (adv_br + values_br) * m


@functools.partial(jax.jit, static_argnames=("eps",))
def masked_whiten(x_br, mask_br, eps: float = 1e-8):
    """(x - mean) / sqrt(var + eps) over valid entries, unbiased var (n-1; n=1 gives var 0). Zero at padding."""
    m = as_mask(mask_br)
    n = jnp.sum(m)
    mean = masked_mean(x_br, m)
    var = jnp.sum(jnp.where(m > 0, jnp.square(x_br - mean), 0.0)) / jnp.maximum(n - 1.0, 1.0)
    return jnp.where(m > 0, (x_br - mean) * jax.lax.rsqrt(var + eps), 0.0)


def _groups(rewards_b, group_size: int):
    """Reshape [B] -> [P, G], with a clear error when B is not a multiple of `group_size`."""
    rewards_b = jnp.asarray(rewards_b, jnp.float32)
    if group_size < 1 or rewards_b.shape[-1] % group_size:
        raise ValueError(f"group_size={group_size} does not divide the batch of {rewards_b.shape[-1]} responses")
    return rewards_b.reshape(-1, group_size)


@functools.partial(jax.jit, static_argnames=("group_size", "std_ddof", "norm_by_std", "eps"))
def group_relative_advantages(
    rewards_b, group_size: int, *, std_ddof: int = 0, norm_by_std: bool = True, eps: float = 1e-6
):
    """A_i = (R_i - mean_g) / (std_g + eps), or R_i - mean_g when `norm_by_std=False` (Dr.GRPO).

    `std_ddof=0` is the population std of paper Eq. 3; 1 is verl's unbiased std. A group of one
    response and a group whose rewards are all equal get exactly 0. Returns adv_b [B].
    """
    if std_ddof not in (0, 1):
        raise ValueError(f"std_ddof={std_ddof!r} must be 0 (population, paper) or 1 (unbiased, verl)")
    r_pg = _groups(rewards_b, group_size)
    if group_size == 1:
        return jnp.zeros(r_pg.shape[0], jnp.float32)
    mean_p1 = jnp.mean(r_pg, axis=-1, keepdims=True)
    centred_pg = r_pg - mean_p1
    if norm_by_std:
        std_p1 = jnp.sqrt(jnp.sum(jnp.square(centred_pg), axis=-1, keepdims=True) / (group_size - std_ddof))
        centred_pg = centred_pg / (std_p1 + eps)
    # the float mean of equal rewards can differ from them by an ulp; such groups carry no signal
    constant_p1 = jnp.max(r_pg, axis=-1, keepdims=True) == jnp.min(r_pg, axis=-1, keepdims=True)
    return jnp.where(constant_p1, 0.0, centred_pg).reshape(-1)


@functools.partial(jax.jit, static_argnames=("group_size",))
def leave_one_out_advantages(rewards_b, group_size: int):
    """RLOO (Ahmadian et al. 2024; Kool et al. 2019): A_i = r_i - mean_{j != i} r_j over the group,
    computed as G / (G - 1) * (r_i - mean_g) (the same number: mean_{j != i} r_j = (G mean_g - r_i) / (G - 1)).

    A group whose rewards are all equal gets exactly 0 (as `group_relative_advantages`). Needs
    G >= 2 (the leave-one-out mean of a group of one is undefined). Returns adv_b [B].
    """
    if group_size < 2:
        raise ValueError(f"group_size={group_size}: the leave-one-out baseline needs G >= 2")
    centred_b = group_relative_advantages(rewards_b, group_size, norm_by_std=False)
    return centred_b * (group_size / (group_size - 1.0))


@functools.partial(jax.jit, static_argnames=("gamma",))
def discounted_returns(token_rewards_br, mask_br, *, gamma: float = 1.0):
    """G_t = sum_{s >= t, valid} gamma^(s - t) r_s, [B, R], zero at padding: `gae` with V = 0 and
    lam = 1 (delta_t = r_t, A_t = r_t + gamma A_{t+1}), one scan for both."""
    token_rewards_br = jnp.asarray(token_rewards_br, jnp.float32)
    returns_br, _ = gae(token_rewards_br, jnp.zeros_like(token_rewards_br), mask_br, gamma=gamma, lam=1.0)
    return returns_br


@functools.partial(jax.jit, static_argnames=("gamma",))
def reinforce_pp_advantages(token_rewards_br, mask_br, *, gamma: float = 1.0):
    """REINFORCE++ (Hu 2025): the discounted return of the token rewards (outcome at the last
    token, minus beta KL_t on every token when the KL is in the reward), whitened over every
    valid token of the batch (`masked_whiten`: global, not per group). [B, R]."""
    return masked_whiten(discounted_returns(token_rewards_br, mask_br, gamma=gamma), mask_br)


@functools.partial(jax.jit, static_argnames=("group_size",))
def reinforce_pp_baseline_advantages(rewards_b, mask_br, group_size: int):
    """REINFORCE++-baseline: the sequence reward minus its group's mean (`group_relative_advantages`
    without the std), on every token of the response, then whitened over every valid token of
    the batch (`masked_whiten`). [B, R]."""
    centred_b = group_relative_advantages(rewards_b, group_size, norm_by_std=False)
    return masked_whiten(broadcast_over_tokens(centred_b, mask_br), mask_br)


def broadcast_over_tokens(values_b, mask_br):
    """[B] -> [B, R]: each row's value on its valid tokens, 0 at padding."""
    m = as_mask(mask_br)
    return jnp.asarray(values_b, jnp.float32)[:, None] * m


@functools.partial(jax.jit, static_argnames=("group_size",))
def dapo_group_filter(rewards_b, group_size: int):
    """DAPO dynamic-sampling filter: keep groups whose rewards are not all equal (keep size-1 groups).

    Returns (keep_p bool [P], keep_b bool [B], counts) with counts = {"num_groups", "num_kept",
    "num_dropped"} as int32 scalars (log the dropped count; nothing is dropped silently).
    """
    r_pg = _groups(rewards_b, group_size)
    if group_size == 1:
        keep_p = jnp.ones(r_pg.shape[0], bool)
    else:
        keep_p = jnp.max(r_pg, axis=-1) != jnp.min(r_pg, axis=-1)
    num_kept = jnp.sum(keep_p.astype(jnp.int32))
    counts = {"num_groups": jnp.int32(r_pg.shape[0]), "num_kept": num_kept, "num_dropped": r_pg.shape[0] - num_kept}
    return keep_p, jnp.repeat(keep_p, group_size), counts


@functools.partial(jax.jit, static_argnames=("group_size", "success_threshold"))
def group_outcome_counts(rewards_b, group_size: int, *, success_threshold: float = 1.0):
    """Solve-rate histogram of groups: {"all_fail", "mixed", "all_success"} int32 counts.

    A response counts as solved when its reward >= `success_threshold`.
    """
    solved_pg = _groups(rewards_b, group_size) >= success_threshold
    n_solved_p = jnp.sum(solved_pg.astype(jnp.int32), axis=-1)
    all_fail = jnp.sum((n_solved_p == 0).astype(jnp.int32))
    all_success = jnp.sum((n_solved_p == group_size).astype(jnp.int32))
    return {"all_fail": all_fail, "mixed": n_solved_p.shape[0] - all_fail - all_success, "all_success": all_success}


@functools.partial(jax.jit, static_argnames=("max_len", "buffer", "factor"))
def overlong_penalty(lengths_b, *, max_len: int, buffer: int, factor: float = 1.0):
    """DAPO overlong shaping: min(-(len - L_exp) / buffer * factor, 0) with L_exp = max_len - buffer. [B]."""
    if not 0 < buffer <= max_len:
        raise ValueError(f"overlong buffer={buffer} must be in (0, max_len={max_len}]")
    expected_len = max_len - buffer
    lengths_b = jnp.asarray(lengths_b, jnp.float32)
    return jnp.minimum(-(lengths_b - expected_len) / buffer * factor, 0.0)
