"""NamedShardings of everything the trainer carries: params, optimizer state, the PPO
critic, reference / teacher params, the PIPO state, the advantage estimator's state and batches.

All functions take the tree itself (arrays or `jax.ShapeDtypeStruct`s, e.g. from
`jax.eval_shape`) and return a tree of the same structure with a `NamedSharding` per
leaf, so they serve `jax.jit(in_shardings=..., out_shardings=...)`, `jax.device_put`
and orbax restore templates alike.

Optimizer states are sharded like the parameters they mirror: every sub-tree of the
state with the parameters' tree structure and shapes (Adam's `mu`, `nu`, ...) gets the
parameter shardings; everything else (step counts, injected hyper-parameters) is
replicated. The model enters as its parameters' logical axes (`param_axes`, e.g.
`qwen3.param_axes(config)`): this module imports nothing of the model.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from pipo_jax.parallel.rules import Rules, named_sharding, replicated


def _shape(x) -> tuple[int, ...]:
    return tuple(np.shape(x))


def _is_axes(x) -> bool:
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def tree_shardings(tree: Any, axes_tree: Any, mesh: Mesh, rules: Rules | None = None) -> Any:
    """Shardings of `tree` whose leaves carry the logical axes given by `axes_tree` (same structure)."""
    return jax.tree.map(lambda axes, x: named_sharding(mesh, axes, _shape(x), rules), axes_tree, tree,
                        is_leaf=_is_axes)


def critic_axes(param_axes: Any) -> dict:
    """Logical axes of the PPO critic params `{"backbone": <policy params>, "value_head": [D]}`."""
    return {"backbone": param_axes, "value_head": ("embed",)}


def mirror_shardings(tree: Any, like: Any, like_shardings: Any, mesh: Mesh) -> Any:
    """Shardings of `tree` (an optimizer state): sub-trees shaped like `like` get `like_shardings`.

    A sub-tree matches when its tree structure equals `like`'s and every leaf has the
    same shape; all other leaves (counts, hyper-parameters) are replicated.
    """
    like_def = jax.tree.structure(like)
    like_shapes = [_shape(x) for x in jax.tree.leaves(like)]
    like_leaves = jax.tree.leaves(like_shardings)

    def matches(sub) -> bool:
        if jax.tree.structure(sub) != like_def:
            return False
        return [_shape(x) for x in jax.tree.leaves(sub)] == like_shapes

    def shard(sub):
        if matches(sub):
            return jax.tree.unflatten(like_def, like_leaves)
        return jax.tree.map(lambda _: replicated(mesh), sub)

    return jax.tree.map(shard, tree, is_leaf=matches)


def batch_shardings(tree: Any, mesh: Mesh, rules: Rules | None = None) -> Any:
    """Leaves with a leading batch dim: split it over the `batch` rule; the rest stays whole.

    Scalars are replicated.
    """
    def one(x):
        shape = _shape(x)
        if not shape:
            return replicated(mesh)
        return named_sharding(mesh, ("batch",) + (None,) * (len(shape) - 1), shape, rules)

    return jax.tree.map(one, tree)


def pipo_state_shardings(pipo_state: Any, mesh: Mesh, rules: Rules | None = None) -> Any:
    """`PipoState`: the mu window and counters replicated, the stored batch split over `batch`."""
    return pipo_state.replace(
        mu_window_k=named_sharding(mesh, ("window",), _shape(pipo_state.mu_window_k), rules),
        count=replicated(mesh),
        has_prev=replicated(mesh),
        prev=batch_shardings(pipo_state.prev, mesh, rules),
    )


def train_state_shardings(param_axes: Any, state: Any, mesh: Mesh, rules: Rules | None = None) -> Any:
    """Shardings of a `TrainState` (concrete or abstract) whose policy params have the logical axes `param_axes`.

    params, ref_params, teacher_params: `param_axes`; opt_state mirrors params; the critic
    `{"params", "opt_state"}` likewise with `critic_axes`; PIPO state per
    `pipo_state_shardings`; step, rng, the advantage estimator's carried state
    (`estimator_state`, a few scalars: BNPO's pool of success rates) and the hyperparameters (`hyper`)
    replicated. Any other field (e.g. VPD's
    `teacher_opt_state`, `vpd_delta`) is sharded like the params where it mirrors them
    and replicated elsewhere.
    """
    params = tree_shardings(state.params, param_axes, mesh, rules)

    def maybe_params(tree):
        return None if tree is None else tree_shardings(tree, param_axes, mesh, rules)

    critic = None
    if state.critic is not None:
        c_params = tree_shardings(state.critic["params"], critic_axes(param_axes), mesh, rules)
        critic = {"params": c_params,
                  "opt_state": mirror_shardings(state.critic["opt_state"], state.critic["params"], c_params, mesh)}
    known = dict(
        step=replicated(mesh),
        params=params,
        opt_state=mirror_shardings(state.opt_state, state.params, params, mesh),
        ref_params=maybe_params(state.ref_params),
        critic=critic,
        teacher_params=maybe_params(state.teacher_params),
        pipo=pipo_state_shardings(state.pipo, mesh, rules),
        rng=replicated(mesh),
        estimator_state=jax.tree.map(lambda _: replicated(mesh), state.estimator_state),
        hyper=jax.tree.map(lambda _: replicated(mesh), state.hyper),
    )
    for field in dataclasses.fields(state):
        if field.name not in known:
            known[field.name] = mirror_shardings(getattr(state, field.name), state.params, params, mesh)
    return state.replace(**known)


def with_shardings(tree: Any, shardings: Any) -> Any:
    """`jax.ShapeDtypeStruct`s of `tree` carrying `shardings` (an orbax restore template)."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(_shape(x), x.dtype, sharding=s), tree, shardings)


def default_device_sharding() -> jax.sharding.SingleDeviceSharding:
    """This process's first local device, where a run without a mesh keeps its state."""
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def on_default_device(tree: Any) -> Any:
    """`tree` committed to `default_device_sharding()`. A run without a mesh commits its state
    before its first program: jax keys its compiled programs by their inputs' shardings too, and
    a program's outputs are committed, so a step fed a fresh (uncommitted) state first and its own
    outputs next would compile the same program twice."""
    return jax.device_put(tree, default_device_sharding())

