"""Data split by process: each process loads (or scores) only the rows its devices hold.

With the batch split over `batch` (= `data` x `fsdp`) and devices laid out by process,
process p's devices hold one contiguous block of rows of every global batch. A data
pipeline reads those rows (`process_row_slice`), and
`global_batch_from_process_local` assembles the global `jax.Array` from every process's
block (`jax.make_array_from_process_local_data`), with no host ever holding the whole
batch. The reverse, `process_local_rows`, gives a host the rows of a global array that
live on its devices (e.g. to score responses with a Python verifier);
`process_local_reward` does that round trip for a host reward function.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, Sharding

from pipo_jax.parallel.rules import Rules, named_sharding


def _rows_of(index: tuple, size: int) -> range:
    return range(*index[0].indices(size)) if index else range(size)


def process_row_indices(sharding: Sharding, global_shape: Sequence[int]) -> np.ndarray:
    """Sorted global indices along dim 0 that this process's devices hold under `sharding`."""
    rows: set[int] = set()
    for index in sharding.addressable_devices_indices_map(tuple(global_shape)).values():
        rows.update(_rows_of(index, global_shape[0]))
    return np.array(sorted(rows), dtype=np.int64)


def batch_sharding(global_shape: Sequence[int], mesh: Mesh, rules: Rules | None = None):
    """The sharding of an array with a leading batch dim (the `batch` rule; other dims whole)."""
    return named_sharding(mesh, ("batch",) + (None,) * (len(global_shape) - 1), tuple(global_shape), rules)


def process_row_slice(global_batch: int, mesh: Mesh, rules: Rules | None = None) -> slice:
    """The contiguous rows `[start, stop)` of a global batch this process must load."""
    rows = process_row_indices(batch_sharding((global_batch,), mesh, rules), (global_batch,))
    if rows.size == 0 or rows[-1] - rows[0] + 1 != rows.size:
        raise ValueError(f"this process's rows of a batch of {global_batch} are not one contiguous block "
                         f"({rows.tolist()[:8]}...): build the mesh with devices ordered by process")
    return slice(int(rows[0]), int(rows[-1]) + 1)


def global_batch_from_process_local(local_tree: Any, global_batch: int, mesh: Mesh,
                                    rules: Rules | None = None) -> Any:
    """Global arrays `[global_batch, ...]` from each process's rows (`process_row_slice`) of every leaf."""
    def one(local):
        local = np.asarray(local)
        shape = (global_batch,) + local.shape[1:]
        return jax.make_array_from_process_local_data(batch_sharding(shape, mesh, rules), local, shape)

    return jax.tree.map(one, local_tree)


def process_local_rows(x: jax.Array) -> np.ndarray:
    """numpy rows (dim 0, ascending) of global array `x` held by this process's devices."""
    rows = process_row_indices(x.sharding, x.shape)
    out = np.empty((rows.size,) + x.shape[1:], x.dtype)
    position = {r: i for i, r in enumerate(rows)}
    for shard in x.addressable_shards:
        block = np.asarray(shard.data)
        dest = [position[r] for r in _rows_of(shard.index, x.shape[0])]
        out[dest] = block  # replicas write the same values
    return out


def process_local_reward(reward_fn: Callable[[Any], np.ndarray], rollout: Any, mesh: Mesh,
                         rules: Rules | None = None) -> jax.Array:
    """A host reward `[B]`: each process scores its own `process_row_slice` of `rollout`.

    `reward_fn(local_rollout) -> [rows]` sees a tree of numpy arrays holding this
    process's rows; the results are assembled into one global array split over `batch`.
    """
    global_batch = jax.tree.leaves(rollout)[0].shape[0]
    mine = process_row_slice(global_batch, mesh, rules)
    wanted = np.arange(mine.start, mine.stop)

    def take(x):
        rows = process_row_indices(x.sharding, x.shape)
        if not np.isin(wanted, rows).all():
            raise ValueError(f"rollout leaf of shape {x.shape} does not hold this process's rows "
                             f"[{mine.start}, {mine.stop}) (is it split over the batch rule?)")
        return process_local_rows(x)[np.searchsorted(rows, wanted)]

    local = jax.tree.map(take, rollout)
    rewards = np.asarray(reward_fn(local), np.float32)
    if rewards.shape != (wanted.size,):
        raise ValueError(f"reward function returned shape {rewards.shape} for {wanted.size} local rows")
    return global_batch_from_process_local(rewards, global_batch, mesh, rules)
