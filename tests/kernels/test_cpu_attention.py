"""`cpu_attention` (FFI one-token decode attention) against float64 numpy and `decode._attend`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.kernels import cpu_attention, cpu_ffi
from pipo_jax.sampling import decode

pytestmark = pytest.mark.skipif(not cpu_ffi.available(),
                                reason="the CPU kernels need a single-device CPU and a compiler")


def _operands(b, k, g, dh, s, seed=0):
    rs = np.random.RandomState(seed)
    return (rs.randn(b, k * g, dh).astype(np.float32), rs.randn(b, k, dh, s).astype(np.float32),
            rs.randn(b, k, s, dh).astype(np.float32))


def _attention64(q, keys, vals, positions):
    """Float64 softmax(q k^T / sqrt(Dh)) v over slots 0..min(position, S-1) per row, [B, H, Dh]."""
    b, h, dh = q.shape
    k, s = keys.shape[1], keys.shape[3]
    out = np.zeros((b, h, dh))
    for r in range(b):
        n = min(positions[r] + 1, s)
        for head in range(h):
            kv = head // (h // k)
            logits = q[r, head].astype(np.float64) @ keys[r, kv, :, :n].astype(np.float64) / np.sqrt(dh)
            p = np.exp(logits - logits.max())
            out[r, head] = (p / p.sum()) @ vals[r, kv, :n].astype(np.float64)
    return out


# (B, K, G, Dh, S): Dh 16 / 20 / 64 / 72 exercise the 32-, 8- and scalar-wide loops over the
# head axis, S = 9 / 37 / 160 those over the slots; G = 1 / 2 / 3 the pairing of query heads.
SHAPES = [(1, 1, 1, 16, 9), (3, 2, 2, 16, 37), (2, 1, 3, 20, 40), (2, 4, 2, 64, 160), (4, 2, 3, 72, 33),
          (32, 4, 2, 64, 70)]


@pytest.mark.parametrize("b,k,g,dh,s", SHAPES)
def test_attention_equals_float64(b, k, g, dh, s):
    q, keys, vals = _operands(b, k, g, dh, s, seed=b * 100 + s)
    positions = np.random.RandomState(s).randint(0, s + 3, size=b).astype(np.int32)  # some >= S: idle rows
    positions[0] = 0  # a single slot
    got = np.asarray(jax.jit(cpu_attention.decode_attention)(q, keys, vals, positions))
    assert got.shape == q.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, _attention64(q, keys, vals, positions), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("b,k,g,dh,s", SHAPES[1:4])
def test_attention_equals_xla_reference(b, k, g, dh, s):
    q, keys, vals = _operands(b, k, g, dh, s, seed=7)
    positions = np.arange(b, dtype=np.int32) * 5 % s
    allowed = jnp.arange(s)[None, None, :] <= positions[:, None, None]
    want = decode._attend(jnp.asarray(q)[:, None], keys, vals, allowed, jnp.float32).reshape(q.shape)
    got = cpu_attention.decode_attention(jnp.asarray(q), keys, vals, jnp.asarray(positions))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_masked_slots_do_not_matter():
    # Slots past a row's position are neither read nor weighted: filling them with huge
    # values (or NaN) leaves the result bit-identical.
    q, keys, vals = _operands(2, 2, 2, 16, 24, seed=3)
    positions = np.array([5, 11], np.int32)
    f = jax.jit(cpu_attention.decode_attention)
    first = np.asarray(f(q, keys, vals, positions))
    keys[0, :, :, 6:] = np.nan
    vals[1, :, 12:] = 1e30
    np.testing.assert_array_equal(np.asarray(f(q, keys, vals, positions)), first)


def test_large_logits_are_stable():
    q, keys, vals = _operands(2, 1, 2, 16, 50, seed=4)
    q *= 40.0  # logits in the hundreds: exp overflows without the max shift
    positions = np.array([49, 20], np.int32)
    got = np.asarray(cpu_attention.decode_attention(q, keys, vals, positions))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, _attention64(q, keys, vals, positions), rtol=2e-5, atol=2e-6)


def test_attention_is_deterministic_and_works_under_vmap_and_loops():
    q, keys, vals = _operands(32, 4, 2, 64, 100, seed=5)  # large enough to split over threads
    positions = jnp.full((32,), 60, jnp.int32)
    f = jax.jit(cpu_attention.decode_attention)
    first = np.asarray(f(q, keys, vals, positions))
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(f(q, keys, vals, positions)), first)
    stacked = jax.vmap(cpu_attention.decode_attention)(jnp.stack([q, 2 * q]), jnp.stack([keys, keys]),
                                                       jnp.stack([vals, vals]), jnp.stack([positions, positions]))
    np.testing.assert_allclose(np.asarray(stacked[0]), first, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(stacked[1]), np.asarray(f(2 * q, keys, vals, positions)), rtol=1e-6)
    looped = jax.jit(lambda q: jax.lax.fori_loop(
        0, 3, lambda i, x: cpu_attention.decode_attention(x, keys, vals, positions - i), q))(q[:, :, :])
    want = q
    for i in range(3):
        want = f(want, keys, vals, positions - i)
    np.testing.assert_allclose(np.asarray(looped), np.asarray(want), rtol=1e-6, atol=1e-7)


def test_attention_rejects_bad_operands():
    q, keys, vals = _operands(2, 2, 2, 8, 5)
    positions = np.zeros(2, np.int32)
    with pytest.raises(TypeError, match="float32"):
        cpu_attention.decode_attention(jnp.asarray(q, jnp.bfloat16), keys, vals, positions)
    with pytest.raises(ValueError, match=r"\[B, K, Dh, S\]"):
        cpu_attention.decode_attention(q, vals, keys, positions)
    with pytest.raises(ValueError, match="positions"):
        cpu_attention.decode_attention(q, keys, vals, positions[:1])
