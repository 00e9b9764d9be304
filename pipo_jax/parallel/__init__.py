"""Sharding and multi-host, a leaf library (it imports nothing of the package but `platforms` and the
config schema, whose typed `mesh` / `distributed` sections it reads):
a (data, fsdp, tensor) mesh, one logical-axis rules table, shardings for every piece of the
train state, the active sharding context (activation constraints, `shard_map` for kernels),
process-split data and `jax.distributed` start-up. The trainer's sharded steps are
`pipo_jax.run.sharded_steps`, the vocab-parallel log-prob `pipo_jax.kernels.logprobs_sharded`.
See the README section "Running sharded / multi-host".
"""

from pipo_jax.parallel.context import (ShardingContext, active_context, batch_shards, constrain, gathered_over,
                                       mesh_batch_shards, shard_kernel, sharding_context)
from pipo_jax.parallel.distributed import DistributedSettings, distributed_settings, initialize_distributed
from pipo_jax.parallel.host_data import (global_batch_from_process_local, process_local_reward, process_local_rows,
                                         process_row_slice)
from pipo_jax.parallel.mesh import AXES, BATCH_AXES, describe, make_mesh, mesh_from_config, mesh_sizes
from pipo_jax.parallel.rules import DEFAULT_RULES, make_rules, named_sharding, parse_rules, replicated, spec_for
from pipo_jax.parallel.shardings import (batch_shardings, critic_axes, mirror_shardings, pipo_state_shardings,
                                         train_state_shardings, tree_shardings, with_shardings)

__all__ = [
    "AXES", "BATCH_AXES", "DEFAULT_RULES", "DistributedSettings", "ShardingContext", "active_context", "batch_shards",
    "batch_shardings", "constrain", "critic_axes", "describe", "distributed_settings", "gathered_over",
    "global_batch_from_process_local", "initialize_distributed", "make_mesh", "make_rules",
    "mesh_batch_shards", "mesh_from_config", "mesh_sizes", "mirror_shardings", "named_sharding", "parse_rules",
    "pipo_state_shardings", "process_local_reward", "process_local_rows", "process_row_slice", "replicated",
    "shard_kernel", "sharding_context", "spec_for", "train_state_shardings", "tree_shardings", "with_shardings",
]
