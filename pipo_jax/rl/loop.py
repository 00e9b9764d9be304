"""Outer loops: a whole iteration in one jit (JAX-native reward), chunks of them in `lax.scan`,
and the host loop where the reward is a Python function between two jitted calls.

Both loops derive the same keys from `state.rng` and call the same `collect` pieces and
the same `learn`, so for the same seed they produce the same result.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Protocol, runtime_checkable

import jax
import numpy as np

from pipo_jax.rl import rollout as rollout_lib
from pipo_jax.rl.experience import Rollout, with_rewards
from pipo_jax.rl.learn import learn
from pipo_jax.rl.spec import GenerationSpec, TrainSpec
from pipo_jax.rl.state import TrainState


@runtime_checkable
class HostReward(Protocol):
    """The host loop's reward: numpy on the host, between the jitted generate and learn.

    `reward(rollout)`: the rewards float32 `[B]` of the rollout's rows (on a mesh each process calls it on
    its own rows, `parallel.host_data.process_local_reward`). `score_rollout(rollout)`: the rollout with
    its rewards and what else the reward renders on the host (a host-reward task's SDPO / VPD teacher
    prompts, `rollout.TaskReward`). `take_counts()`: `{metric: int}` counted since the last call (e.g.
    `reward/unscored_count`), added to the iteration's metrics; `{}` for a reward that counts nothing.
    Implemented by `rollout.TaskReward` (the task's scorer) and `RewardFunction` (a plain function).
    """

    def __call__(self, rollout: Rollout) -> np.ndarray: ...

    def score_rollout(self, rollout: Rollout) -> Rollout: ...

    def take_counts(self) -> dict[str, int]: ...


@dataclasses.dataclass(frozen=True)
class RewardFunction:
    """A plain function `rollout -> rewards [B]` as a `HostReward`: the rollout scored by it alone
    (its shape checked), nothing counted."""

    fn: Callable[[Rollout], np.ndarray]

    def __call__(self, rollout: Rollout) -> np.ndarray:
        return self.fn(rollout)

    def score_rollout(self, rollout: Rollout) -> Rollout:
        rewards = np.asarray(self.fn(rollout), np.float32)
        if rewards.shape != (rollout.size,):
            raise ValueError(f"reward function returned shape {rewards.shape}, expected ({rollout.size},)")
        return with_rewards(rollout, rewards)

    def take_counts(self) -> dict[str, int]:
        return {}


class DynamicSamplingExhausted(RuntimeError):
    """DAPO could not fill a batch with informative groups within `max_num_gen_batches`."""


class NonFiniteUpdates(RuntimeError):
    """`train.max_bad_steps` optimizer updates in a row had non-finite gradients."""


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


@functools.partial(jax.jit, static_argnums=(0, 4))
def _host_generate(gen: GenerationSpec, params, table, rng, n_prompts: int) -> Rollout:
    """Sample `n_prompts` problems (a dataset task: from `table`, an argument) and generate. Static
    in the `GenerationSpec` only: one program for every algorithm that samples alike."""
    k_prob, k_gen = jax.random.split(rng)
    return rollout_lib.generate(gen, params, rollout_lib.sample_problems(gen, k_prob, n_prompts, table=table), k_gen)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _host_problems(gen: GenerationSpec, table, rng, n_prompts: int):
    return rollout_lib.sample_problems(gen, rng, n_prompts, table=table)


def _host_driven_generate(gen: GenerationSpec, generator, params, table, rng, n_prompts: int) -> Rollout:
    """`_host_generate` with a host-driven `generator` (same keys: `rollout.generate_on_host`)."""
    k_prob, k_gen = jax.random.split(rng)
    return rollout_lib.generate_on_host(generator, params, _host_problems(gen, table, k_prob, n_prompts), k_gen)


@functools.partial(jax.jit, static_argnums=0)
def _host_add(spec: TrainSpec, ds: rollout_lib.DynamicSampling | None, new: Rollout) -> rollout_lib.DynamicSampling:
    if ds is None:  # built inside the jit, so on a mesh it is a global array like `new`
        ds = rollout_lib.dynamic_sampling_start(spec, new)
    return rollout_lib.dynamic_sampling_add(spec, ds, new)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=1)
def _host_learn(spec: TrainSpec, state: TrainState, batch: Rollout, rng) -> tuple[TrainState, dict]:
    return learn(spec, state, batch, rng)


def _scored(rollout: Rollout, reward_fn: HostReward) -> Rollout:
    return reward_fn.score_rollout(rollout)


@dataclasses.dataclass(frozen=True)
class HostPrograms:
    """The jitted pieces of the host loop, so that one loop serves one device and a mesh.

    generate(params, rng, n_prompts) -> Rollout; score(rollout, reward_fn) -> Rollout with
    rewards; learn(state, batch, rng) -> (state, metrics).
    """

    generate: Callable[[Any, jax.Array, int], Rollout]
    score: Callable[[Rollout, HostReward], Rollout]
    learn: Callable[[TrainState, Rollout, jax.Array], tuple[TrainState, dict]]


def single_device_programs(spec: TrainSpec) -> HostPrograms:
    """The host loop's programs on the default device (a dataset task's prompt table placed once;
    a host-driven generator made once, so its slot engines compile once for these programs)."""
    table = rollout_lib.prompt_table(spec)
    generator = spec.generator
    if generator.in_program:
        generate = functools.partial(_host_generate, spec.generation)
    else:
        generate = functools.partial(_host_driven_generate, spec.generation, generator)
    return HostPrograms(generate=lambda params, rng, n_prompts: generate(params, table, rng, n_prompts),
                        score=_scored, learn=functools.partial(_host_learn, spec))


def host_collect(spec: TrainSpec, params, rng, reward_fn: HostReward,
                 programs: HostPrograms | None = None) -> tuple[Rollout, dict]:
    """`rollout.collect` with the reward computed on host (same keys, same batches)."""
    programs = programs or single_device_programs(spec)
    if not spec.dapo.dynamic_sampling:
        return programs.score(programs.generate(params, rng, spec.rollout.prompts_per_batch), reward_fn), {}
    ds, n = None, 0
    while ds is None or bool(rollout_lib.dynamic_sampling_more(spec, ds)):
        new = programs.score(programs.generate(params, jax.random.fold_in(rng, n), spec.dapo.gen_prompts_per_batch),
                             reward_fn)
        ds, n = _host_add(spec, ds, new), n + 1
    batch, stats = rollout_lib.dynamic_sampling_result(spec, ds)
    return batch, {k: np.asarray(v).item() for k, v in stats.items()}


def host_iteration(spec: TrainSpec, state: TrainState, reward_fn: HostReward,
                   programs: HostPrograms | None = None) -> tuple[TrainState, dict]:
    """One iteration with a Python reward: jitted generate -> host reward -> jitted learn; the metrics
    include the reward's counts of the iteration (`HostReward.take_counts`, e.g. `reward/unscored_count`)."""
    programs = programs or single_device_programs(spec)
    rng, k_collect, k_learn = _iteration_keys(state)
    reward_fn.take_counts()  # what evaluation scored since the last iteration is not this iteration's
    batch, stats = host_collect(spec, state.params, k_collect, reward_fn, programs)
    stats = dict(stats, **reward_fn.take_counts())
    check_dynamic_sampling(spec, stats)
    state, metrics = programs.learn(state.replace(rng=rng), batch, k_learn)
    return state, dict(metrics, **stats)


def check_finite_updates(spec: TrainSpec, metrics: dict, first_step: int) -> None:
    """Raises `NonFiniteUpdates` if `metrics` (stacked `[n]`, iterations from `first_step`)
    reach `spec.train.max_bad_steps` skipped updates in a row (policy or critic)."""
    for key in ("nonfinite_in_a_row", "critic/nonfinite_in_a_row"):
        in_a_row = np.asarray(metrics.get(key, np.zeros(0)))
        hit = np.flatnonzero(in_a_row >= spec.train.max_bad_steps)
        if hit.size:
            what = "critic" if key.startswith("critic") else "policy"
            raise NonFiniteUpdates(
                f"train.max_bad_steps={spec.train.max_bad_steps}: {int(in_a_row[hit[0]])} {what} optimizer updates in a "
                f"row had non-finite (NaN / inf) gradients and were skipped, up to iteration "
                f"{first_step + hit[0] + 1}; "
                "the state is the last finite one: lower train.lr or check the rewards / data of those iterations")


def check_dynamic_sampling(spec: TrainSpec, stats: dict) -> None:
    """Raises `DynamicSamplingExhausted` if any iteration in `stats` could not fill its batch."""
    if "dapo_exhausted" in stats and np.any(np.asarray(stats["dapo_exhausted"])):
        kept = np.min(np.asarray(stats["dapo_groups_kept"]))
        raise DynamicSamplingExhausted(
            f"DAPO dynamic sampling kept only {kept} of {spec.rollout.prompts_per_batch} informative groups after "
            f"dapo.max_num_gen_batches={spec.dapo.max_num_gen_batches} generation batches of {spec.dapo.gen_prompts_per_batch} prompts "
            f"(every other group had identical rewards): raise config.dapo.max_num_gen_batches or "
            f"config.dapo.gen_prompts_per_batch, or lower rollout.prompts_per_batch")
