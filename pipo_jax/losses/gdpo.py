"""GDPO (Liu, Dong, Lu et al. 2026, "GDPO: Group reward-Decoupled Normalization Policy Optimization for
Multi-reward RL Optimization", arXiv 2601.05242; docs/math.md §1 "GDPO").

A batch is P prompts x G responses, row b = p*G + g, each response's reward a weighted sum of C components
r_bc (the task's `reward_components`, weights w_c). GRPO normalises the sum within each group, so distinct
combinations of components with the same sum (and groups whose sums differ by a scale) collapse to the same
advantage. GDPO normalises each component on its own within the group, sums, and normalises the sum over
the batch:
    A_bc = (r_bc - mean_g r_c) / (std_g r_c + eps)         per component (Eq. 4)
    S_b = sum_c w_c A_bc                                    (Eq. 5, with the reward's weights)
    A_b = (S_b - mean_B S) / (std_B S + eps)                over the batch's B responses (Eq. 6)
eps = 1e-4 in both (the authors' TRL code); a group whose component c is constant has A_bc = 0 exactly.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pipo_jax.losses.advantages import group_relative_advantages

EPS = 1e-4  # the authors' epsilon of both normalisations (their TRL code)


@functools.partial(jax.jit, static_argnames=("group_size", "std_ddof", "norm_by_std", "eps"))
def component_advantages(components_bc, group_size: int, *, std_ddof: int = 1, norm_by_std: bool = True,
                         eps: float = EPS):
    """A_bc [B, C]: each component normalised within each group of `group_size` rows, GRPO's group advantage
    (`advantages.group_relative_advantages`, ddof `std_ddof`; `norm_by_std=False`: r - mean only)."""
    one = functools.partial(group_relative_advantages, group_size=group_size, std_ddof=std_ddof,
                            norm_by_std=norm_by_std, eps=eps)
    return jax.vmap(one, in_axes=1, out_axes=1)(jnp.asarray(components_bc, jnp.float32))


@functools.partial(jax.jit, static_argnames=("std_ddof", "eps"))
def batch_normalise(x_b, *, std_ddof: int = 1, eps: float = EPS):
    """(x - mean) / (std + eps) over the B rows [B] (ddof `std_ddof`; B - ddof floored at 1)."""
    x_b = jnp.asarray(x_b, jnp.float32)
    centred = x_b - jnp.mean(x_b)
    std = jnp.sqrt(jnp.sum(jnp.square(centred)) / max(x_b.shape[0] - std_ddof, 1))
    return centred / (std + eps)


def gdpo_advantages(components_bc, weights_c, group_size: int, *, std_ddof: int = 1, norm_by_std: bool = True,
                    eps: float = EPS):
    """GDPO's advantage A_b [B] of each response: its components `components_bc` [B, C] normalised within
    their groups, summed with `weights_c` (C floats), the sum normalised over the batch (module docstring)."""
    a_bc = component_advantages(components_bc, group_size, std_ddof=std_ddof, norm_by_std=norm_by_std, eps=eps)
    if a_bc.shape[1] != len(weights_c):
        raise ValueError(f"{a_bc.shape[1]} reward components but {len(weights_c)} weights")
    return batch_normalise(a_bc @ jnp.asarray(weights_c, jnp.float32), std_ddof=std_ddof, eps=eps)
