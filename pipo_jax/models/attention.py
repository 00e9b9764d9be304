"""Causal self-attention over padded rows: the plain reference and fused kernels.

The mask of a full forward / prefill (no cache): query t of row b may see key s when
`s <= t` (by index) and both tokens are valid (`valid_bt`). Positions enter only through
RoPE, applied before this point, so left, right and mixed padding are all the same mask.

Implementations (`IMPLS`; `resolve_impl` picks one for a target platform):

* `xla`: `reference` below, the plain einsum + softmax. It materialises the
  `[B, heads, T, T]` fp32 scores: the CPU path and the spec the others are tested
  against.
* `cudnn` (GPU): `jax.nn.dot_product_attention(implementation="cudnn")`, cuDNN's flash
  attention. cuDNN expresses padding only as per-row lengths of right-padded rows, so
  each row's valid tokens are first moved to its front (a stable gather, order kept:
  causality among valid tokens is unchanged), attended with `is_causal=True` and the
  row lengths, and moved back. Rows are padded at the end to a multiple of
  `CUDNN_SEQ_MULTIPLE` first (keys past a row's length are masked by the lengths) and the
  output sliced back, so every length the trainer produces builds (jax's training path
  refuses odd lengths). cuDNN's kernel takes 16-bit inputs only, so fp32 compute on a GPU
  resolves to `xla`.
* `splash` (TPU; on another target run by the Pallas interpreter): the Pallas splash
  attention shipped with JAX (`jax.experimental.pallas.ops.tpu.splash_attention`), causal mask plus segment ids
  (valid tokens 1, padding 0: a valid query sees exactly the valid keys before it).
  Rows are padded to a multiple of the block size with padding tokens.

The fused kernels never build a `[T, T]` tensor. Padding queries get zero outputs from
them (the reference gives them a uniform average); nothing downstream reads those rows.
Under a `sharding_context` the splash and cuDNN kernels run inside `shard_map` (Mosaic
kernels cannot be partitioned automatically; jax partitions its cuDNN call through a Python
callback that `jax.export` cannot serialize), through `parallel.context.shard_kernel`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash

from pipo_jax import platforms
from pipo_jax.config.registry import register_names
from pipo_jax.parallel.context import shard_kernel

IMPLS = ("auto", "xla", "cudnn", "splash")
register_names("attention_impl", *IMPLS)  # `config/registry.py`: the schema's choices
_HALF = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))

# Splash block sizes (query and key/value tiles). 512 x 512: the splash kernel's tiles
# must be multiples of 128 lanes; at head_dim 128 a 512-row bf16 q/k/v tile is 128 KiB and
# the fp32 [512, 512] score tile 1 MiB, far inside TPU VMEM (16-32 MiB scoped), while
# each k/v tile is reused by 512 queries (arithmetic intensity ~512 FLOP/byte, above the
# v5p ridge of 459/2.76 ~ 166). Rows shorter than a block use one block of T rounded up
# to 128 (fewer wasted padding rows).
SPLASH_BLOCK = 512
_LANES = 128

# cuDNN sequence padding. jax's cuDNN training path refuses odd lengths
# (`jax._src.cudnn.fused_attention_stablehlo.check_is_flash_attention`, jax 0.10.2: "seqlen
# should be divisible by 2" for training, where a bias operand is always present; earlier jax
# releases asked for multiples of 64, and FP8 for 128). Padding every row to a multiple of 64
# satisfies each of these rules, and costs nothing the kernel would not compute anyway: its
# flash tiles are 64 or 128 rows, so a partial tile is computed in full.
CUDNN_SEQ_MULTIPLE = 64


def resolve_impl(impl: str, platform: str, dtype) -> str:
    """The implementation `impl` ("auto" or one of `IMPLS`) means on `platform` at compute `dtype`."""
    if impl not in IMPLS:
        raise ValueError(f"attention_impl={impl!r}; expected one of {IMPLS}")
    platforms.check(platform)
    if impl != "auto":
        return impl
    if platform == "tpu":
        return "splash"
    if platform == "cuda" and jnp.dtype(dtype) in _HALF:
        return "cudnn"
    return "xla"


def causal_padded_mask(valid_bt: jax.Array) -> jax.Array:
    """Boolean `[B, T, T]`: query t sees key s iff s <= t and both are valid."""
    t = valid_bt.shape[1]
    idx = jnp.arange(t)
    return (idx[None, :, None] >= idx[None, None, :]) & valid_bt[:, None, :] & valid_bt[:, :, None]


def reference(q_bthd, k_bskd, v_bskd, allowed_bts, dtype):
    """Grouped-query softmax attention; `allowed_bts` is the boolean key mask per query.

    Query rows with no allowed key (padding) return uniform averages, never NaN.
    (`over_cache` is the same function over head-major keys / values, the KV cache's layout.)
    """
    b, t, h, dh = q_bthd.shape
    kv = k_bskd.shape[2]
    q = q_bthd.reshape(b, t, kv, h // kv, dh)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k_bskd, preferred_element_type=jnp.float32)
    scores = scores * (dh**-0.5)
    scores = jnp.where(allowed_bts[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v_bskd, preferred_element_type=jnp.float32)
    return out.reshape(b, t, h, dh).astype(dtype)


def over_cache(q_bthd, k_bksd, v_bksd, allowed_bts, dtype):
    """`reference` with keys / values head-major (`[B, K, S, Dh]`, a KV cache's layout), whose
    two matmuls batch over (batch, kv head) without transposing the cache. The output leaves
    the second matmul head-major too and is transposed after it: XLA:CPU has no bf16 x bf16
    -> f32 dot that writes a transposed output."""
    b, t, h, dh = q_bthd.shape
    kv = k_bksd.shape[1]
    q = q_bthd.reshape(b, t, kv, h // kv, dh)
    scores = jnp.einsum("btkgd,bksd->bkgts", q, k_bksd, preferred_element_type=jnp.float32)
    scores = scores * (dh**-0.5)
    scores = jnp.where(allowed_bts[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
    out = jnp.einsum("bkgts,bksd->bkgtd", probs, v_bksd, preferred_element_type=jnp.float32)
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(b, t, h, dh).astype(dtype)


# ----------------------------------------------------------------------------- cuDNN


def valid_first_order(valid_bt: jax.Array) -> jax.Array:
    """Per row, the indices of its valid tokens (in order) then its padding: int `[B, T]`."""
    return jnp.argsort(~valid_bt, axis=1, stable=True)


def cudnn_length(t: int) -> int:
    """The length rows of `t` tokens are padded to for cuDNN (see `CUDNN_SEQ_MULTIPLE`)."""
    return -(-t // CUDNN_SEQ_MULTIPLE) * CUDNN_SEQ_MULTIPLE


def cudnn(q_bthd, k_btkd, v_btkd, valid_bt, dtype, implementation: str = "cudnn"):
    """Causal padded attention through `jax.nn.dot_product_attention` -> `[B, T, H, Dh]`.

    The valid tokens move to the front of each row, the rows are padded at the end to
    `cudnn_length(T)` (the padded keys lie past every row's length, so the lengths mask
    them), and the output is sliced back to T and moved back.

    `implementation="xla"` runs the same call, padding included, with XLA's own attention
    (what tests can run without a GPU: it checks the gather, the padding and the lengths
    against the reference).
    """
    t, dh = q_bthd.shape[1], q_bthd.shape[-1]
    tp = cudnn_length(t)
    order_bt = valid_first_order(valid_bt)
    lengths_b = jnp.sum(valid_bt, axis=1, dtype=jnp.int32)

    def front(x):
        x = jnp.take_along_axis(x, order_bt[:, :, None, None], axis=1).astype(dtype)
        return jnp.pad(x, [(0, 0), (0, tp - t), (0, 0), (0, 0)])

    out = jax.nn.dot_product_attention(
        front(q_bthd), front(k_btkd), front(v_btkd),
        scale=dh**-0.5, is_causal=True, query_seq_lengths=lengths_b, key_value_seq_lengths=lengths_b,
        implementation=implementation)[:, :t]
    back_bt = jnp.argsort(order_bt, axis=1)
    out = jnp.take_along_axis(out, back_bt[:, :, None, None], axis=1)
    return jnp.where(valid_bt[:, :, None, None], out, jnp.zeros((), out.dtype)).astype(dtype)


# ----------------------------------------------------------------------------- splash


def splash_block(t: int) -> int:
    """Tile size for rows of length `t` (see `SPLASH_BLOCK`)."""
    return min(SPLASH_BLOCK, -(-t // _LANES) * _LANES)


def _splash_kernel(heads: int, t: int, block: int, interpret: bool):
    """A splash kernel for causal `[t, t]` masks (built per trace: it holds arrays of its trace)."""
    mask = splash.MultiHeadMask([splash.CausalMask((t, t)) for _ in range(heads)])
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                              block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    return splash.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=sizes, interpret=interpret)


def splash_attention(q_bthd, k_btkd, v_btkd, valid_bt, dtype, interpret: bool = False):
    """Causal padded attention through the Pallas splash kernel -> `[B, T, H, Dh]`.

    `interpret=True` runs the kernel in the Pallas interpreter (CPU tests); a TPU program
    wants False (Mosaic).
    """
    b, t, h, dh = q_bthd.shape
    block = splash_block(t)
    tp = -(-t // block) * block
    pad = [(0, 0), (0, tp - t), (0, 0), (0, 0)]
    # splash takes [heads, T, Dh] per row and does not scale the scores.
    q = jnp.transpose(jnp.pad(q_bthd * jnp.asarray(dh**-0.5, q_bthd.dtype), pad), (0, 2, 1, 3)).astype(dtype)
    k = jnp.transpose(jnp.pad(k_btkd, pad), (0, 2, 1, 3)).astype(dtype)
    v = jnp.transpose(jnp.pad(v_btkd, pad), (0, 2, 1, 3)).astype(dtype)
    seg_bt = jnp.pad(valid_bt.astype(jnp.int32), [(0, 0), (0, tp - t)])
    kernel = _splash_kernel(h, tp, block, interpret)
    out = jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=splash.SegmentIds(s, s)))(q, k, v, seg_bt)
    out = jnp.transpose(out, (0, 2, 1, 3))[:, :t]
    return jnp.where(valid_bt[:, :, None, None], out, jnp.zeros((), out.dtype)).astype(dtype)


# ----------------------------------------------------------------------------- dispatch

# q is grouped [B, T, K, G, Dh] so that q, k and v split their kv heads alike.
_Q_AXES = ("batch", None, "kv_heads", None, None)
_KV_AXES = ("batch", None, "kv_heads", None)


def self_attention(q_bthd, k_btkd, v_btkd, valid_bt, dtype, *, impl: str, platform: str):
    """Causal self-attention of padded rows with the kernel `impl` means for `platform`.

    q `[B, T, H, Dh]`, k / v `[B, T, K, Dh]`, valid_bt bool `[B, T]`; returns `[B, T, H, Dh]`
    in `dtype` (equal to `reference` with `causal_padded_mask` on valid query rows).
    """
    impl = resolve_impl(impl, platform, dtype)
    if impl == "xla":
        return reference(q_bthd, k_btkd, v_btkd, causal_padded_mask(valid_bt), dtype)
    b, t, h, dh = q_bthd.shape
    kv = k_btkd.shape[2]
    if impl == "cudnn":
        # jax partitions its cuDNN call with `custom_partitioning`, a Python callback that an
        # exported program cannot carry: under a mesh it runs per device like splash.
        run = functools.partial(_grouped, cudnn, dtype=dtype)
    else:
        # Mosaic on a TPU target; elsewhere (Mosaic is TPU-only) the Pallas interpreter: CPU tests, and the
        # readiness report's GPU target, where it stands in for cuDNN's block-wise attention.
        run = functools.partial(_grouped, functools.partial(splash_attention, interpret=platform != "tpu"),
                                dtype=dtype)
    args = (q_bthd.reshape(b, t, kv, h // kv, dh), k_btkd, v_btkd, valid_bt)
    # Under a `sharding_context` each device runs the kernel on its own rows / kv heads.
    out = shard_kernel(run, args, (_Q_AXES, _KV_AXES, _KV_AXES, ("batch", None)), _Q_AXES)
    return out.reshape(b, t, h, dh)


def _grouped(kernel, q_btkgd, k_btkd, v_btkd, valid_bt, *, dtype):
    """`kernel` (cudnn / splash_attention) on grouped queries: one device's block under a mesh."""
    b, t, kv, g, dh = q_btkgd.shape
    out = kernel(q_btkgd.reshape(b, t, kv * g, dh), k_btkd, v_btkd, valid_bt, dtype)
    return out.reshape(b, t, kv, g, dh)

