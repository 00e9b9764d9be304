"""`cpu_gemv` (FFI few-row matmul) against float64 numpy and XLA, and the decode path through it."""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.kernels import cpu_gemv
from pipo_jax.models import qwen3
from pipo_jax.sampling import decode, sampler
from pipo_jax.sampling.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(not cpu_gemv.available(), reason="cpu_gemv needs a single-device CPU and a compiler")


def _operands(lead, k, n, seed=0):
    rs = np.random.RandomState(seed)
    return rs.randn(*lead, k).astype(np.float32), rs.randn(n, k).astype(np.float32)


def _assert_matmul(y, x, w):
    """`y == x @ w.T` up to fp32 rounding: |error| <= 1e-5 * (|x| @ |w|.T) (+ tiny)."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    exact = x64 @ w64.T
    bound = 1e-5 * (np.abs(x64) @ np.abs(w64).T) + 1e-30
    assert y.shape == exact.shape and y.dtype == np.float32
    assert np.all(np.abs(np.asarray(y, np.float64) - exact) <= bound), np.max(np.abs(y - exact) / bound)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9])
@pytest.mark.parametrize("k,n", [(1, 1), (15, 7), (16, 64), (17, 33), (300, 1000), (512, 1024)])
def test_gemv_equals_float64_product(rows, k, n):
    # (300, 1000) and (512, 1024) are above the size split over threads; K = 15 / 17 /
    # 300 exercise the scalar tail after the 16-wide loop.
    x, w = _operands((rows,), k, n, seed=rows * 1000 + k)
    _assert_matmul(np.asarray(jax.jit(cpu_gemv.gemv)(x, w)), x, w)


def test_gemv_leading_axes_and_reference():
    x, w = _operands((2, 3), 40, 24)
    y = np.asarray(cpu_gemv.gemv(jnp.asarray(x), jnp.asarray(w)))
    _assert_matmul(y.reshape(6, 24), x.reshape(6, 40), w)
    np.testing.assert_allclose(y, np.asarray(cpu_gemv.gemv_reference(x, w)), rtol=1e-5, atol=1e-5)


def test_gemv_inside_while_loop_and_vmap():
    x, w = _operands((1,), 64, 64, seed=3)
    w = w / 8.0

    def steps(f, x):
        return jax.lax.fori_loop(0, 5, lambda i, v: jnp.tanh(f(v, w)), x)

    got = jax.jit(lambda v: steps(cpu_gemv.gemv, v))(x)
    want = jax.jit(lambda v: steps(cpu_gemv.gemv_reference, v))(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    ws = np.stack([w, 2 * w])
    got = jax.vmap(cpu_gemv.gemv)(jnp.stack([x, x]), ws)
    np.testing.assert_allclose(np.asarray(got), np.stack([x @ w.T, x @ (2 * w).T]), rtol=1e-5, atol=1e-5)


def test_gemv_is_deterministic():
    x, w = _operands((3,), 512, 2048, seed=5)  # split over threads
    f = jax.jit(cpu_gemv.gemv)
    first = np.asarray(f(x, w))
    for _ in range(5):
        np.testing.assert_array_equal(np.asarray(f(x, w)), first)


def test_gemv_rejects_bad_operands():
    x, w = _operands((2,), 8, 4)
    with pytest.raises(TypeError, match="float32"):
        cpu_gemv.gemv(jnp.asarray(x, jnp.bfloat16), w)
    with pytest.raises(ValueError, match=r"\[N, K\]"):
        cpu_gemv.gemv(x, w.T)


def test_switch_off_and_failed_build(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("PIPO_JAX_CPU_GEMV", "0")
    assert cpu_gemv.available.__wrapped__() is False
    monkeypatch.delenv("PIPO_JAX_CPU_GEMV")
    monkeypatch.setenv("PIPO_JAX_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    with caplog.at_level(logging.WARNING, logger=cpu_gemv.__name__):
        assert cpu_gemv._build() is None
    assert "building the kernel failed" in caplog.text
    assert list(tmp_path.iterdir()) == []  # no half-written library left behind


def test_build_is_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPO_JAX_CACHE", str(tmp_path))
    first = cpu_gemv._build()
    assert first is not None and first.parent == tmp_path
    mtime = first.stat().st_mtime_ns
    assert cpu_gemv._build() == first and first.stat().st_mtime_ns == mtime


CONFIG = qwen3.Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10_000.0,
                           max_position_embeddings=256, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def params():
    return qwen3.init_params(CONFIG, jax.random.key(1))


def test_prepare_weights_picks_the_kernel_here(params):
    assert decode.prepare_weights(CONFIG, params).use_gemv is True
    assert decode.prepare_weights(CONFIG, params, use_gemv=False).use_gemv is False
    bf16 = dataclasses.replace(CONFIG, dtype="bfloat16")
    assert decode.prepare_weights(bf16, params).use_gemv is False


def test_decode_step_with_kernel_equals_xla(params):
    fast = decode.prepare_weights(CONFIG, params, use_gemv=True)
    plain = decode.prepare_weights(CONFIG, params, use_gemv=False)
    tokens = jnp.asarray(np.random.RandomState(0).randint(1, 300, (3, 9)), jnp.int32)
    mask = jnp.ones_like(tokens).at[0, :4].set(0)
    step = jax.jit(decode.decode_step, static_argnums=0)
    for w, calls in ((fast, 4 * CONFIG.num_hidden_layers + 1), (plain, 0)):  # qkv, o, gate_up, down; head
        jaxpr = jax.make_jaxpr(lambda w, c: decode.decode_step(CONFIG, w, c, tokens[:, 0], tokens[:, 0]))(
            w, decode.init_cache(CONFIG, 3, 16))
        assert str(jaxpr).count("ffi_call") == calls
    results = []
    for w in (fast, plain):
        _, lengths, cache = decode.prefill(CONFIG, w, tokens, mask, 16)
        logits, _ = step(CONFIG, w, cache, tokens[:, -1], lengths)
        results.append(np.asarray(logits))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-5)


def test_generate_with_kernel_equals_xla(params):
    tokens = jnp.asarray(np.random.RandomState(1).randint(1, 300, (2, 6)), jnp.int32)
    mask = jnp.ones_like(tokens)
    outs = [sampler.generate(CONFIG, decode.prepare_weights(CONFIG, params, use_gemv=g), tokens, mask,
                             jax.random.key(0), SamplingParams(temperature=0.0, max_new_tokens=12))
            for g in (True, False)]
    np.testing.assert_array_equal(np.asarray(outs[0].tokens_br), np.asarray(outs[1].tokens_br))
    np.testing.assert_allclose(np.asarray(outs[0].logprobs_br), np.asarray(outs[1].logprobs_br), atol=1e-5)
