"""One-token decode attention over the KV cache on the CPU through an XLA FFI kernel.

Each decode step's attention reads the whole KV cache once (at batch 32 and 160 slots
of the benchmark model, 84 MB a step beside 160 MB of weights). XLA:CPU computes it as
batched `[G, Dh] x [Dh, S]` matmuls at ~12 GB/s; `cpu_attention.cc` streams each
(row, kv head) block once, split over the cores, skips the masked slots past each
row's position, and runs 1.1-1.9x faster (`experiments/benchmarks/cpu_kernels.py`).

`decode_attention` is the kernel; its plain reference is `sampling.decode._attend`
(the tests hold them equal). `use_for` is the check of when to use it. The kernel is
built and registered by `cpu_ffi`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pipo_jax.kernels import cpu_ffi

TARGET = "pipo_cpu_decode_attention_f32"


def decode_attention(q_bhd: jax.Array, keys_bkds: jax.Array, vals_bksd: jax.Array,
                     positions_b: jax.Array) -> jax.Array:
    """Attention of one query token per row over its cache slots `0..position` -> `[B, H, Dh]`.

    Args:
      q_bhd: queries `[B, H, Dh]` (H a multiple of the K kv heads; head h uses kv head h // (H / K)).
      keys_bkds: keys `[B, K, Dh, S]`; vals_bksd: values `[B, K, S, Dh]` (`decode.DecodeCache`).
      positions_b: int `[B]`, each row attends to slots `0..min(position, S - 1)`
        (a position `>= S`, an idle row, attends to all of them). Must be `>= 0`.
    Scores are scaled by `Dh ** -0.5` and the softmax is taken in float32.
    """
    ops = (q_bhd, keys_bkds, vals_bksd)
    if any(x.dtype != jnp.float32 for x in ops):
        raise TypeError(f"cpu_attention takes float32 q/k/v, got {[str(x.dtype) for x in ops]}")
    b, h, dh = q_bhd.shape
    if (keys_bkds.ndim != 4 or keys_bkds.shape[0] != b or keys_bkds.shape[2] != dh
            or vals_bksd.shape != (b, keys_bkds.shape[1], keys_bkds.shape[3], dh)
            or h % keys_bkds.shape[1] or positions_b.shape != (b,)):
        raise ValueError(f"cpu_attention shapes: q {q_bhd.shape}, k {keys_bkds.shape}, v {vals_bksd.shape}, "
                         f"positions {positions_b.shape} are not [B, H, Dh], [B, K, Dh, S], [B, K, S, Dh], [B]")
    if not cpu_ffi.available():
        raise RuntimeError("the CPU kernels are not available here (see pipo_jax.kernels.cpu_ffi)")
    out = jax.ShapeDtypeStruct(q_bhd.shape, jnp.float32)
    return jax.ffi.ffi_call(TARGET, out, vmap_method="sequential")(*ops, positions_b.astype(jnp.int32))


def use_for(q_bhd: jax.Array, keys_bkds: jax.Array) -> bool:
    """Whether attention should go through the kernel: fp32 queries and cache, kernel available."""
    return q_bhd.dtype == jnp.float32 and keys_bkds.dtype == jnp.float32 and cpu_ffi.available()
