"""One of two processes of the multi-host test (python -m tests.parallel.multiprocess_worker PORT ID OUT_DIR).

Each process has 2 CPU devices; `initialize_distributed` joins them over localhost with
the gloo CPU collectives into 4 global devices. The mesh is fsdp=2 across the two
processes (`dcn_fsdp=2`) x tensor=2 inside each, so every parameter is split across
processes. The process runs the scenario's iterations with the sharded scan chunk (whose
log-probs run vocab-parallel), checks process-split data loading and a process-local
host reward, and both processes write one orbax checkpoint and restore it (onto this
mesh and onto tensor=4 across both processes). Process 0 writes the gathered
results to OUT_DIR/result.npz.
"""

from __future__ import annotations

import os
import sys

from pipo_jax import platforms  # imports no jax: the devices are set before JAX starts

platforms.simulate_cpu_devices(2)
os.environ["JAX_PLATFORMS"] = "cpu"

from pipo_jax import parallel  # noqa: E402  (imports jax but starts no backend)
from pipo_jax.config.sections import DistributedConfig  # noqa: E402


def main(port: int, process_id: int, out: str) -> None:
    settings = parallel.initialize_distributed(DistributedConfig(
        coordinator_address=f"localhost:{port}", num_processes=2, process_id=process_id, initialization_timeout=120))
    import jax
    import jax.numpy as jnp
    import numpy as np

    from pipo_jax.run import sharded_steps as steps
    from pipo_jax.run.checkpoint import Checkpointer
    from tests.parallel import scenario

    assert settings is not None and settings.source == "config", settings
    assert (jax.process_count(), jax.device_count(), jax.local_device_count()) == (2, 4, 2)
    mesh = parallel.make_mesh(1, 2, 2, dcn_fsdp=2)
    res = {"mesh_process_grid": np.array([[d.process_index for d in row] for row in mesh.devices[0]])}

    # Data split by process: rows of a global batch of 8, loaded only by the process that holds them.
    global_rows = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    mine = parallel.process_row_slice(8, mesh)
    batch = parallel.global_batch_from_process_local(global_rows[mine], 8, mesh)
    weights = jnp.arange(8, dtype=jnp.float32)
    res["data_rows_slice"] = np.array([mine.start, mine.stop])
    res["data_weighted_sum"] = np.asarray(jax.jit(lambda x: jnp.sum(x * weights[:, None]))(batch))
    res["data_gathered"] = steps.to_host(batch)
    reward = parallel.process_local_reward(lambda local: local.sum(axis=1) + 1000 * jax.process_index(), batch, mesh)
    res["reward_gathered"] = steps.to_host(reward)

    spec, state = scenario.initial_state()
    sharded = steps.shard_train_state(state, spec, mesh)
    new_state, metrics = steps.sharded_scan_chunk(spec, mesh, scenario.ITERATIONS)(sharded)
    res["embed_spec"] = np.asarray(str(new_state.params["embed"].sharding.spec))
    res["embed_fully_addressable"] = np.asarray(new_state.params["embed"].is_fully_addressable)
    res.update(scenario.run_summary(steps.to_host(new_state), steps.to_host(metrics)))

    ckpt = Checkpointer(os.path.join(out, "ckpt"), async_save=False)
    ckpt.save(scenario.ITERATIONS, new_state)
    ckpt.wait()
    # Every process restores its shards: onto the same mesh, and onto tensor=4 across both processes.
    abstract = steps.abstract_train_state(spec)
    saved = scenario.flatten(steps.to_host(new_state))
    for name, target in {"same": mesh, "1x1x4": parallel.make_mesh(1, 1, 4)}.items():
        restored = ckpt.restore(parallel.with_shardings(abstract, steps.state_shardings(spec, target)))
        same_layout = jax.tree.leaves(jax.tree.map(
            lambda x, s: x.sharding.is_equivalent_to(s, x.ndim), restored, steps.state_shardings(spec, target)))
        values = scenario.flatten(steps.to_host(restored))
        res[f"restore_{name}_layout"] = np.asarray(all(same_layout))
        res[f"restore_{name}_equal"] = np.asarray(all(np.array_equal(values[k], v) for k, v in saved.items()))
    ckpt.close()
    if process_id == 0:
        np.savez(os.path.join(out, "result.npz"), **res)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
