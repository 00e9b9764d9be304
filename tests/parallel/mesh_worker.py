"""Subprocess body of the 8-simulated-device tests (run: python -m tests.parallel.mesh_worker OUT_DIR).

XLA_FLAGS must give 8 host devices before JAX is imported, so this runs in its own
process. For each mesh it places the scenario's state, runs the sharded scan chunk and
writes the run summary; then the vocab-parallel log-prob against the plain kernel
(values and gradients), the sharded sampler, and a checkpoint saved on one mesh and
restored on others. Everything is written to OUT_DIR as .npz files for the test to check.
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pipo_jax import parallel  # noqa: E402
from pipo_jax.kernels import logprobs as kernel  # noqa: E402
from pipo_jax.parallel import steps  # noqa: E402
from pipo_jax.rl import logprobs as rl_logprobs  # noqa: E402
from pipo_jax.rl.checkpoint import Checkpointer  # noqa: E402
from tests.parallel import scenario  # noqa: E402

# (data, fsdp, tensor, use the vocab-parallel log-prob hook in the trainer)
MESHES = {"8x1x1": (8, 1, 1, False), "2x2x2": (2, 2, 2, False), "1x2x4": (1, 2, 4, False)}


def train_runs(out: str) -> dict:
    states = {}
    for name, (d, f, t, hook) in MESHES.items():
        spec, state = scenario.initial_state()
        mesh = parallel.make_mesh(d, f, t)
        # The trainer's hook point (see the report): rl.logprobs looks up `token_logprobs`
        # at call time, so swapping the module attribute routes it through the
        # vocab-parallel dispatcher.
        rl_logprobs.token_logprobs = parallel.token_logprobs if hook else kernel.token_logprobs
        sharded = steps.shard_train_state(state, spec, mesh)
        new_state, metrics = steps.sharded_scan_chunk(spec, mesh, scenario.ITERATIONS)(sharded)
        summary = scenario.run_summary(steps.to_host(new_state), steps.to_host(metrics))
        summary["param_spec/embed"] = np.asarray(str(new_state.params["embed"].sharding.spec))
        summary["param_spec/q_proj"] = np.asarray(str(new_state.params["layers"]["q_proj"].sharding.spec))
        summary["opt_spec/mu_embed"] = np.asarray(str(new_state.opt_state[1].inner_state[0].mu["embed"].sharding.spec))
        summary["stored_tokens_spec"] = np.asarray(str(new_state.pipo.prev.tokens_bt.sharding.spec))
        np.savez(os.path.join(out, f"train_{name}.npz"), **summary)
        states[name] = (spec, new_state)
    rl_logprobs.token_logprobs = kernel.token_logprobs
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

    def objective(fn):
        def f(h, w):
            lp, ent = fn(h, w, tgt, temperature=0.7, return_entropy=True, valid_n=valid)
            return jnp.sum(lp * g_lp) + jnp.sum(ent * g_ent), (lp, ent)
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))

    results = {}
    (_, (lp, ent)), (dh, dw) = objective(lambda *a, **k: kernel.token_logprobs(*a, impl="reference", **k))(h, w)
    results.update(ref_lp=lp, ref_ent=ent, ref_dh=dh, ref_dw=dw)
    for name, (dd, f, t) in {"1x2x4": (1, 2, 4), "2x2x2": (2, 2, 2), "2x1x4_chunked": (2, 1, 4)}.items():
        mesh = parallel.make_mesh(dd, f, t)
        impl = "chunked" if name.endswith("chunked") else "reference"
        fn = lambda *a, mesh=mesh, impl=impl, **k: parallel.token_logprobs_tensor_parallel(  # noqa: E731
            *a, mesh=mesh, impl=impl, block_n=8, block_v=8, **k) if impl == "chunked" else \
            parallel.token_logprobs_tensor_parallel(*a, mesh=mesh, impl=impl, **k)
        (_, (lp, ent)), (dh, dw) = objective(fn)(h, w)
        results.update({f"{name}_lp": lp, f"{name}_ent": ent, f"{name}_dh": dh, f"{name}_dw": dw})
        # The compiled program must not hold any [N, V] (or gathered [D, V]) f32 buffer.
        hlo = objective(fn).lower(h, w).compile().as_text()
        results[f"{name}_has_full_logits"] = np.asarray(f"f32[{n},{v}]" in hlo or f"f32[{n // dd // f},{v}]" in hlo)
        results[f"{name}_has_full_head"] = np.asarray(f"f32[{d},{v}]" in hlo)
    np.savez(os.path.join(out, "logprobs.npz"), **{k: np.asarray(x) for k, x in results.items()})


def sampler_check(out: str) -> None:
    spec, state = scenario.initial_state()
    key = jax.random.PRNGKey(7)
    res = {}
    for name, (d, f, t) in {"single": (1, 1, 1), "2x2x2": (2, 2, 2), "1x2x4": (1, 2, 4)}.items():
        mesh = parallel.make_mesh(d, f, t, devices=jax.devices()[: d * f * t])
        params = steps.place_tree(state.params, steps.state_shardings(spec, mesh).params)
        rollout = steps.sharded_generate(spec, mesh, spec.prompts)(params, key)
        res[f"{name}_tokens"] = np.asarray(rollout.tokens_bl)
        res[f"{name}_logp"] = np.asarray(rollout.sample_logp_br)
        res[f"{name}_tokens_spec"] = np.asarray(str(rollout.tokens_bl.sharding.spec))
    np.savez(os.path.join(out, "sampler.npz"), **res)


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


def main(out: str) -> None:
    assert jax.device_count() == 8, jax.devices()
    states = train_runs(out)
    checkpoint_check(out, states)
    logprob_check(out)
    sampler_check(out)


if __name__ == "__main__":
    main(sys.argv[1])
