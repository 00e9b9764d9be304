"""The sharding context on one device: activation constraints change nothing numerically,
nothing is constrained outside a context, and the log-prob dispatcher falls back to the
plain kernel when there is no tensor axis."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax import parallel
from pipo_jax.kernels import logprobs as kernel
from pipo_jax.kernels import logprobs_sharded
from pipo_jax.models import qwen3
from pipo_jax.run import sharded_steps
from pipo_jax.sampling import decode


def test_constraints_only_inside_a_context():
    x = jnp.ones((2, 3, 4))
    assert parallel.active_context() is None and parallel.constrain(x, ("batch", "length", "hidden")) is x
    mesh = parallel.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    with parallel.sharding_context(mesh) as ctx:
        assert parallel.active_context() is ctx
        assert parallel.constrain(x, ("batch", "length", "hidden")) is not x
        jaxpr = str(jax.make_jaxpr(lambda y: parallel.constrain(y, ("batch", "length", "hidden")))(x))
    assert "sharding_constraint" in jaxpr
    assert parallel.active_context() is None


def test_forward_under_context_is_unchanged(monkeypatch):
    cfg = qwen3.preset("tiny", layer_loop="scan")
    params = qwen3.init_params(cfg, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 5), 0, cfg.vocab_size)
    mask = jnp.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    fwd = lambda p, t, m: qwen3.forward(cfg, p, t, m)[0]  # noqa: E731
    plain = jax.jit(fwd)(params, tokens, mask)
    calls = []

    def record(x, axes):
        calls.append((x.shape, axes))
        return x

    with monkeypatch.context() as m:
        m.setattr(qwen3, "constrain", record)  # the model's call to `parallel.constrain`
        jax.make_jaxpr(lambda *a: fwd(*a))(params, tokens, mask)  # a new function: no cached trace
    # the embedding output, the block output (traced once: the layers are a scan), the final norm
    assert calls == [((2, 5, cfg.hidden_size), ("batch", "length", "hidden"))] * 3
    mesh = parallel.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    with parallel.sharding_context(mesh):
        constrained = jax.jit(fwd)(params, tokens, mask)  # the context's mesh forces a fresh trace
        jaxpr = str(jax.make_jaxpr(lambda *a: fwd(*a))(params, tokens, mask))
    assert jaxpr.count("sharding_constraint") == 3  # the same three sites, constrained by the context
    np.testing.assert_array_equal(constrained, plain)
    calls.clear()
    jax.make_jaxpr(lambda *a: fwd(*a))(params, tokens, mask)
    assert calls == []  # the recorder is gone after the block


def test_logprob_dispatch_without_tensor_axis_is_the_kernel():
    rng = np.random.RandomState(0)
    h = jnp.asarray(rng.randn(6, 8), jnp.float32)
    w = jnp.asarray(rng.randn(8, 16), jnp.float32)
    t = jnp.asarray(rng.randint(0, 16, 6))
    cfg = kernel.kernel_config(impl="reference")
    ref = kernel.token_logprobs(h, w, t, cfg)
    np.testing.assert_array_equal(logprobs_sharded.token_logprobs(h, w, t, cfg), ref)
    with parallel.sharding_context(parallel.make_mesh(1, 1, 1, devices=jax.devices()[:1])):
        np.testing.assert_array_equal(logprobs_sharded.token_logprobs(h, w, t, cfg), ref)


def test_placed_state_can_be_donated_without_deleting_the_source():
    x = jnp.arange(6.0).reshape(2, 3)
    mesh = parallel.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    y = sharded_steps.place(x, parallel.replicated(mesh))
    jax.jit(lambda a: a + 1, donate_argnums=0)(y)
    assert y.is_deleted() and not x.is_deleted()
    np.testing.assert_array_equal(x, np.arange(6.0).reshape(2, 3))


def test_kv_cache_constraint_only_inside_a_context():
    cache = qwen3.init_cache(qwen3.preset("tiny"), 2, 8)
    assert all(a is b for a, b in zip(decode.constrain_cache(cache), cache))
    with parallel.sharding_context(parallel.make_mesh(1, 1, 1, devices=jax.devices()[:1])):
        jaxpr = str(jax.make_jaxpr(decode.constrain_cache)(cache))
    assert jaxpr.count("sharding_constraint") >= 1
