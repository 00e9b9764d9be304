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
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

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
    clip_low: jax.Array  # loss.clip_low: eps_low of the ratio clip
    clip_high: jax.Array  # loss.clip_high: eps_high
    pi_clip_low: jax.Array  # pipo.pi_clip_low, unset: loss.clip_low (the PI step's eps_low)
    pi_clip_high: jax.Array  # pipo.pi_clip_high, unset: loss.clip_high
    clip_ratio_c: jax.Array  # loss.clip_ratio_c: the dual clip's c (read only where it is on)
    kl_coef: jax.Array  # loss.kl_coef: the reference KL term's weight (or the KL-in-reward beta)
    entropy_coef: jax.Array  # loss.entropy_coef: the entropy bonus's weight


def hyperparameters_of(spec: Any) -> Hyperparameters:
    """The `Hyperparameters` of a `TrainSpec` (its `train`, `critic`, `loss`, `pipo` and `vpd` sections;
    `vpd` None without VPD), each value float32."""
    loss, pipo = spec.loss, spec.pipo
    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    return Hyperparameters(
        lr=f32(spec.train.lr), critic_lr=f32(spec.critic.lr), pi_lr=f32(pipo.lr),
        vpd_lr=f32(0.0 if spec.vpd is None else spec.vpd.lr), lam=f32(pipo.lam),
        clip_low=f32(loss.clip_low), clip_high=f32(loss.clip_high),
        pi_clip_low=f32(loss.clip_low if pipo.pi_clip_low is None else pipo.pi_clip_low),
        pi_clip_high=f32(loss.clip_high if pipo.pi_clip_high is None else pipo.pi_clip_high),
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
