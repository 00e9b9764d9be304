"""The trainer's jitted functions with explicit in / out shardings over a mesh.

    from pipo_jax import parallel
    from pipo_jax.run import sharded_steps
    mesh = parallel.mesh_from_config(config.mesh)
    state = sharded_steps.init_sharded_train_state(spec, mesh, params, seed)   # or shard_train_state
    chunk = sharded_steps.sharded_scan_chunk(spec, mesh, length)               # cached per arguments
    state, metrics = chunk(state)                                             # metrics replicated

The mesh, rules and shardings come from `pipo_jax.parallel`, which imports nothing of the trainer.

Each function traces the *same* step functions as the single-device trainer
(`loop.iteration`, `learn.learn`, `rollout.generate`) inside a `sharding_context`, so the
program is the single-device program plus sharding annotations: parameters and
optimizer state per the rules table, batches split over `batch`, activations
constrained at Qwen3 block boundaries. The state argument is donated.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from pipo_jax.models import qwen3
from pipo_jax.parallel.context import sharding_context
from pipo_jax.parallel.host_data import process_local_reward
from pipo_jax.parallel.rules import Rules, make_rules, replicated, rules_key
from pipo_jax.parallel.shardings import batch_shardings, train_state_shardings, tree_shardings
from pipo_jax.rl import experience
from pipo_jax.rl import learn as learn_lib
from pipo_jax.rl import loop
from pipo_jax.rl import rollout as rollout_lib
from pipo_jax.rl.spec import TrainSpec
from pipo_jax.rl.state import TrainState, init_train_state


@dataclasses.dataclass(frozen=True)
class ShardedFunction:
    """A jitted function that is traced and run inside `sharding_context(mesh, rules)`.

    On a mesh of CPU devices a call returns once its program has finished: XLA:CPU runs a
    multi-device program's devices as tasks of one shared thread pool, each blocking its thread at
    a collective's rendezvous, so sharded programs in flight together can hold each other's
    threads and deadlock (`platforms.CPU_POOL_THREADS_PER_DEVICE` sizes the pool for a few).
    Accelerator devices order programs on per-device streams and keep asynchronous dispatch."""

    jitted: Any
    mesh: Mesh
    rules: Rules

    def __call__(self, *args):
        with sharding_context(self.mesh, self.rules):
            out = self.jitted(*args)
        return jax.block_until_ready(out) if runs_on_cpu(self.mesh) else out

    def lower(self, *args):
        """`jax.jit(...).lower` inside the context (for `.compile().memory_analysis()` etc.)."""
        with sharding_context(self.mesh, self.rules):
            return self.jitted.lower(*args)


def runs_on_cpu(mesh: Mesh) -> bool:
    """Whether `mesh`'s devices are XLA:CPU devices (the devices that run the program, not a target)."""
    return mesh.devices.flat[0].platform == "cpu"


def abstract_train_state(spec: TrainSpec) -> TrainState:
    """The `TrainState` of `spec` as `jax.ShapeDtypeStruct`s (nothing allocated)."""
    return jax.eval_shape(lambda: init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(0)), 0))


def state_shardings(spec: TrainSpec, mesh: Mesh, rules: Rules | None = None) -> TrainState:
    """NamedShardings of `spec`'s `TrainState` on `mesh`."""
    return train_state_shardings(qwen3.param_axes(spec.model), abstract_train_state(spec), mesh, rules)


def place(x: Any, sharding: jax.sharding.Sharding) -> jax.Array:
    """`x` (host or device array, the same value on every process) as a global array with `sharding`.

    Always a new buffer (never an alias of `x`), so donating the result leaves `x` intact.
    """
    if isinstance(x, jax.Array) and x.is_fully_addressable and sharding.is_fully_addressable:
        # device_put may alias x's buffer for the shard on x's own device (even with
        # may_alias=False in jax 0.10); the copy makes the result safe to donate.
        return jnp.copy(jax.device_put(x, sharding))
    host = np.asarray(jax.device_get(x))
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def place_tree(tree: Any, shardings: Any) -> Any:
    """`place` over a tree and its matching shardings tree."""
    return jax.tree.map(place, tree, shardings)


def shard_train_state(state: TrainState, spec: TrainSpec, mesh: Mesh, rules: Rules | None = None) -> TrainState:
    """A host / single-device `TrainState` placed on `mesh` (every process passes the same state)."""
    return place_tree(state, train_state_shardings(qwen3.param_axes(spec.model), state, mesh, rules))


def init_sharded_train_state(spec: TrainSpec, mesh: Mesh, params: Any | None, seed: int,
                             rules: Rules | None = None) -> TrainState:
    """`init_train_state(spec, params, seed)` built directly on `mesh` (no single-device copy).

    `params` None: a random init (`qwen3.init_params` with key `seed`) inside the jit.
    """
    rules = make_rules(None if rules is None else dict(rules))
    out = state_shardings(spec, mesh, rules)
    if params is None:
        fn = jax.jit(lambda: init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(seed)), seed),
                     out_shardings=out)
        return fn()
    p_sh = tree_shardings(params, qwen3.param_axes(spec.model), mesh, rules)
    fn = jax.jit(lambda p: init_train_state(spec, p, seed), in_shardings=(p_sh,), out_shardings=out)
    return fn(place_tree(params, p_sh))


@functools.lru_cache(maxsize=32)
def _scan_chunk(spec: TrainSpec, mesh: Mesh, length: int, rules_items: tuple) -> ShardedFunction:
    rules = make_rules(dict(rules_items))
    sh = state_shardings(spec, mesh, rules)

    def chunk(state):
        return jax.lax.scan(lambda s, _: loop.iteration(spec, s), state, None, length=length)

    jitted = jax.jit(chunk, in_shardings=(sh,), out_shardings=(sh, replicated(mesh)), donate_argnums=0)
    return ShardedFunction(jitted, mesh, rules)


def sharded_scan_chunk(spec: TrainSpec, mesh: Mesh, length: int, rules: Rules | None = None) -> ShardedFunction:
    """`loop.scan_chunk(spec, ., length)` on `mesh`: `fn(state) -> (state, metrics [length])`."""
    return _scan_chunk(spec, mesh, int(length), rules_key(rules))


def _abstract_table(spec: TrainSpec):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), spec.task.prompt_table())


def abstract_rollout(spec: TrainSpec, n_prompts: int):
    """The `Rollout` of `n_prompts` prompts as `jax.ShapeDtypeStruct`s (nothing allocated)."""

    def make(table):
        key = jax.random.PRNGKey(0)
        params, gen = qwen3.init_params(spec.model, key), spec.generation
        return rollout_lib.generate(gen, params, rollout_lib.sample_problems(gen, key, n_prompts, table=table), key)

    return jax.eval_shape(make, _abstract_table(spec))


@functools.lru_cache(maxsize=32)
def _generate(spec: TrainSpec, mesh: Mesh, n_prompts: int, rules_items: tuple) -> ShardedFunction:
    rules = make_rules(dict(rules_items))
    p_sh = state_shardings(spec, mesh, rules).params
    out = batch_shardings(abstract_rollout(spec, n_prompts), mesh, rules)

    def generate(params, table, rng):
        k_prob, k_gen = jax.random.split(rng)
        gen = spec.generation
        problems = rollout_lib.sample_problems(gen, k_prob, n_prompts, table=table)
        return rollout_lib.generate(gen, params, problems, k_gen)

    jitted = jax.jit(generate, in_shardings=(p_sh, replicated(mesh), replicated(mesh)), out_shardings=out)
    return ShardedFunction(jitted, mesh, rules)


def mesh_prompt_table(spec: TrainSpec, mesh: Mesh) -> Any:
    """The task's prompt table replicated on `mesh` (None when it has none)."""
    table = spec.task.prompt_table()
    return None if table is None else place_tree(table, jax.tree.map(lambda _: replicated(mesh), table))


def sharded_generate(spec: TrainSpec, mesh: Mesh, n_prompts: int, rules: Rules | None = None) -> ShardedFunction:
    """The host loop's generate on `mesh`: `fn(params, table, rng) -> Rollout` of `n_prompts x G` rows
    (`table`: `mesh_prompt_table`, None for the built-in task).

    Same keys and result as `loop._host_generate(spec, params, table, rng, n_prompts)`; the
    rollout comes back split over `batch`.
    """
    return _generate(spec, mesh, int(n_prompts), rules_key(rules))


@functools.lru_cache(maxsize=32)
def _learn(spec: TrainSpec, mesh: Mesh, rules_items: tuple) -> ShardedFunction:
    rules = make_rules(dict(rules_items))
    sh = state_shardings(spec, mesh, rules)
    r_abstract = abstract_rollout(spec, spec.rollout.prompts_per_batch)
    if spec.dapo.dynamic_sampling:  # the host loop's DAPO batch carries its raw mean reward
        r_abstract = r_abstract.replace(mu_raw=jax.ShapeDtypeStruct((), jnp.float32))
    r_sh = batch_shardings(r_abstract, mesh, rules)

    def step(state, batch, rng):
        return learn_lib.learn(spec, state, batch, rng)

    jitted = jax.jit(step, in_shardings=(sh, r_sh, replicated(mesh)), out_shardings=(sh, replicated(mesh)),
                     donate_argnums=0)
    return ShardedFunction(jitted, mesh, rules)


def sharded_learn(spec: TrainSpec, mesh: Mesh, rules: Rules | None = None) -> ShardedFunction:
    """`learn.learn` on `mesh` (the host loop's update): `fn(state, rollout, rng) -> (state, metrics)`."""
    return _learn(spec, mesh, rules_key(rules))


def to_host(tree: Any) -> Any:
    """numpy copies of a tree of (possibly multi-process) global arrays, gathered on every process."""
    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree.map(one, tree)


def mesh_host_programs(spec: TrainSpec, mesh: Mesh, rules: Rules | None = None) -> loop.HostPrograms:
    """The host loop's programs on `mesh`: sharded generate and learn; each process scores
    only its own rows of a rollout (`process_local_reward`)."""
    def score(rollout, reward_fn):
        return experience.with_rewards(rollout, process_local_reward(reward_fn, rollout, mesh, rules))

    table = mesh_prompt_table(spec, mesh)
    return loop.HostPrograms(
        generate=lambda params, rng, n_prompts: sharded_generate(spec, mesh, n_prompts, rules)(params, table, rng),
        score=score, learn=sharded_learn(spec, mesh, rules))
