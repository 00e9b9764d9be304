"""Subprocess body of tests/parallel/test_micro_batch_per_device.py (8 simulated devices).

python -m tests.parallel.micro_batch_worker OUT.json

On a data=2 x fsdp=4 mesh (8 batch shards) with `micro_batch_size_per_device=1`, compares
one mini-batch's accumulated gradients and the rollout passes of `learn.prepare` with the
single-device computation, and records each compiled program's per-device FLOPs, the
activation shapes in its HLO and `prepare`'s temporary memory at two rollout sizes.
"""

from __future__ import annotations

import json
import re
import sys

from pipo_jax import platforms  # imports no jax: the devices are set before JAX starts

platforms.simulate_cpu_devices(8)

import jax
import numpy as np

from configs import grpo
from experiments.benchmarks.prepare_memory import prepare_memory
from pipo_jax import parallel
from pipo_jax.models import qwen3
from pipo_jax.parallel.shardings import batch_shardings
from pipo_jax.rl import learn, rollout, steps
from pipo_jax.rl.batch import TrainBatch
from pipo_jax.rl.hyper import hyperparameters_of
from pipo_jax.rl.state import init_train_state
from pipo_jax.run import sharded_steps as sharded
from tests.typed import spec_of

SEED = 1


def make_spec(prompts: int, per_device: int = 1):
    c = grpo.get_config("micro")
    c.seed = SEED
    c.rollout.prompts_per_batch = prompts
    c.train.mini_batch_prompts = 4  # 16 sequences per mini-batch
    c.train.micro_batch_size_per_device = per_device
    # The one-device programs in the form the mesh programs take (a cpu program under a mesh scans
    # its layers: `qwen3.layers_unrolled`), so that their FLOPs compare (`cost_analysis` counts a
    # loop body once).
    c.model.layer_loop = "scan"
    return spec_of(c)


def flops(compiled) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["flops"])


def main(out_path: str) -> None:
    spec = make_spec(4)  # B = 16 = one mini-batch
    state = init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(SEED)), SEED)
    reward_fn = lambda r: rollout.task_rewards(spec, r)  # noqa: E731
    ro = jax.jit(lambda p, k: rollout.collect(spec, p, k, reward_fn)[0])(state.params, jax.random.PRNGKey(3))
    batch, _, _ = jax.jit(lambda s, r: learn.prepare(spec, s, r))(state, ro)
    # random advantages: a policy gradient in every row (the micro rollout's rewards may all tie)
    batch = TrainBatch(tokens_bl=batch.tokens_bl, mask_bl=batch.mask_bl, mask_br=batch.mask_br,
                       logp_old_br=batch.logp_old_br, logp_ref_br=batch.logp_ref_br,
                       adv_br=jax.random.normal(jax.random.PRNGKey(4), batch.mask_br.shape) * batch.mask_br)
    loss_fn = steps.base_loss_fn(spec, hyper=hyperparameters_of(spec))

    def grads_fn(params, mini):
        return steps.accumulate_grads(spec, loss_fn, params, mini, steps.response_counts(mini))

    def passes_fn(st, tokens, mask):
        return learn.rollout_passes(spec, st, tokens, mask)

    one = jax.jit(grads_fn).lower(state.params, batch).compile()
    one_passes = jax.jit(passes_fn).lower(state, batch.tokens_bl, batch.mask_bl).compile()
    g1, m1 = one(state.params, batch)
    p1 = one_passes(state, batch.tokens_bl, batch.mask_bl)

    # a single-device program computing 8 rows per micro-step (what a global micro-batch of 8 gives each device)
    spec8 = make_spec(4, per_device=8)
    eight = jax.jit(lambda p, mini: steps.accumulate_grads(spec8, loss_fn, p, mini, steps.response_counts(mini))
                    ).lower(state.params, batch).compile()

    mesh = parallel.make_mesh(2, 4, 1)
    st_sh = sharded.state_shardings(spec, mesh)
    b_sh = batch_shardings(batch, mesh)
    with parallel.sharding_context(mesh):
        lowered = jax.jit(grads_fn, in_shardings=(st_sh.params, b_sh)).lower(state.params, batch)
        tok_sh = b_sh.tokens_bl
        lowered_passes = jax.jit(passes_fn, in_shardings=(st_sh, tok_sh, tok_sh)).lower(
            state, batch.tokens_bl, batch.mask_bl)
    mesh_c, mesh_passes = lowered.compile(), lowered_passes.compile()
    # One sharded program in flight at a time (see run/sharded_steps.py:ShardedFunction): two in flight
    # together can deadlock XLA:CPU's device threads in each other's collectives.
    g8, m8 = jax.block_until_ready(mesh_c(sharded.place_tree(state.params, st_sh.params),
                                          sharded.place_tree(batch, b_sh)))
    p8 = mesh_passes(sharded.place_tree(state, st_sh), *(sharded.place(x, tok_sh)
                                                          for x in (batch.tokens_bl, batch.mask_bl)))
    p8 = jax.block_until_ready(p8)

    def max_diff(a, b):
        return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in
                   zip(jax.tree.leaves(a), jax.tree.leaves(b)))

    L, F = spec.seq_len, spec.model.intermediate_size

    def mlp_rows(compiled) -> list[int]:
        """Row counts of the MLP activations `[rows, L, F]` in the per-device HLO."""
        return sorted({int(r) for r in re.findall(rf"\[(\d+),{L},{F}\]", compiled.as_text())})

    # prepare's per-device temporaries at two rollout sizes (16 and 64 sequences)
    temps = {}
    for prompts in (4, 16):
        s = make_spec(prompts)
        temps[str(s.batch)] = prepare_memory(s, mesh)["temp_bytes"]

    with parallel.sharding_context(mesh):  # 4 per device x 8 shards does not divide the mini-batch of 16
        try:
            jax.eval_shape(lambda p, mini: steps.accumulate_grads(make_spec(4, per_device=4), loss_fn, p, mini,
                                                                  steps.response_counts(mini)), state.params, batch)
            error = ""
        except Exception as e:  # noqa: BLE001 (the message is what the test checks)
            error = f"{type(e).__name__}: {e}"

    out = {
        "error_4_per_device": error, "flops_single_8_rows": flops(eight), "mlp_rows_single_8_rows": mlp_rows(eight),
        "grad_max_diff": max_diff(g1, g8), "grad_max_abs": max(float(np.max(np.abs(x))) for x in jax.tree.leaves(g1)),
        "loss_single": float(m1["loss"]), "loss_mesh": float(m8["loss"]),
        "passes_max_diff": max_diff(p1, p8),
        "flops_single": flops(one), "flops_mesh": flops(mesh_c),
        "flops_passes_single": flops(one_passes), "flops_passes_mesh": flops(mesh_passes),
        "mlp_rows_single": mlp_rows(one), "mlp_rows_mesh": mlp_rows(mesh_c),
        "mlp_rows_passes_mesh": mlp_rows(mesh_passes),
        "prepare_temp_bytes": temps,
    }
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
