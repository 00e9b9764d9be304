"""Building and switching the CPU FFI kernels (`kernels.cpu_ffi`), and the decode path through them."""

import dataclasses
import logging
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.kernels import cpu_ffi
from pipo_jax.models import qwen3
from pipo_jax.sampling import decode, sampler
from pipo_jax.sampling.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(not cpu_ffi.available(),
                                reason="the CPU kernels need a single-device CPU and a compiler")


def test_switch_off_and_failed_build(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("PIPO_JAX_CPU_KERNELS", "0")
    assert cpu_ffi.available.__wrapped__() is False
    monkeypatch.delenv("PIPO_JAX_CPU_KERNELS")
    monkeypatch.setenv("PIPO_JAX_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    with caplog.at_level(logging.WARNING, logger=cpu_ffi.__name__):
        assert cpu_ffi.build() is None
    assert "building the library failed" in caplog.text
    assert list(tmp_path.iterdir()) == []  # no half-written library left behind


def test_sources_ship_with_the_package():
    setup_py = (Path(__file__).parents[2] / "setup.py").read_text()
    for path in (*cpu_ffi.SOURCES, *cpu_ffi.HEADERS):
        assert path.exists() and f'"{path.name}"' in setup_py, path.name


def test_build_is_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPO_JAX_CACHE", str(tmp_path))
    first = cpu_ffi.build()
    assert first is not None and first.parent == tmp_path
    mtime = first.stat().st_mtime_ns
    assert cpu_ffi.build() == first and first.stat().st_mtime_ns == mtime


CONFIG = qwen3.Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10_000.0,
                           max_position_embeddings=256, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def params():
    return qwen3.init_params(CONFIG, jax.random.key(1))


def test_prepare_weights_picks_the_kernels_here(params):
    assert decode.prepare_weights(CONFIG, params).cpu_kernels is True
    assert decode.prepare_weights(CONFIG, params, cpu_kernels=False).cpu_kernels is False
    bf16 = dataclasses.replace(CONFIG, dtype="bfloat16")
    assert decode.prepare_weights(bf16, params).cpu_kernels is False


def _kernel_calls(weights, batch, cache_dtype=None):
    """(cpu_gemv calls, cpu_attention calls) in one decode step's jaxpr."""
    tokens = jnp.zeros((batch,), jnp.int32)
    jaxpr = str(jax.make_jaxpr(lambda w, c: decode.decode_step(CONFIG, w, c, tokens, tokens))(
        weights, decode.init_cache(CONFIG, batch, 16, cache_dtype)))
    return jaxpr.count("pipo_cpu_gemv_f32"), jaxpr.count("pipo_cpu_decode_attention_f32")


def test_decode_step_routes_through_the_kernels(params):
    fast = decode.prepare_weights(CONFIG, params, cpu_kernels=True)
    plain = decode.prepare_weights(CONFIG, params, cpu_kernels=False)
    layers = CONFIG.num_hidden_layers
    assert _kernel_calls(fast, 3) == (4 * layers + 1, layers)  # qkv, o, gate_up, down per layer + head
    assert _kernel_calls(fast, decode.KERNEL_MAX_ROWS) == (4 * layers + 1, layers)
    assert _kernel_calls(fast, decode.KERNEL_MAX_ROWS + 1) == (0, layers)  # XLA's GEMM above
    assert _kernel_calls(fast, 3, jnp.bfloat16) == (4 * layers + 1, 0)  # a bf16 cache: XLA's attention
    assert _kernel_calls(plain, 3) == (0, 0)


@pytest.mark.parametrize("batch", [3, 12, decode.KERNEL_MAX_ROWS + 2])
def test_decode_step_with_kernels_equals_xla(params, batch):
    fast = decode.prepare_weights(CONFIG, params, cpu_kernels=True)
    plain = decode.prepare_weights(CONFIG, params, cpu_kernels=False)
    tokens = jnp.asarray(np.random.RandomState(batch).randint(1, 300, (batch, 9)), jnp.int32)
    mask = jnp.ones_like(tokens).at[0, :4].set(0)  # row 0 is 4 tokens shorter
    step = jax.jit(decode.decode_step, static_argnums=0)
    results = []
    for w in (fast, plain):
        _, lengths, cache = decode.prefill(CONFIG, w, tokens, mask, 16)
        logits, cache = step(CONFIG, w, cache, tokens[:, -1], lengths)
        logits2, _ = step(CONFIG, w, cache, tokens[:, -2], lengths + 1)
        results.append(np.asarray(jnp.stack([logits, logits2])))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-5)


def test_generate_with_kernel_equals_xla(params):
    tokens = jnp.asarray(np.random.RandomState(1).randint(1, 300, (2, 6)), jnp.int32)
    mask = jnp.ones_like(tokens)
    outs = [sampler.generate(CONFIG, decode.prepare_weights(CONFIG, params, cpu_kernels=g), tokens, mask,
                             jax.random.key(0), SamplingParams(temperature=0.0, max_new_tokens=12))
            for g in (True, False)]
    np.testing.assert_array_equal(np.asarray(outs[0].tokens_br), np.asarray(outs[1].tokens_br))
    np.testing.assert_allclose(np.asarray(outs[0].logprobs_br), np.asarray(outs[1].logprobs_br), atol=1e-5)
