"""The fast cached decode path equals the plain `qwen3.forward` (with and without cache)."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.models import qwen3
from pipo_jax.sampling import decode
from pipo_jax.sampling.sampler import attention_lengths
from tests import jitted

CONFIG = qwen3.preset("tiny")


@pytest.fixture(scope="module")
def params():
    return qwen3.init_params(CONFIG, jax.random.PRNGKey(0), std=0.1)


@pytest.fixture(scope="module")
def batch():
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 8), 0, CONFIG.vocab_size)
    mask = jnp.array([[0, 0, 0, 1, 1, 1, 1, 1], [1] * 8, [1, 1, 0, 0, 0, 0, 0, 0]])  # left, full, right
    return tokens, mask


def test_resize_cache_pads_and_drops_slots():
    kv = qwen3.KVCache(jax.random.normal(jax.random.key(0), (2, 3, 2, 5, 4)),  # [L, B, K, S, Dh]
                       jax.random.normal(jax.random.key(1), (2, 3, 2, 5, 4)))
    grown = decode.resize_cache(kv, 8)
    np.testing.assert_array_equal(grown.k[:, :, :, :5], kv.k)
    assert grown.max_len == 8 and float(jnp.abs(grown.v[:, :, :, 5:]).max()) == 0.0
    np.testing.assert_array_equal(decode.resize_cache(kv, 2).v, kv.v[:, :, :, :2])


def _equations(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _equations(sub)


@pytest.mark.parametrize("layer_loop, rows", [("scan", 2), ("unroll", 2), ("unroll", 1), ("unroll", 3)])
def test_decode_step_reads_weights_without_relayout(params, layer_loop, rows, monkeypatch):
    """No re-layout of the weights in a decode step; with `scan` the layers run as one loop
    over the stored stack, with `unroll` over the per-layer weights `compute_params` sliced
    once per call (and, for one row, stacked as column blocks, of 8 KiB here; from 3 rows
    here, transposed, whatever their size; the step itself slices nothing)."""
    monkeypatch.setattr(decode, "STACK_BLOCK_BYTES", 2**13)
    monkeypatch.setattr(decode, "TRANSPOSED_MIN_ROWS", 3)
    monkeypatch.setattr(decode, "TRANSPOSED_MIN_BYTES", 0)
    config = CONFIG.replace(layer_loop=layer_loop)
    weights = decode.compute_params(config, params, rows=rows)
    if layer_loop == "unroll" and rows == 1:
        assert isinstance(weights["layers"][0]["qkv_proj"], qwen3.ColumnStack)
    o_proj = weights["layers"][0]["o_proj"] if layer_loop == "unroll" else weights["layers"]["o_proj"]
    assert isinstance(o_proj, qwen3.TransposedWeight) is (rows == 3 and layer_loop == "unroll")
    cache = decode.init_cache(config, rows, 8)
    closed = jax.make_jaxpr(decode.decode_step, static_argnums=0)(
        config, weights, cache, jnp.zeros((rows,), jnp.int32), jnp.zeros((rows,), jnp.int32))
    eqns = list(_equations(closed.jaxpr))
    scans = [e for e in eqns if e.primitive.name == "scan"]
    if layer_loop == "scan":
        assert all(a is b for a, b in zip(jax.tree.leaves(weights["layers"]), jax.tree.leaves(params["layers"])))
        assert len(scans) == 1 and scans[0].params["length"] == CONFIG.num_hidden_layers
    else:
        assert isinstance(weights["layers"], tuple) and len(weights["layers"]) == CONFIG.num_hidden_layers
        assert not scans
    # The smallest weight matrix has D * H * Dh = 4096 entries; the step's activations,
    # scores and cache slices (2 rows, 8 slots) are all smaller, so a transpose / concat /
    # copy / slice this large would be a re-laid-out weight.
    smallest_weight = CONFIG.hidden_size * CONFIG.num_attention_heads * CONFIG.head_dim
    relayouts = [e for e in eqns if e.primitive.name in ("transpose", "concatenate", "copy", "copy_p", "slice")
                 and any(np.prod(v.aval.shape) >= smallest_weight for v in e.outvars)]
    assert not relayouts, relayouts


def test_prefill_last_logits_equal_full_forward(params, batch):
    tokens, mask = batch
    logits, lengths, cache = decode.prefill(CONFIG, params, tokens, mask, cache_len=12)
    full = jitted.logits(CONFIG, params, tokens, mask)
    last = jnp.array([7, 7, 1])
    np.testing.assert_allclose(logits, full[jnp.arange(3), last], atol=1e-5)
    np.testing.assert_array_equal(lengths, [5, 8, 2])
    assert cache.k.shape == (CONFIG.num_hidden_layers, 3, CONFIG.num_key_value_heads, 12, CONFIG.head_dim)
    # The plain cached forward fills the same slots with the same keys/values.
    ref = jitted.forward(CONFIG, params, tokens, mask, cache=qwen3.init_cache(CONFIG, 3, 12))[1]
    np.testing.assert_allclose(cache.k, ref.k, atol=1e-5)
    np.testing.assert_allclose(cache.v, ref.v, atol=1e-5)


def test_decode_steps_equal_plain_cached_forward_and_full_forward(params, batch):
    tokens, mask = batch
    _, lengths, cache = decode.prefill(CONFIG, params, tokens, mask, cache_len=10)
    ref_cache = decode.resize_cache(cache, 16)
    step = jax.jit(decode.decode_step, static_argnums=0)
    plain = jax.jit(qwen3.forward, static_argnums=0)
    nxt = jax.random.randint(jax.random.PRNGKey(2), (3, 4), 0, CONFIG.vocab_size)
    fast_logits = []
    for t in range(4):
        if t == 2:  # positions reach 10 at t=2: widen the cache, as the samplers do
            cache = decode.resize_cache(cache, 16)
        pos = lengths + t
        logits, cache = step(CONFIG, params, cache, nxt[:, t], pos)
        ref, ref_cache = plain(CONFIG, params, nxt[:, t : t + 1], None, pos[:, None], ref_cache)
        np.testing.assert_allclose(logits, ref[:, 0], atol=1e-5)
        fast_logits.append(logits)
    np.testing.assert_allclose(cache.k, ref_cache.k, atol=1e-5)
    # Each row's decode logits equal an uncached forward of prompt ++ new tokens.
    full = jax.jit(qwen3.logits, static_argnums=0)(
        CONFIG, params, jnp.concatenate([tokens, nxt], 1), jnp.concatenate([mask, jnp.ones_like(nxt)], 1))
    np.testing.assert_allclose(jnp.stack(fast_logits, axis=1), full[:, -4:], atol=1e-5)


def test_idle_rows_write_nothing(params, batch):
    tokens, mask = batch
    _, lengths, cache = decode.prefill(CONFIG, params, tokens, mask, cache_len=10)
    before = cache
    pos = jnp.array([5, 10, 2])  # row 1 idle (position == width)
    _, after = decode.decode_step(CONFIG, params, cache, tokens[:, 0], pos)
    np.testing.assert_array_equal(after.k[:, 1], before.k[:, 1])
    np.testing.assert_array_equal(after.v[:, 1], before.v[:, 1])
    assert not np.array_equal(after.k[:, 0, 5], before.k[:, 0, 5])


def test_bf16_cache_is_close(params, batch):
    tokens, mask = batch
    _, lengths, c32 = decode.prefill(CONFIG, params, tokens, mask, 12)
    _, _, c16 = decode.prefill(CONFIG, params, tokens, mask, 12, cache_dtype=jnp.bfloat16)
    assert c16.k.dtype == jnp.bfloat16
    a, _ = decode.decode_step(CONFIG, params, c32, tokens[:, 0], lengths)
    b, _ = decode.decode_step(CONFIG, params, c16, tokens[:, 0], lengths)
    np.testing.assert_allclose(a, b, atol=2e-2)


@pytest.mark.parametrize("layer_loop", ["scan", "unroll"])
def test_bf16_compute_decode_runs_on_cpu_and_is_close_to_fp32(params, batch, layer_loop):
    """bf16 weights and cache (`model.dtype=bfloat16`): the attention's bf16 x bf16 -> f32
    matmuls over the head-major cache run on XLA:CPU, and the decode logits stay within bf16
    rounding of the fp32 full forward."""
    tokens, mask = batch
    config = CONFIG.replace(dtype="bfloat16", layer_loop=layer_loop)
    weights = decode.compute_params(config, params)
    _, lengths, cache = decode.prefill(config, weights, tokens, mask, 12)
    assert cache.k.dtype == jnp.bfloat16
    nxt = jax.random.randint(jax.random.PRNGKey(3), (3, 2), 0, CONFIG.vocab_size)
    logits = []
    for t in range(2):
        out, cache = decode.decode_step(config, weights, cache, nxt[:, t], lengths + t)
        logits.append(out)
    full = jitted.logits(CONFIG, params, jnp.concatenate([tokens, nxt], 1), jnp.concatenate([mask, jnp.ones_like(nxt)], 1))
    np.testing.assert_allclose(jnp.stack(logits, axis=1), full[:, -2:], atol=5e-2)


def test_attention_length_ladder():
    assert attention_lengths(1, 1000, 128) == (128, 256, 512, 1000)
    assert attention_lengths(200, 1000, 128) == (256, 512, 1000)
    assert attention_lengths(33, 95, 128) == (95,)
    assert attention_lengths(1, 1024, 256) == (256, 512, 1024)
    with pytest.raises(ValueError, match="block"):
        attention_lengths(1, 10, 0)
