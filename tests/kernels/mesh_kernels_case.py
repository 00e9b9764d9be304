"""Run as a script with XLA_FLAGS=--xla_force_host_platform_device_count=4 (see
test_target_platform.py): the kernels that XLA cannot partition (Pallas log-prob, splash
attention) on meshes with tensor = 1 and tensor = 2, and the sampler's KV cache sharding.
Prints one "<name> ok" line per check; exits non-zero on a mismatch."""
from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax import parallel
from pipo_jax.kernels import logprobs as kernel
from pipo_jax.kernels import logprobs_sharded
from pipo_jax.models import qwen3
from pipo_jax.sampling import decode

N, D, V = 32, 128, 512


def _logprob_inputs():
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    h = jax.random.normal(k[0], (N, D))
    w = jax.random.normal(k[1], (D, V)) * 0.3
    t = jax.random.randint(k[2], (N,), 0, V)
    return h, w, t, jnp.arange(N) % 5 != 2, jax.random.normal(k[3], (N,))


def _logprob_grads(fn, h, w, t, valid, g):
    loss = lambda h, w: jnp.sum(g * fn(h, w, t, valid_n=valid))  # noqa: E731
    return [np.asarray(x) for x in jax.jit(jax.value_and_grad(loss, (0, 1)))(h, w)[1]]


def check_pallas_logprobs(mesh, name):
    h, w, t, valid, g = _logprob_inputs()
    want = _logprob_grads(functools.partial(kernel.token_logprobs, cfg=kernel.kernel_config(impl="reference")),
                          h, w, t, valid, g)
    with parallel.sharding_context(mesh):
        pallas = kernel.kernel_config(impl="pallas", block_n=8, block_v=128)
        got = _logprob_grads(functools.partial(logprobs_sharded.token_logprobs, cfg=pallas), h, w, t, valid, g)
        # The same call built for a TPU: Mosaic kernels inside shard_map, no interpreter.
        args = [jax.ShapeDtypeStruct(x.shape, jnp.bfloat16 if x.dtype == jnp.float32 else x.dtype) for x in (h, w, t)]
        lowered = jax.jit(jax.grad(lambda h, w, t: jnp.sum(logprobs_sharded.token_logprobs(
            h, w, t, kernel.kernel_config(impl="pallas", platform="tpu"))), (0, 1))).trace(*args).lower(
            lowering_platforms=("tpu",))
        text = lowered.as_text()
    for a, b in zip(got, want):
        # fp32 sums over 512 columns in other orders (~1e-6 relative).
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)
    assert text.count("tpu_custom_call") == 3 and "manual_computation" in text, text[:2000]
    print(f"pallas_logprobs_{name} ok")


def check_splash_forward(mesh, name):
    config = qwen3.preset("tiny")
    params = qwen3.init_params(config, jax.random.PRNGKey(0), std=0.1)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (4, 12), 0, config.vocab_size)
    mask = jnp.array([[0] * 4 + [1] * 8, [1] * 12, [1] * 7 + [0] * 5, [0, 0] + [1] * 10], jnp.int32)
    want = np.asarray(qwen3.logits(config, params, tokens, mask))
    splash = config.replace(attention_impl="splash")
    with parallel.sharding_context(mesh):
        got = np.asarray(jax.jit(qwen3.logits, static_argnums=0)(splash, params, tokens, mask))
        tpu = config.replace(platform="tpu", dtype="bfloat16")
        text = jax.jit(qwen3.logits, static_argnums=0).trace(tpu, params, tokens, mask).lower(
            lowering_platforms=("tpu",)).as_text()
    valid = np.asarray(mask, bool)
    # 2-layer fp32 logits; attention sums in another order (~1e-7) amplified by the head.
    np.testing.assert_allclose(got[valid], want[valid], atol=5e-5)
    assert text.count("tpu_custom_call") == 1 and "manual_computation" in text
    print(f"splash_forward_{name} ok")


def check_kv_cache_sharded(mesh, name):
    config = qwen3.preset("tiny")
    params = qwen3.init_params(config, jax.random.PRNGKey(0), std=0.1)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (4, 8), 0, config.vocab_size)
    mask = jnp.ones((4, 8), jnp.int32)
    with parallel.sharding_context(mesh):
        _, _, cache = jax.jit(decode.prefill, static_argnums=(0, 4))(config, params, tokens, mask, 16)
    want = parallel.tree_shardings(cache, qwen3.KVCache(decode.KV_CACHE_AXES, decode.KV_CACHE_AXES), mesh).k
    assert want.spec[1] is not None and cache.k.sharding.is_equivalent_to(want, cache.k.ndim), (cache.k.sharding, want)
    print(f"kv_cache_{name} ok")


def main() -> int:
    assert len(jax.devices()) == 4, jax.devices()
    meshes = {"fsdp4_tensor1": parallel.make_mesh(data=1, fsdp=4, tensor=1),
              "fsdp2_tensor2": parallel.make_mesh(data=1, fsdp=2, tensor=2)}
    for name, mesh in meshes.items():
        check_pallas_logprobs(mesh, name)
        check_splash_forward(mesh, name)
        check_kv_cache_sharded(mesh, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
