"""The active sharding context: a mesh and rules under which traced code adds activation
sharding constraints (`constrain`: Qwen3 block boundaries, the sampler's KV cache), runs
kernels that cannot be partitioned under `shard_map` (`shard_kernel`: splash attention)
and picks vocab-parallel log-probs (`kernels/logprobs_sharded.py`).

    with sharding_context(mesh, rules):
        jitted_step(...)   # traced inside: constraints are baked into the program

Enter it *outside* `jax.jit`: it also sets `jax.set_mesh(mesh)`, which makes the mesh
part of JAX's trace-cache key, so a jitted function traced outside the context (or
under another mesh) is traced afresh instead of reusing a program without (or with
other) constraints. Outside a context nothing changes: `constrain` is the identity,
`shard_kernel` calls the kernel, and `qwen3.forward` is exactly the unconstrained function.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Iterator, Sequence

import jax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from pipo_jax.parallel.mesh import mesh_sizes
from pipo_jax.parallel.rules import DEFAULT_RULES, Rules, named_sharding, spec_for, without_axis
from pipo_jax.parallel.shardings import tree_shardings


@dataclasses.dataclass(frozen=True)
class ShardingContext:
    mesh: Mesh
    rules: Rules

    @property
    def tensor_size(self) -> int:
        return mesh_sizes(self.mesh).get("tensor", 1)


_ACTIVE: contextvars.ContextVar[ShardingContext | None] = contextvars.ContextVar("pipo_sharding", default=None)


def active_context() -> ShardingContext | None:
    """The innermost `sharding_context`, or None."""
    return _ACTIVE.get()


def mesh_batch_shards(mesh: Mesh, rules: Rules | None = None) -> int:
    """How many ways the `batch` logical axis is split on `mesh` (the product of its rule's mesh axes)."""
    axes = (DEFAULT_RULES if rules is None else rules).get("batch")
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    sizes = mesh_sizes(mesh)
    return math.prod(sizes.get(a, 1) for a in axes)


def batch_shards() -> int:
    """Devices the `batch` logical axis is split over under the active context (1 outside one)."""
    ctx = _ACTIVE.get()
    return 1 if ctx is None else mesh_batch_shards(ctx.mesh, ctx.rules)


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """`with_sharding_constraint` of `x` from its logical axes under the active context; else `x`."""
    ctx = _ACTIVE.get()
    if ctx is None:
        return x
    return jax.lax.with_sharding_constraint(x, named_sharding(ctx.mesh, tuple(logical_axes), x.shape, ctx.rules))


def gathered_over(tree, axes_tree, mesh_axis: str):
    """`tree` (leaves with the logical axes of `axes_tree`) constrained to the active rules without
    `mesh_axis`: gathered over it once, here, still split over the other axes; `tree` outside a context."""
    ctx = _ACTIVE.get()
    if ctx is None:
        return tree
    return jax.lax.with_sharding_constraint(
        tree, tree_shardings(tree, axes_tree, ctx.mesh, without_axis(ctx.rules, mesh_axis)))


def shard_kernel(fn, args, in_logical_axes, out_logical_axes):
    """`fn(*args)` under `shard_map` on the active mesh, each operand split by its logical axes.

    For kernels XLA cannot partition (Pallas / Mosaic custom calls): every device runs
    `fn` on its own block. `fn` must be correct per block along the split axes (rows,
    kv-head groups). check_vma=False: the Pallas interpreter cannot evaluate vma-typed
    values (see kernels/logprobs_pallas.py). Outside a context: `fn(*args)`.
    """
    ctx = _ACTIVE.get()
    if ctx is None:
        return fn(*args)

    def spec(axes, shape):
        return P(*spec_for(tuple(axes), tuple(shape), ctx.mesh, ctx.rules))

    in_specs = tuple(spec(a, x.shape) for a, x in zip(in_logical_axes, args))
    out_shape = jax.eval_shape(fn, *args)
    out_specs = spec(out_logical_axes, out_shape.shape)
    return jax.shard_map(fn, mesh=ctx.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)(*args)


@contextlib.contextmanager
def sharding_context(mesh: Mesh, rules: Rules | None = None) -> Iterator[ShardingContext]:
    """Activates `mesh` / `rules` (and `jax.set_mesh(mesh)`) for code traced inside the block.

    Must be entered outside `jax.jit` (JAX's `set_mesh` raises otherwise).
    """
    ctx = ShardingContext(mesh, DEFAULT_RULES if rules is None else rules)
    token = _ACTIVE.set(ctx)
    try:
        with jax.set_mesh(mesh):
            yield ctx
    finally:
        _ACTIVE.reset(token)
