"""Hyperparameters as data: the config values the step functions read from the train state, not the spec.

`Hyperparameters` is a small pytree of float32 scalars carried as `TrainState.hyper`. The learner reads
these values from it (`rl/learn.py`, `rl/steps.py`, `rl/algorithms.py`), never from the `TrainSpec`, so
two configs that differ only in them have equal specs (`TrainSpec.__eq__` / `__hash__` leave their values
out: `static_key`) and run one compiled program; stacked states (`jax.vmap` over a leading axis, as
`experiments/compare.py` stacks seeds) advance members with different values in that one program.

What of a key is structure stays static: whether the dual clip, the KL term and the entropy bonus are on
(`loss.clip_ratio_c`, `loss.kl_coef`, `loss.entropy_coef` nonzero) is part of the spec's equality, their
value is data. `rollout.temperature` stays static: the sampler's `SamplingParams` and the fused log-prob
kernel's `KernelConfig` take it as a jit-static setting.

The clip's eps are carried as the bounds the losses take, 1 - eps_low and 1 + eps_high, computed here on
the host in float64 and rounded once to float32 (`losses/policy.py:ratio_bounds`): each is the float32
nearest to the exact bound, the constant the same config gave when the bounds were folded from Python
floats into the program (float32 arithmetic on a float32 eps is one ulp off for some values, e.g. 0.18).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from pipo_jax.losses.policy import ratio_bounds

# The dotted config keys whose values are data (`Hyperparameters`), the spec's equality leaving them out.
HYPER_KEYS = ("train.lr", "critic.lr", "pipo.lr", "vpd.lr", "pipo.lam", "loss.clip_low", "loss.clip_high",
              "pipo.pi_clip_low", "pipo.pi_clip_high", "loss.clip_ratio_c", "loss.kl_coef", "loss.entropy_coef")
# Of those, the keys whose zero switches a term off: that they are nonzero is structure (static).
SWITCHED_BY_ZERO = ("loss.clip_ratio_c", "loss.kl_coef", "loss.entropy_coef")


@struct.dataclass
class Hyperparameters:
    """The hyperparameters the learner reads as data, float32 `[]` each (`[N]` in a stack of N states)."""

    lr: jax.Array  # train.lr: the base step's AdamW learning rate
    critic_lr: jax.Array  # critic.lr (PPO's value model)
    pi_lr: jax.Array  # pipo.lr: alpha_PI, the PI step's learning rate
    vpd_lr: jax.Array  # vpd.lr: VPD's teacher's learning rate in its E-step (0 without VPD)
    lam: jax.Array  # pipo.lam: the PI step's scale when the improvement signal is negative
    ratio_low: jax.Array  # 1 - loss.clip_low: the ratio clip's lower bound
    ratio_high: jax.Array  # 1 + loss.clip_high: its upper bound
    pi_ratio_low: jax.Array  # the PI step's lower bound (`pi_ratio_bounds`)
    pi_ratio_high: jax.Array  # the PI step's upper bound
    clip_ratio_c: jax.Array  # loss.clip_ratio_c: the dual clip's c (read only where it is on)
    kl_coef: jax.Array  # loss.kl_coef: the reference KL term's weight (or the KL-in-reward beta)
    entropy_coef: jax.Array  # loss.entropy_coef: the entropy bonus's weight


def pi_ratio_bounds(spec: Any) -> tuple[float, float]:
    """The PI step's clip bounds (1 - eps_low, 1 + eps_high) as Python floats: its eps `pipo.pi_clip_low` /
    `pi_clip_high`, unset the base loss's; the authors' symmetric clip (`pipo.authors.pi_symmetric_clip`, on
    a token ratio of an algorithm with `authors_pi_token_loss`) has 1 + eps_low as its upper bound."""
    loss, pipo = spec.loss, spec.pipo
    eps_low = loss.clip_low if pipo.pi_clip_low is None else pipo.pi_clip_low
    eps_high = loss.clip_high if pipo.pi_clip_high is None else pipo.pi_clip_high
    if spec.pipo_options.pi_symmetric_clip and spec.algorithm.authors_pi_token_loss and spec.pi_ratio == "token":
        eps_high = eps_low
    return ratio_bounds(eps_low, eps_high)


def hyperparameters_of(spec: Any) -> Hyperparameters:
    """The `Hyperparameters` of a `TrainSpec` (its `train`, `critic`, `loss`, `pipo` and `vpd` sections;
    `vpd` None without VPD), each value float32, the clip bounds computed in float64 and rounded once."""
    loss, pipo = spec.loss, spec.pipo
    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    (ratio_low, ratio_high), (pi_low, pi_high) = ratio_bounds(loss.clip_low, loss.clip_high), pi_ratio_bounds(spec)
    return Hyperparameters(
        lr=f32(spec.train.lr), critic_lr=f32(spec.critic.lr), pi_lr=f32(pipo.lr),
        vpd_lr=f32(0.0 if spec.vpd is None else spec.vpd.lr), lam=f32(pipo.lam),
        ratio_low=f32(ratio_low), ratio_high=f32(ratio_high), pi_ratio_low=f32(pi_low), pi_ratio_high=f32(pi_high),
        clip_ratio_c=f32(loss.clip_ratio_c), kl_coef=f32(loss.kl_coef), entropy_coef=f32(loss.entropy_coef))


def static_part(key: str, value: Any) -> Any:
    """What of `key`'s `value` is structure: nonzero for `SWITCHED_BY_ZERO` keys, else nothing (None)."""
    return value != 0 if key in SWITCHED_BY_ZERO else None


def static_section(name: str, section: Any) -> Any:
    """`section` (config section `name`) with the values of its `HYPER_KEYS` reduced to their
    `static_part`: a hashable tuple of (field, value) pairs, or `section` itself when it has none."""
    data = {k.split(".", 1)[1] for k in HYPER_KEYS if k.split(".", 1)[0] == name}
    if not data or section is None:
        return section
    return (type(section).__name__,) + tuple(
        (f.name, static_part(f"{name}.{f.name}", v) if f.name in data else v)
        for f in dataclasses.fields(section) for v in (getattr(section, f.name),))
