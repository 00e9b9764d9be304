"""Outer loops: a whole iteration in one jit (JAX-native reward), chunks of them in `lax.scan`,
and the host loop where the reward is a Python function between two jitted calls.

Both loops derive the same keys from `state.rng` and call the same `collect` pieces and
the same `learn`, so for the same seed they produce the same result.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax.losses import advantages
from pipo_jax.rl import rollout as rollout_lib
from pipo_jax.rl.learn import learn
from pipo_jax.rl.rollout import Rollout
from pipo_jax.rl.spec import TrainSpec
from pipo_jax.rl.state import TrainState

HostReward = Callable[[Rollout], np.ndarray]


class DynamicSamplingExhausted(RuntimeError):
    """DAPO could not fill a batch with informative groups within `max_num_gen_batches`."""


def _iteration_keys(state: TrainState):
    rng, k_collect, k_learn = jax.random.split(state.rng, 3)
    return rng, k_collect, k_learn


def iteration(spec: TrainSpec, state: TrainState) -> tuple[TrainState, dict]:
    """One full PIPO iteration (sample, reward, verify, update, store) with the task's JAX reward."""
    rng, k_collect, k_learn = _iteration_keys(state)
    reward_fn = functools.partial(rollout_lib.task_rewards, spec)
    batch, stats = rollout_lib.collect(spec, state.params, k_collect, reward_fn)
    state, metrics = learn(spec, state.replace(rng=rng), batch, k_learn)
    return state, dict(metrics, **stats)


@functools.partial(jax.jit, static_argnums=(0, 2), donate_argnums=1)
def scan_chunk(spec: TrainSpec, state: TrainState, length: int) -> tuple[TrainState, dict]:
    """`length` iterations in one `lax.scan`; metrics come back stacked `[length]`."""
    return jax.lax.scan(lambda s, _: iteration(spec, s), state, None, length=length)


# ----------------------------------------------------------------------------- host loop


@functools.partial(jax.jit, static_argnums=(0, 3))
def _host_generate(spec: TrainSpec, params, rng, n_prompts: int) -> Rollout:
    k_prob, k_gen = jax.random.split(rng)
    return rollout_lib.generate(spec, params, rollout_lib.sample_problems(spec, k_prob, n_prompts), k_gen)


@functools.partial(jax.jit, static_argnums=0)
def _host_merge(spec: TrainSpec, buffer: Rollout, filled, new: Rollout):
    keep_p, _, counts = advantages.dapo_group_filter(new.rewards_b, spec.group_size)
    buffer, filled = rollout_lib.merge_kept_groups(spec, buffer, filled, new, keep_p)
    return buffer, filled, counts["num_dropped"]


@functools.partial(jax.jit, static_argnums=0, donate_argnums=1)
def _host_learn(spec: TrainSpec, state: TrainState, batch: Rollout, rng) -> tuple[TrainState, dict]:
    return learn(spec, state, batch, rng)


def _scored(rollout: Rollout, reward_fn: HostReward) -> Rollout:
    rewards = np.asarray(reward_fn(rollout), np.float32)
    if rewards.shape != (rollout.size,):
        raise ValueError(f"reward function returned shape {rewards.shape}, expected ({rollout.size},)")
    return rollout_lib.with_rewards(rollout, rewards)


def host_collect(spec: TrainSpec, params, rng, reward_fn: HostReward) -> tuple[Rollout, dict]:
    """`rollout.collect` with the reward computed on host (same keys, same batches)."""
    if not spec.dynamic_sampling:
        return _scored(_host_generate(spec, params, rng, spec.prompts), reward_fn), {}
    buffer, filled, n, dropped = None, jnp.zeros((), jnp.int32), 0, 0
    while int(filled) < spec.prompts and n < spec.max_num_gen_batches:
        new = _scored(_host_generate(spec, params, jax.random.fold_in(rng, n), spec.gen_prompts), reward_fn)
        if buffer is None:
            buffer = jax.tree.map(lambda x: jnp.zeros((spec.batch,) + x.shape[1:], x.dtype), new)
        buffer, filled, d = _host_merge(spec, buffer, filled, new)
        n, dropped = n + 1, dropped + int(d)
    stats = {"dapo_gen_batches": n, "dapo_groups_dropped": dropped, "dapo_groups_kept": int(filled),
             "dapo_exhausted": int(filled) < spec.prompts}
    return buffer, stats


def host_iteration(spec: TrainSpec, state: TrainState, reward_fn: HostReward) -> tuple[TrainState, dict]:
    """One iteration with a Python reward: jitted generate -> host reward -> jitted learn."""
    rng, k_collect, k_learn = _iteration_keys(state)
    batch, stats = host_collect(spec, state.params, k_collect, reward_fn)
    check_dynamic_sampling(spec, stats)
    state, metrics = _host_learn(spec, state.replace(rng=rng), batch, k_learn)
    return state, dict(metrics, **stats)


def check_dynamic_sampling(spec: TrainSpec, stats: dict) -> None:
    """Raises `DynamicSamplingExhausted` if any iteration in `stats` could not fill its batch."""
    if "dapo_exhausted" in stats and np.any(np.asarray(stats["dapo_exhausted"])):
        kept = np.min(np.asarray(stats["dapo_groups_kept"]))
        raise DynamicSamplingExhausted(
            f"DAPO dynamic sampling kept only {kept} of {spec.prompts} informative groups after "
            f"dapo.max_num_gen_batches={spec.max_num_gen_batches} generation batches of {spec.gen_prompts} prompts "
            f"(every other group had identical rewards): raise config.dapo.max_num_gen_batches or "
            f"config.dapo.gen_prompts_per_batch, or lower rollout.prompts_per_batch")
