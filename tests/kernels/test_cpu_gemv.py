"""`cpu_gemv` (FFI few-row matmul) against float64 numpy and XLA."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.kernels import cpu_ffi, cpu_gemv

pytestmark = pytest.mark.skipif(not cpu_ffi.available(),
                                reason="the CPU kernels need a single-device CPU and a compiler")


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


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 13, 16, 32, 37, 64])
@pytest.mark.parametrize("k,n", [(1, 1), (15, 7), (16, 64), (17, 33), (300, 1000), (512, 1024)])
def test_gemv_equals_float64_product(rows, k, n):
    # Rows 1-8 take the streaming path, 9+ the packed-panel GEMM (tiles of 6, 5, 4 ...
    # rows; 37 and 13 leave uneven tiles). N = 1 / 7 / 33 / 1000 leave a partial panel of
    # 16 weight rows; (300, 1000) and (512, 1024) are above the size split over threads;
    # K = 15 / 17 / 300 exercise the tails after the 8- and 16-wide loops.
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


@pytest.mark.parametrize("rows", [3, 32])
def test_gemv_is_deterministic(rows):
    x, w = _operands((rows,), 512, 2048, seed=5)  # split over threads
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
