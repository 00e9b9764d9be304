"""Builds and registers the C++ XLA FFI kernels for decoding on the CPU.

The kernels (`cpu_gemv.cc`: few-row matmul; `cpu_attention.cc`: one-token attention
over the KV cache; `cpu_parallel.h`: the threads they share) are compiled into one
library at first use with the machine's C++ compiler (`-O3 -march=native`, ~5 s),
cached per machine, source and jaxlib version in `$PIPO_JAX_CACHE` (default
`~/.cache/pipo_jax`), and registered as custom-call targets. They are written in C++
because no JAX or XLA option produces their memory access patterns (the module
docstrings of `cpu_gemv.py` and `cpu_attention.py` say what each one gains).

`available()` says whether they can run here: the default backend is the CPU with a
single device (a custom call is opaque to the SPMD partitioner, so on a mesh it would
gather sharded operands), the machine has a compiler and the library builds.
`PIPO_JAX_CPU_KERNELS=0` turns them off. Without them decoding uses XLA's ops.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = (HERE / "cpu_gemv.cc", HERE / "cpu_attention.cc")
HEADERS = (HERE / "cpu_parallel.h",)
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno")
# custom-call target -> exported handler symbol
TARGETS = {"pipo_cpu_gemv_f32": "PipoCpuGemvF32", "pipo_cpu_decode_attention_f32": "PipoCpuDecodeAttentionF32"}


@functools.cache
def available() -> bool:
    """True when the kernels are registered and may be used here (see the module docstring)."""
    if os.environ.get("PIPO_JAX_CPU_KERNELS", "1") == "0":
        return False
    if jax.default_backend() != "cpu" or jax.device_count() != 1:
        return False
    library = build()
    if library is None:
        return False
    lib = ctypes.cdll.LoadLibrary(str(library))
    for target, symbol in TARGETS.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    return True


def _cpu_signature() -> str:
    """What `-march=native` depends on: the CPU's model and feature flags."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features", "CPU part"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() + platform.machine()


def build() -> Path | None:
    """Compiles the library (once: cached by a hash of everything the binary depends on)."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        log.warning("CPU kernels: no C++ compiler found (set CXX); decoding uses XLA's ops")
        return None
    texts = [p.read_text() for p in (*SOURCES, *HEADERS)]
    key = hashlib.sha256("\0".join([*texts, compiler, *FLAGS, jax.__version__,
                                    _cpu_signature()]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("PIPO_JAX_CACHE", Path.home() / ".cache" / "pipo_jax"))
    library = cache / f"cpu_kernels-{key}.so"
    if library.exists():
        return library
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
    os.close(fd)
    cmd = [compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", *map(str, SOURCES), "-o", tmp]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        os.unlink(tmp)
        errors = [ln for ln in result.stderr.splitlines() if "error" in ln]  # not the headers' warnings
        log.warning("CPU kernels: building the library failed (decoding uses XLA's ops):\n%s\n%s",
                    " ".join(cmd), "\n".join(errors[:20]) or result.stderr[-2000:])
        return None
    os.replace(tmp, library)  # atomic: concurrent builders each install a whole file
    return library
