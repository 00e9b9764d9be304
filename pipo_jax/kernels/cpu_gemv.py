"""Few-row matmul `x @ w.T` on the CPU through an XLA FFI kernel (`cpu_gemv.cc`).

Decoding multiplies a handful of rows by every weight matrix once per step, so a step
costs what it takes to stream the weights from memory. XLA:CPU streams the decode
step's 1-17 MB matrices at ~0.75 of the machine's read bandwidth; this kernel reads
each weight row once as a contiguous stream, in row blocks split over the cores, and
a dependent chain of the step's 33 products runs as fast as one read pass over a
256 MB matrix (`experiments/benchmarks/sampler.py` measures the decode step against
both). XLA's xnnpack / oneDNN / ynnpack dot options were tried: no faster.

`gemv(x, w)` is the kernel and `gemv_reference(x, w)` the plain XLA product it is
tested equal to; `use_for` is the check of when to use it. The kernel is built and
registered by `cpu_ffi` (`cpu_ffi.available()` says whether it can run here).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from pipo_jax.kernels import cpu_ffi

TARGET = "pipo_cpu_gemv_f32"


def gemv_reference(x: jax.Array, w: jax.Array) -> jax.Array:
    """`x [..., K] @ w[N, K].T -> [..., N]` by XLA (fp32 accumulation)."""
    return jnp.einsum("...k,nk->...n", x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def gemv(x: jax.Array, w: jax.Array) -> jax.Array:
    """`x [..., K] @ w[N, K].T -> [..., N]` by the FFI kernel (fp32 only; needs `cpu_ffi.available()`)."""
    if x.dtype != jnp.float32 or w.dtype != jnp.float32:
        raise TypeError(f"cpu_gemv takes float32 operands, got x {x.dtype} and w {w.dtype}")
    if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"cpu_gemv shapes: x {x.shape} and w {w.shape} are not [..., K] and [N, K]")
    if not cpu_ffi.available():
        raise RuntimeError("the CPU kernels are not available here (see pipo_jax.kernels.cpu_ffi)")
    out = jax.ShapeDtypeStruct(x.shape[:-1] + (w.shape[0],), jnp.float32)
    return jax.ffi.ffi_call(TARGET, out, vmap_method="sequential")(x, w)


def use_for(x: jax.Array, w: jax.Array, max_rows: int) -> bool:
    """Whether `x @ w.T` should go through the kernel: fp32, at most `max_rows` rows, kernel available."""
    return (x.dtype == jnp.float32 and w.dtype == jnp.float32 and math.prod(x.shape[:-1]) <= max_rows
            and cpu_ffi.available())
