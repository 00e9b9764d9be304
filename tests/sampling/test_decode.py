"""The fast cached decode path equals the plain `qwen3.forward` (with and without cache)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.models import qwen3
from pipo_jax.sampling import decode
from pipo_jax.sampling.sampler import attention_lengths

CONFIG = qwen3.preset("tiny")


@pytest.fixture(scope="module")
def params():
    return qwen3.init_params(CONFIG, jax.random.PRNGKey(0), std=0.1)


@pytest.fixture(scope="module")
def weights(params):
    return jax.jit(decode.prepare_weights, static_argnums=0)(CONFIG, params)


@pytest.fixture(scope="module")
def batch():
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 8), 0, CONFIG.vocab_size)
    mask = jnp.array([[0, 0, 0, 1, 1, 1, 1, 1], [1] * 8, [1, 1, 0, 0, 0, 0, 0, 0]])  # left, full, right
    return tokens, mask


def test_prepare_weights_layout(params, weights):
    c = CONFIG
    assert len(weights.layers) == c.num_hidden_layers
    lw = weights.layers[1]
    hd = c.head_dim
    q = params["layers"]["q_proj"][1].reshape(c.hidden_size, -1)
    v = params["layers"]["v_proj"][1].reshape(c.hidden_size, -1)
    np.testing.assert_array_equal(lw["qkv"][: c.num_attention_heads * hd], q.T)  # [out, in]
    np.testing.assert_array_equal(lw["qkv"][-c.num_key_value_heads * hd :], v.T)
    np.testing.assert_array_equal(lw["gate_up"][c.intermediate_size :], params["layers"]["up_proj"][1].T)
    np.testing.assert_array_equal(weights.lm_head, params["embed"])  # tied preset: [V, D]
    # Every matrix and norm once, plus the head (tied: the embedding is read twice).
    assert decode.weight_bytes(weights) == 4 * c.num_params


def test_cache_layout_conversions_roundtrip():
    kv = qwen3.KVCache(jax.random.normal(jax.random.key(0), (2, 3, 5, 2, 4)),
                       jax.random.normal(jax.random.key(1), (2, 3, 5, 2, 4)))
    cache = decode.from_kv_cache(kv)
    assert cache.k[0].shape == (3, 2, 4, 5) and cache.v[0].shape == (3, 2, 5, 4) and cache.max_len == 5
    np.testing.assert_array_equal(cache.k[1][2, 1, :, 3], kv.k[1, 2, 3, 1])  # layer 1, row 2, head 1, slot 3
    back = decode.to_kv_cache(cache)
    np.testing.assert_array_equal(back.k, kv.k)
    np.testing.assert_array_equal(back.v, kv.v)
    grown = decode.to_kv_cache(decode.resize_cache(cache, 8))
    np.testing.assert_array_equal(grown.k[:, :, :5], kv.k)
    assert float(jnp.abs(grown.v[:, :, 5:]).max()) == 0.0
    np.testing.assert_array_equal(decode.to_kv_cache(decode.resize_cache(cache, 2)).v, kv.v[:, :, :2])


def test_prefill_last_logits_equal_full_forward(params, weights, batch):
    tokens, mask = batch
    logits, lengths, cache = decode.prefill(CONFIG, weights, tokens, mask, cache_len=12)
    full = qwen3.logits(CONFIG, params, tokens, mask)
    last = jnp.array([7, 7, 1])
    np.testing.assert_allclose(logits, full[jnp.arange(3), last], atol=1e-5)
    np.testing.assert_array_equal(lengths, [5, 8, 2])
    assert cache.max_len == 12 and cache.batch == 3
    # The plain cached forward fills the same slots with the same keys/values.
    ref = qwen3.forward(CONFIG, params, tokens, mask, cache=qwen3.init_cache(CONFIG, 3, 12))[1]
    np.testing.assert_allclose(decode.to_kv_cache(cache).k, ref.k, atol=1e-5)
    np.testing.assert_allclose(decode.to_kv_cache(cache).v, ref.v, atol=1e-5)


def test_decode_steps_equal_plain_cached_forward_and_full_forward(params, weights, batch):
    tokens, mask = batch
    _, lengths, cache = decode.prefill(CONFIG, weights, tokens, mask, cache_len=10)
    ref_cache = decode.to_kv_cache(decode.resize_cache(cache, 16))
    step = jax.jit(decode.decode_step, static_argnums=0)
    plain = jax.jit(qwen3.forward, static_argnums=0)
    nxt = jax.random.randint(jax.random.PRNGKey(2), (3, 4), 0, CONFIG.vocab_size)
    fast_logits = []
    for t in range(4):
        if t == 2:  # positions reach 10 at t=2: widen the cache, as the samplers do
            cache = decode.resize_cache(cache, 16)
        pos = lengths + t
        logits, cache = step(CONFIG, weights, cache, nxt[:, t], pos)
        ref, ref_cache = plain(CONFIG, params, nxt[:, t : t + 1], None, pos[:, None], ref_cache)
        np.testing.assert_allclose(logits, ref[:, 0], atol=1e-5)
        fast_logits.append(logits)
    np.testing.assert_allclose(decode.to_kv_cache(cache).k, ref_cache.k, atol=1e-5)
    # Each row's decode logits equal an uncached forward of prompt ++ new tokens.
    full = jax.jit(qwen3.logits, static_argnums=0)(
        CONFIG, params, jnp.concatenate([tokens, nxt], 1), jnp.concatenate([mask, jnp.ones_like(nxt)], 1))
    np.testing.assert_allclose(jnp.stack(fast_logits, axis=1), full[:, -4:], atol=1e-5)


def test_idle_rows_write_nothing(weights, batch):
    tokens, mask = batch
    _, lengths, cache = decode.prefill(CONFIG, weights, tokens, mask, cache_len=10)
    before = decode.to_kv_cache(cache)
    pos = jnp.array([5, 10, 2])  # row 1 idle (position == width)
    _, after = decode.decode_step(CONFIG, weights, cache, tokens[:, 0], pos)
    after = decode.to_kv_cache(after)
    np.testing.assert_array_equal(after.k[:, 1], before.k[:, 1])
    np.testing.assert_array_equal(after.v[:, 1], before.v[:, 1])
    assert not np.array_equal(after.k[:, 0, 5], before.k[:, 0, 5])


def test_bf16_cache_is_close(weights, batch):
    tokens, mask = batch
    _, lengths, c32 = decode.prefill(CONFIG, weights, tokens, mask, 12)
    _, _, c16 = decode.prefill(CONFIG, weights, tokens, mask, 12, cache_dtype=jnp.bfloat16)
    assert c16.k[0].dtype == jnp.bfloat16
    a, _ = decode.decode_step(CONFIG, weights, c32, tokens[:, 0], lengths)
    b, _ = decode.decode_step(CONFIG, weights, c16, tokens[:, 0], lengths)
    np.testing.assert_allclose(a, b, atol=2e-2)


def test_attention_length_ladder():
    assert attention_lengths(1, 1000, 128) == (128, 256, 512, 1000)
    assert attention_lengths(200, 1000, 128) == (256, 512, 1000)
    assert attention_lengths(33, 95, 128) == (95,)
    assert attention_lengths(1, 1024, 256) == (256, 512, 1024)
    with pytest.raises(ValueError, match="block"):
        attention_lengths(1, 10, 0)
