"""Few-row matmul `x @ w.T` on the CPU through an XLA FFI kernel (`cpu_gemv.cc`).

Decoding multiplies a handful of rows by every weight matrix once per step, so a step
costs what it takes to stream the weights from memory. XLA:CPU streams the decode
step's 1-17 MB matrices at ~0.75 of the machine's read bandwidth; this kernel reads
each weight row once as a contiguous stream, in row blocks split over the cores, and
a dependent chain of the step's 33 products runs as fast as one read pass over a
256 MB matrix (`experiments/benchmarks/sampler.py` measures the decode step against
both). It is written in C++ because no JAX or XLA option produces that access
pattern (XLA's xnnpack / oneDNN / ynnpack dot options were tried: no faster).

`gemv(x, w)` is the kernel and `gemv_reference(x, w)` the plain XLA product it is
tested equal to. `available()` says whether the kernel can run here: the default
backend is the CPU with a single device (a custom call is opaque to the SPMD
partitioner, so on a mesh it would gather sharded weights), the machine has a C++
compiler and the kernel builds. It is compiled once per machine, source and jaxlib
version into `$PIPO_JAX_CACHE` (default `~/.cache/pipo_jax`). `PIPO_JAX_CPU_GEMV=0`
turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import math
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp

log = logging.getLogger(__name__)

TARGET = "pipo_cpu_gemv_f32"
SOURCE = Path(__file__).with_name("cpu_gemv.cc")
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno")


def gemv_reference(x: jax.Array, w: jax.Array) -> jax.Array:
    """`x [..., K] @ w[N, K].T -> [..., N]` by XLA (fp32 accumulation)."""
    return jnp.einsum("...k,nk->...n", x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def gemv(x: jax.Array, w: jax.Array) -> jax.Array:
    """`x [..., K] @ w[N, K].T -> [..., N]` by the FFI kernel (fp32 only; needs `available()`)."""
    if x.dtype != jnp.float32 or w.dtype != jnp.float32:
        raise TypeError(f"cpu_gemv takes float32 operands, got x {x.dtype} and w {w.dtype}")
    if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"cpu_gemv shapes: x {x.shape} and w {w.shape} are not [..., K] and [N, K]")
    if not available():
        raise RuntimeError("cpu_gemv is not available here (see cpu_gemv.available)")
    out = jax.ShapeDtypeStruct(x.shape[:-1] + (w.shape[0],), jnp.float32)
    return jax.ffi.ffi_call(TARGET, out, vmap_method="sequential")(x, w)


def use_for(x: jax.Array, w: jax.Array, max_rows: int) -> bool:
    """Whether `x @ w.T` should go through the kernel: fp32, at most `max_rows` rows, kernel available."""
    return (x.dtype == jnp.float32 and w.dtype == jnp.float32 and math.prod(x.shape[:-1]) <= max_rows
            and available())


@functools.cache
def available() -> bool:
    """True when the kernel is registered and may be used here (see the module docstring)."""
    if os.environ.get("PIPO_JAX_CPU_GEMV", "1") == "0":
        return False
    if jax.default_backend() != "cpu" or jax.device_count() != 1:
        return False
    library = _build()
    if library is None:
        return False
    lib = ctypes.cdll.LoadLibrary(str(library))
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.PipoCpuGemvF32), platform="cpu")
    return True


def _cpu_signature() -> str:
    """What `-march=native` depends on: the CPU's model and feature flags."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features", "CPU part"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() + platform.machine()


def _build() -> Path | None:
    """Compiles the kernel (once: cached by a hash of everything the binary depends on)."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        log.warning("cpu_gemv: no C++ compiler found (set CXX); decoding uses XLA's matmul")
        return None
    include = jax.ffi.include_dir()
    key = hashlib.sha256("\0".join([SOURCE.read_text(), compiler, *FLAGS, jax.__version__,
                                    _cpu_signature()]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("PIPO_JAX_CACHE", Path.home() / ".cache" / "pipo_jax"))
    library = cache / f"cpu_gemv-{key}.so"
    if library.exists():
        return library
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
    os.close(fd)
    cmd = [compiler, *FLAGS, f"-I{include}", str(SOURCE), "-o", tmp]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        os.unlink(tmp)
        log.warning("cpu_gemv: building the kernel failed (decoding uses XLA's matmul):\n%s\n%s",
                    " ".join(cmd), result.stderr[-2000:])
        return None
    os.replace(tmp, library)  # atomic: concurrent builders each install a whole file
    return library
