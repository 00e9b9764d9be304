"""Subprocess body of the 8-simulated-device tests (run: python -m tests.parallel.mesh_worker OUT_DIR).

XLA_FLAGS must give 8 host devices before JAX is imported, so this runs in its own
process. For each mesh it places the scenario's state, runs the sharded scan chunk and
writes the run summary; the host loop (sharded sampler, per-process host reward, sharded
learn) on one mesh; the vocab-parallel log-prob against the plain kernel (values and
gradients); a directly-sharded initial state; and a checkpoint saved on one mesh and
restored on others. Everything is written to OUT_DIR as .npz files for the test to check.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time

from pipo_jax import platforms  # imports no jax: the devices are set before JAX starts

platforms.simulate_cpu_devices(8)

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import hlo_cost
from pipo_jax import parallel
from pipo_jax.kernels import logprobs as kernel
from pipo_jax.kernels import logprobs_sharded
from pipo_jax.models import qwen3
from pipo_jax.rl import loop
from pipo_jax.rl import rollout as rollout_lib
from pipo_jax.rl.state import init_train_state
from pipo_jax.run import sharded_steps as steps
from pipo_jax.run.checkpoint import Checkpointer
from tests.parallel import scenario
from tests.typed import spec_of

# (data, fsdp, tensor); with tensor > 1 the trainer's log-probs run vocab-parallel
# The jitted scan loop on pure data parallelism and on all three axes at once; 1x2x4 (tensor 4)
# runs the host loop (host_loop_run).
MESHES = {"8x1x1": (8, 1, 1), "2x2x2": (2, 2, 2)}


def train_runs(out: str) -> dict:
    states = {}
    for name, (d, f, t) in MESHES.items():
        stage(f"train {name}")
        spec, state = scenario.initial_state()
        mesh = parallel.make_mesh(d, f, t)
        sharded = steps.shard_train_state(state, spec, mesh)
        new_state, metrics = steps.sharded_scan_chunk(spec, mesh, scenario.ITERATIONS)(sharded)
        summary = scenario.run_summary(steps.to_host(new_state), steps.to_host(metrics))
        summary["param_spec/embed"] = np.asarray(str(new_state.params["embed"].sharding.spec))
        summary["param_spec/q_proj"] = np.asarray(str(new_state.params["layers"]["q_proj"].sharding.spec))
        summary["opt_spec/mu_embed"] = np.asarray(str(new_state.opt_state.inner_state[1].inner_state[0].mu["embed"].sharding.spec))
        summary["stored_tokens_spec"] = np.asarray(str(new_state.pipo.prev.tokens_bl.sharding.spec))
        np.savez(os.path.join(out, f"train_{name}.npz"), **summary)
        states[name] = (spec, new_state)
    return states


def logprob_check(out: str) -> None:
    n, d, v = 48, 16, 64
    rng = np.random.RandomState(0)
    h = jnp.asarray(rng.randn(n, d), jnp.float32)
    w = jnp.asarray(rng.randn(d, v) * 0.3, jnp.float32)
    tgt = jnp.asarray(rng.randint(0, v, n), jnp.int32)
    valid = jnp.asarray(rng.rand(n) > 0.2)
    g_lp = jnp.asarray(rng.randn(n), jnp.float32)
    g_ent = jnp.asarray(rng.randn(n), jnp.float32)

    def compiled(fn):
        def f(h, w):
            lp, ent = fn(h, w, tgt, valid_n=valid)
            return jnp.sum(lp * g_lp) + jnp.sum(ent * g_ent), (lp, ent)

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True)).lower(h, w).compile()

    results = {}
    config = functools.partial(kernel.kernel_config, temperature=0.7, with_entropy=True)
    (_, (lp, ent)), (dh, dw) = compiled(functools.partial(kernel.token_logprobs, cfg=config(impl="reference")))(h, w)
    results.update(ref_lp=lp, ref_ent=ent, ref_dh=dh, ref_dw=dw)
    cases = {"1x2x4_chunked": (1, 2, 4, "chunked"), "2x2x2_chunked": (2, 2, 2, "chunked"),
             "2x1x4_reference": (2, 1, 4, "reference"), "1x2x4_pallas": (1, 2, 4, "pallas")}
    for name, (dd, f, t, impl) in cases.items():
        mesh = parallel.make_mesh(dd, f, t)
        blocks = dict(block_n=8, block_v=8) if impl != "reference" else {}
        fn = functools.partial(logprobs_sharded.token_logprobs_tensor_parallel, cfg=config(impl=impl, **blocks),
                               mesh=mesh)
        program = compiled(fn)
        # One sharded program in flight at a time (see run/sharded_steps.py:ShardedFunction).
        (_, (lp, ent)), (dh, dw) = jax.block_until_ready(program(h, w))
        results.update({f"{name}_lp": lp, f"{name}_ent": ent, f"{name}_dh": dh, f"{name}_dw": dw})
        # No buffer of the full vocabulary may appear: neither [N_local, V] logits nor a gathered [D, V] head.
        hlo = program.as_text()
        rows = n // (dd * f)
        results[f"{name}_full_vocab_buffers"] = np.asarray(
            sum(hlo.count(f"f32[{r},{v}]") for r in {n, rows}) + hlo.count(f"f32[{d},{v}]"))
        results[f"{name}_local_head_buffers"] = np.asarray(hlo.count(f"f32[{d},{v // t}]"))
    np.savez(os.path.join(out, "logprobs.npz"), **{k: np.asarray(x) for k, x in results.items()})


def host_loop_run(out: str) -> None:
    """The trainer's host loop on 1x2x4 (`loop.host_iteration` with `steps.mesh_host_programs`):
    sharded generate -> per-process host reward -> sharded learn."""
    spec, state = scenario.initial_state()
    mesh = parallel.make_mesh(1, 2, 4)
    base = steps.mesh_host_programs(spec, mesh)
    generated = []  # the rollouts, to check how they are split
    programs = dataclasses.replace(base, generate=lambda *a: generated.append(base.generate(*a)) or generated[-1])
    state = steps.shard_train_state(state, spec, mesh)
    rows = []
    for _ in range(scenario.ITERATIONS):
        state, metrics = loop.host_iteration(
            spec, state, loop.RewardFunction(lambda local: np.asarray(rollout_lib.task_rewards(spec, local))), programs)
        rows.append(steps.to_host(metrics))
    metrics = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    summary = scenario.run_summary(steps.to_host(state), metrics)
    summary["rollout_tokens_spec"] = np.asarray(str(generated[-1].tokens_bl.sharding.spec))
    summary["param_spec/embed"] = np.asarray(str(state.params["embed"].sharding.spec))
    summary["opt_spec/mu_embed"] = np.asarray(str(state.opt_state.inner_state[1].inner_state[0].mu["embed"].sharding.spec))
    summary["stored_tokens_spec"] = np.asarray(str(state.pipo.prev.tokens_bl.sharding.spec))
    summary.update(gathered_decode_check(mesh))
    np.savez(os.path.join(out, "host_loop_1x2x4.npz"), **summary)


def gathered_decode_check(mesh) -> dict:
    """Generate on 1x2x4 with the weights sharded as the trainer shards them and gathered over fsdp once per
    call (`rollout.decode_weights`): the rollouts, and the all-gather bytes each program moves. On the
    two-layer task model, whose decode loop gathers each layer's weights at every step (the scenario's
    one-layer model's decode loops all-gather as much with the weights gathered once as without)."""
    c = scenario.config()
    c.model.preset = "task_tiny"
    spec = spec_of(c)
    params = steps.init_sharded_train_state(spec, mesh, None, c.seed).params
    out, rng, n = {}, jax.random.PRNGKey(11), spec.rollout.prompts_per_batch
    table = steps.mesh_prompt_table(spec, mesh)
    for layout in ("sharded", "gathered"):
        gen = steps.sharded_generate(spec.with_section("rollout", decode_weights=layout), mesh, n)
        rollout = steps.to_host(gen(params, table, rng))
        out[f"decode_{layout}/tokens"], out[f"decode_{layout}/logprobs"] = rollout.tokens_bl, rollout.sample_logp_br
        text = gen.lower(params, table, rng).compile().as_text()
        out[f"decode_{layout}/gathered_in_decode_loops"] = np.asarray(hlo_cost.all_gather_bytes_in_decode_loops(text))
    return out


def init_check(out: str) -> None:
    """`init_sharded_train_state` from host params equals `init_train_state`, laid out as `state_shardings`."""
    spec, _ = scenario.initial_state()
    params = qwen3.init_params(spec.model, jax.random.PRNGKey(scenario.SEED))
    mesh = parallel.make_mesh(2, 2, 2)
    sharded = steps.init_sharded_train_state(spec, mesh, params, scenario.SEED)
    target = steps.state_shardings(spec, mesh)
    same = jax.tree.leaves(jax.tree.map(lambda x, s: x.sharding.is_equivalent_to(s, x.ndim), sharded, target))
    res = {"shardings_match": np.asarray(all(same))}
    res.update({f"sharded{k}": v for k, v in scenario.flatten(steps.to_host(sharded)).items()})
    res.update({f"host{k}": v for k, v in scenario.flatten(init_train_state(spec, params, scenario.SEED)).items()})
    np.savez(os.path.join(out, "init.npz"), **res)


def checkpoint_check(out: str, states: dict) -> None:
    spec, saved = states["2x2x2"]
    ckpt = Checkpointer(os.path.join(out, "ckpt"), async_save=False)
    ckpt.save(2, saved)
    ckpt.wait()
    res = {}
    abstract = steps.abstract_train_state(spec)
    for name, (d, f, t) in {"1x2x4": (1, 2, 4), "8x1x1": (8, 1, 1), "single": (1, 1, 1)}.items():
        mesh = parallel.make_mesh(d, f, t, devices=jax.devices()[: d * f * t])
        target = steps.state_shardings(spec, mesh)
        restored = ckpt.restore(parallel.with_shardings(abstract, target))
        same = jax.tree.leaves(jax.tree.map(lambda x, s: x.sharding.is_equivalent_to(s, x.ndim), restored, target))
        res[f"{name}_shardings_match"] = np.asarray(all(same))
        for k, x in scenario.flatten(steps.to_host(restored)).items():
            res[f"{name}{k}"] = x
    ckpt.close()
    for k, x in scenario.flatten(steps.to_host(saved)).items():
        res[f"saved{k}"] = x
    np.savez(os.path.join(out, "checkpoint.npz"), **res)


def stage(name: str) -> None:
    """A line on stderr as each part starts, so that a worker XLA aborts says where it was."""
    print(f"== {name}", file=sys.stderr, flush=True)


def main(out: str) -> None:
    assert jax.device_count() == 8, jax.devices()
    t0 = time.perf_counter()
    stage("logprobs")
    logprob_check(out)
    t1 = time.perf_counter()
    stage("host loop")
    host_loop_run(out)
    stage("init")
    init_check(out)
    t2 = time.perf_counter()
    stage("train")
    states = train_runs(out)
    t3 = time.perf_counter()
    stage("checkpoint")
    checkpoint_check(out, states)
    t4 = time.perf_counter()
    print(f"logprobs {t1 - t0:.1f}s host loop + init {t2 - t1:.1f}s train {t3 - t2:.1f}s checkpoint {t4 - t3:.1f}s",
          file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
