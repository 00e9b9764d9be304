"""The micro trainer as the tests drive it, through the trainer's own programs: the state placed as
`Placement.init_state` places it, the host loop's generate (one program per `GenerationSpec`) and learn
(one per `TrainSpec`). Tests of one spec then share their compiled programs, in a process and, through
the persistent compilation cache, across the test processes, where a test's own
`jax.jit(lambda ...: learn.learn(...))` would compile its own copy of the same computation."""

import importlib

import jax
import numpy as np

from pipo_jax.models import qwen3
from pipo_jax.rl import loop
from pipo_jax.rl.experience import Rollout
from pipo_jax.rl.state import TrainState
from pipo_jax.run.placement import Placement
from pipo_jax.run.trainer import EvalBenchmarks, Evaluation
from tests.conftest import override
from tests.typed import spec_of


def micro(algo: str, pipo_on: bool = True, **overrides):
    """`configs/<algo>.py:micro` with `pipo.enabled=pipo_on` and dotted `overrides`."""
    c = importlib.import_module(f"configs.{algo}").get_config("micro")
    c.pipo.enabled = pipo_on
    return override(c, overrides)


def initial_state(spec, seed: int) -> TrainState:
    """The trainer's initial state of `spec` (params from `seed`), on the default device as it places it."""
    return Placement().init_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(seed)), seed)


def evaluation_of(spec, run) -> Evaluation:
    """The trainer's `Evaluation` of `spec` and its typed config `run` on one device (the task's scorer,
    `run`'s benchmarks)."""
    return Evaluation(spec, run, Placement(), spec.task.scorer(), EvalBenchmarks.load(run))


def fresh_state(c):
    """(spec, initial state) of config `c`."""
    spec = spec_of(c)
    return spec, initial_state(spec, c.seed)


def sampled(spec, params, rng) -> Rollout:
    """One batch as `rollout.collect` samples it (the same keys, so the same tokens), rewards left 0."""
    return loop.single_device_programs(spec).generate(params, rng, spec.rollout.prompts_per_batch)


def task_reward(spec):
    """The task's JAX reward `[B]` as a host reward (what the host loop calls on each rollout)."""
    return loop.RewardFunction(lambda r: np.asarray(loop.rollout_lib.task_rewards(spec, r)))


def collected(spec, params, rng) -> Rollout:
    """One batch as `rollout.collect` samples it, scored by `task_reward(spec)` (the host loop's programs)."""
    return loop.host_collect(spec, params, rng, task_reward(spec))[0]


def learned(spec, state: TrainState, rollout: Rollout, rng) -> tuple[TrainState, dict]:
    """`learn.learn` as the host loop runs it (`state`'s buffers are donated)."""
    return loop.single_device_programs(spec).learn(state, rollout, rng)


def host_iterations(spec, state, n: int):
    """`n` iterations of the host loop (jitted generate -> the task's reward -> jitted learn), metrics
    stacked `[n]` as `loop.scan_chunk` returns them. Generate is one program for every algorithm of a
    model and rollout, so a test per algorithm compiles only its update;
    `test_trainer.py:test_jitted_scan_loop_equals_host_loop` holds the two loops equal."""
    rows = []
    for _ in range(n):
        state, m = loop.host_iteration(spec, state, task_reward(spec))
        rows.append(jax.device_get(m))
    return jax.device_get(state), {k: np.stack([r[k] for r in rows]) for k in rows[0]}
