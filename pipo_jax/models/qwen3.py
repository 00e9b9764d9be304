"""Qwen3 decoder in pure JAX: config, parameters, forward with an optional KV cache.

Parameters are a nested dict of arrays with the decoder layers stacked on a leading
`layers` axis. The layer loop has two forms (`Qwen3Config.layer_loop`, chosen by the target
platform): one `lax.scan` over the stacked layers (TPU / GPU: compile time does not grow
with depth), or unrolled over static per-layer slices (CPU: XLA:CPU copies each scanned
layer's weights out of the stacked arrays on every iteration; static slices are taken once
per program). The dense layers likewise take the target platform's form (`project`). Each
pair of forms is the same function (tests hold them equal). `param_axes(config)` gives the
same tree with a logical axis name per dimension
(`embed`, `vocab`, `heads`, `kv_heads`, `head_dim`, `mlp`, `layers`) for sharding.

The KV cache is indexed by *position*: the key/value of the token at position p of
row b is stored at slot p. A query at position p attends to slots 0..p, so one rule
serves a full forward, prefill and one-token decode, and left- or right-padded rows
(padding tokens write nothing).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pipo_jax import platforms
from pipo_jax.config.registry import register_names
from pipo_jax.models import attention as attention_lib
from pipo_jax.parallel.context import active_context, constrain

Params = dict[str, Any]

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
_REMAT_POLICIES = ("none", "full", "dots_saveable")
LAYER_LOOPS = ("auto", "scan", "unroll")
register_names("layer_loop", *LAYER_LOOPS)  # `config/registry.py`: the schema's choices
DENSE_FORMS = ("auto", "flat", "batched")
register_names("dense_form", *DENSE_FORMS)  # `config/registry.py`: the schema's choices


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """Shapes and numerics of a Qwen3 causal LM (field names follow HF config.json).

    `param_dtype` is the storage dtype of the weights, `dtype` the matmul/activation
    dtype; norms, softmax and logits are always computed in float32. `platform` is the
    platform the programs are built for (`pipo_jax.platforms.PLATFORMS`; not read from
    the host), which picks the attention kernel (`attention_impl`: "auto" = cuDNN on
    "cuda" in 16-bit compute, splash on "tpu", XLA on "cpu"; see `models/attention.py`)
    and the fused log-prob kernel's defaults, the layer loop (`layer_loop`: "auto" =
    unrolled on "cpu", one `lax.scan` on "cuda" / "tpu", as MaxText's `scan_layers`) and
    the dense layers' form (`dense_form`: "auto" = 2-D matmuls over flattened tokens on
    "cpu", einsums over `[B, T, ...]` on "cuda" / "tpu"; see `project`).
    """

    vocab_size: int = 151_936
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 40_960
    tie_word_embeddings: bool = True
    param_dtype: str = "float32"
    dtype: str = "float32"
    remat: str = "none"  # one of _REMAT_POLICIES
    platform: str = "cpu"  # one of pipo_jax.platforms.PLATFORMS
    attention_impl: str = "auto"  # one of models.attention.IMPLS
    layer_loop: str = "auto"  # one of LAYER_LOOPS
    dense_form: str = "auto"  # one of DENSE_FORMS

    def __post_init__(self):
        platforms.check(self.platform, "Qwen3Config.platform")
        if self.attention_impl not in attention_lib.IMPLS:
            raise ValueError(f"Qwen3Config.attention_impl={self.attention_impl!r}; expected one of {attention_lib.IMPLS}")
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(f"Qwen3Config.{name}={getattr(self, name)!r}; expected one of {sorted(_DTYPES)}")
        if self.layer_loop not in LAYER_LOOPS:
            raise ValueError(f"Qwen3Config.layer_loop={self.layer_loop!r}; expected one of {LAYER_LOOPS}")
        if self.dense_form not in DENSE_FORMS:
            raise ValueError(f"Qwen3Config.dense_form={self.dense_form!r}; expected one of {DENSE_FORMS}")
        if self.remat not in _REMAT_POLICIES:
            raise ValueError(f"Qwen3Config.remat={self.remat!r}; expected one of {_REMAT_POLICIES}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"Qwen3Config.num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"Qwen3Config.head_dim={self.head_dim} must be even for RoPE")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"Qwen3Config.{name}={getattr(self, name)} must be >= 1")

    @property
    def jnp_param_dtype(self):
        return _DTYPES[self.param_dtype]

    @property
    def jnp_dtype(self):
        return _DTYPES[self.dtype]

    @property
    def unrolled_layers(self) -> bool:
        """Whether the layer loop is unrolled (`layer_loop`, "auto" by the target platform)."""
        return self.layer_loop == "unroll" or (self.layer_loop == "auto" and self.platform == "cpu")

    @property
    def flat_tokens(self) -> bool:
        """Whether dense layers run as 2-D matmuls over flattened tokens (`dense_form`, "auto"
        by the target platform: flat on "cpu", batched einsums on "cuda" / "tpu"; see `project`)."""
        return self.dense_form == "flat" or (self.dense_form == "auto" and self.platform == "cpu")

    @property
    def num_params(self) -> int:
        d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
        hq, hkv, dh = self.num_attention_heads, self.num_key_value_heads, self.head_dim
        per_layer = d * dh * (hq + 2 * hkv) + hq * dh * d + 3 * d * f + 2 * d + 2 * dh
        return v * d * (1 if self.tie_word_embeddings else 2) + self.num_hidden_layers * per_layer + d

    def replace(self, **kw) -> "Qwen3Config":
        return dataclasses.replace(self, **kw)


# Published config.json values of the Qwen3 base/instruct checkpoints.
PRESETS: dict[str, Qwen3Config] = {
    "tiny": Qwen3Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10_000.0,
        max_position_embeddings=512, tie_word_embeddings=True,
    ),
    "qwen3_0.6b": Qwen3Config(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True,
    ),
    "qwen3_1.7b": Qwen3Config(
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True,
    ),
    "qwen3_4b": Qwen3Config(
        hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True,
    ),
    "qwen3_8b": Qwen3Config(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False,
    ),
}


def preset(name: str, **overrides) -> Qwen3Config:
    """A named preset (`tiny`, `qwen3_0.6b`, `qwen3_1.7b`, `qwen3_4b`, `qwen3_8b`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown Qwen3 preset {name!r}; expected one of {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides)


# ----------------------------------------------------------------------------- params


def param_shapes(config: Qwen3Config) -> Params:
    """Shape tree of the parameters (same structure as `init_params`)."""
    c = config
    L, D, F, V = c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.vocab_size
    H, K, Dh = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    shapes: Params = {
        "embed": (V, D),
        "layers": {
            "attn_norm": (L, D),
            "q_proj": (L, D, H, Dh),
            "k_proj": (L, D, K, Dh),
            "v_proj": (L, D, K, Dh),
            "q_norm": (L, Dh),
            "k_norm": (L, Dh),
            "o_proj": (L, H, Dh, D),
            "mlp_norm": (L, D),
            "gate_proj": (L, D, F),
            "up_proj": (L, D, F),
            "down_proj": (L, F, D),
        },
        "final_norm": (D,),
    }
    if not c.tie_word_embeddings:
        shapes["lm_head"] = (D, V)
    return shapes


def param_axes(config: Qwen3Config) -> Params:
    """Logical axis names of every parameter dimension (same tree as `init_params`)."""
    axes: Params = {
        "embed": ("vocab", "embed"),
        "layers": {
            "attn_norm": ("layers", "embed"),
            "q_proj": ("layers", "embed", "heads", "head_dim"),
            "k_proj": ("layers", "embed", "kv_heads", "head_dim"),
            "v_proj": ("layers", "embed", "kv_heads", "head_dim"),
            "q_norm": ("layers", "head_dim"),
            "k_norm": ("layers", "head_dim"),
            "o_proj": ("layers", "heads", "head_dim", "embed"),
            "mlp_norm": ("layers", "embed"),
            "gate_proj": ("layers", "embed", "mlp"),
            "up_proj": ("layers", "embed", "mlp"),
            "down_proj": ("layers", "mlp", "embed"),
        },
        "final_norm": ("embed",),
    }
    if not config.tie_word_embeddings:
        axes["lm_head"] = ("embed", "vocab")
    return axes


_NORMS = ("attn_norm", "q_norm", "k_norm", "mlp_norm", "final_norm")
# How many leading axes of each dense weight of a layer are its inputs (`project`'s `in_dims`).
DENSE_IN_DIMS = {"q_proj": 1, "k_proj": 1, "v_proj": 1, "o_proj": 2, "gate_proj": 1, "up_proj": 1, "down_proj": 1}


def init_params(config: Qwen3Config, rng: jax.Array, std: float = 0.02) -> Params:
    """Random parameters: N(0, std) matrices (HF's `initializer_range`), unit norms.

    Leaf i draws with key i of `jax.random.split(rng, leaves)`. Two programs, the draws then the scale:
    in one, XLA would fold `std` into the draw's own constant and move some draws by an ulp."""
    shapes = param_shapes(config)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda x: isinstance(x, tuple))
    drawn = tuple(None if path[-1].key in _NORMS else shape for path, shape in leaves)
    normals = _standard_normals(rng, drawn)
    out = _scaled(normals, jnp.float32(std), tuple(shape for _, shape in leaves), config.jnp_param_dtype)
    return jax.tree_util.tree_unflatten(treedef, out)


@functools.partial(jax.jit, static_argnums=1)
def _standard_normals(rng: jax.Array, shapes: tuple[tuple[int, ...] | None, ...]) -> list[jax.Array | None]:
    """float32 N(0, 1) of each shape (None: no draw) with key i of `split(rng, len(shapes))`."""
    keys = jax.random.split(rng, len(shapes))
    return [None if s is None else jax.random.normal(keys[i], s, jnp.float32) for i, s in enumerate(shapes)]


@functools.partial(jax.jit, static_argnums=(2, 3))
def _scaled(normals: list[jax.Array | None], std: jax.Array, shapes: tuple[tuple[int, ...], ...], dtype) -> list:
    """`std * normal` in `dtype`, ones where there is no draw (the norms)."""
    return [jnp.ones(s, dtype) if x is None else (std * x).astype(dtype) for x, s in zip(normals, shapes)]


def layers_unrolled(config: Qwen3Config) -> bool:
    """Whether the program being traced unrolls the layer loop: `config.unrolled_layers` (the
    target platform's choice) for a one-device program; under a `sharding_context` the loop
    scans, as on accelerators (unrolled, XLA:CPU gathers every layer's fsdp shards at once: the
    fsdp=8 host prefill of qwen3_4b peaked at 66.8 GB per device, scanned at 28.2 GB)."""
    return config.unrolled_layers and active_context() is None


def layer_params(params: Params, i: int) -> Params:
    """Layer `i`'s weights (static slices of the stacked `params["layers"]`)."""
    return jax.tree.map(lambda w: w[i], params["layers"])


def lm_head_weight(config: Qwen3Config, params: Params) -> jax.Array:
    """LM head as `[D, V]` (the transposed embedding when tied)."""
    return params["embed"].T if config.tie_word_embeddings else params["lm_head"]


# ----------------------------------------------------------------------------- cache


class KVCache(NamedTuple):
    """Keys/values by position: `k`, `v` are `[layers, batch, kv_heads, max_len, head_dim]`.

    Head-major (each kv head's slots contiguous): attention over the cache is a batched
    matmul over (batch, kv head) with no per-step transpose of the cache."""

    k: jax.Array
    v: jax.Array

    @property
    def max_len(self) -> int:
        return self.k.shape[3]


def init_cache(config: Qwen3Config, batch: int, max_len: int, dtype=None) -> KVCache:
    """An empty cache for `batch` rows of up to `max_len` positions (compute dtype by default)."""
    shape = (config.num_hidden_layers, batch, config.num_key_value_heads, max_len, config.head_dim)
    dtype = config.jnp_dtype if dtype is None else dtype
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


# ----------------------------------------------------------------------------- activation sharding

# Activations are constrained by their logical axes at block boundaries
# (`parallel.context.constrain`): under an active `sharding_context` that adds sharding
# constraints; outside one it is the identity, so the forward is exactly the unconstrained one.
_RESIDUAL_AXES = ("batch", "length", "hidden")
RESIDUAL_AXES = _RESIDUAL_AXES  # logical axes of the residual stream `[B, T, D]`


# ----------------------------------------------------------------------------- layers


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis in float32, cast back to `x.dtype` before the scale (as HF)."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * normed.astype(x.dtype)


def rope_tables(positions_bt: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos, sin of shape `[B, T, head_dim]` (the two halves repeated, HF layout), float32."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions_bt.astype(jnp.float32)[..., None] * inv_freq  # [B, T, Dh/2]
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x_bthd: jax.Array, cos_btd: jax.Array, sin_btd: jax.Array) -> jax.Array:
    """Rotary embedding (rotate-half form) of `[B, T, heads, head_dim]`."""
    half = x_bthd.shape[-1] // 2
    rotated = jnp.concatenate([-x_bthd[..., half:], x_bthd[..., :half]], axis=-1)
    cos, sin = cos_btd[:, :, None, :], sin_btd[:, :, None, :]
    out = x_bthd.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin
    return out.astype(x_bthd.dtype)


# The plain reference attention over a head-major cache (`[B, K, S, Dh]` keys / values,
# `[B, T, S]` mask).
cached_attention = attention_lib.over_cache


def write_cache(c_bksd: jax.Array, rows_bt: jax.Array, slots_bt: jax.Array, x_btkd: jax.Array) -> jax.Array:
    """`x` written at (row, slot) of a head-major layer cache; slots `>= max_len` write nothing."""
    return c_bksd.at[rows_bt, :, slots_bt].set(x_btkd.astype(c_bksd.dtype), mode="drop")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ColumnStack:
    """A dense weight `[*in, *out]` as `n` equal blocks of its flattened output columns,
    stacked: `blocks_nio [n, prod(in), prod(out) / n]`.

    `project` multiplies all blocks in one batched matmul and returns the output flat,
    `[B, T, prod(out)]`: the product with the whole weight (tests hold them equal). The
    one-row decode step on CPU takes its small attention projections in this form
    (`sampling.decode.compute_params`): XLA:CPU runs a matrix-vector product of a small
    matrix on one core, and the members of a batched one on both.
    """

    blocks_nio: jax.Array

    @classmethod
    def split(cls, w: jax.Array, n: int, in_dims: int = 1) -> "ColumnStack":
        """`w` (`in_dims` input axes) cut into `n` blocks of its output columns (`n` must divide them)."""
        n_in, n_out = math.prod(w.shape[:in_dims]), math.prod(w.shape[in_dims:])
        if n_out % n:
            raise ValueError(f"cannot cut a weight of shape {w.shape} into {n} blocks of its output columns")
        return cls(jnp.transpose(w.reshape(n_in, n, n_out // n), (1, 0, 2)))

    def whole(self) -> jax.Array:
        """The weight as one matrix `[prod(in), prod(out)]`."""
        n, n_in, m = self.blocks_nio.shape
        return jnp.transpose(self.blocks_nio, (1, 0, 2)).reshape(n_in, n * m)

    def astype(self, dtype) -> "ColumnStack":
        return ColumnStack(self.blocks_nio.astype(dtype))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TransposedWeight:
    """A dense weight `[*in, *out]` stored transposed, `w_oi [prod(out), prod(in)]`.

    `project` contracts the input with its last axis; the result is the product with the
    weight as stored (tests hold them equal). Multi-row decode on CPU takes its weights in
    this form (`sampling.decode.compute_params`): XLA:CPU's products of 16 to 64 rows ran
    faster with the contracted axis minor in both operands.
    """

    w_oi: jax.Array
    out_shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))

    @classmethod
    def of(cls, w: jax.Array, in_dims: int = 1) -> "TransposedWeight":
        """`w` (`in_dims` input axes) transposed."""
        return cls(jnp.transpose(w.reshape(math.prod(w.shape[:in_dims]), -1)), tuple(w.shape[in_dims:]))

    def astype(self, dtype) -> "TransposedWeight":
        return TransposedWeight(self.w_oi.astype(dtype), self.out_shape)


def project(config: Qwen3Config, x, w, in_dims: int = 1):
    """A dense layer: `x [B, T, *in] @ w [*in, *out] -> [B, T, *out]` (the last `in_dims`
    axes of `x` contract with the first `in_dims` of `w`).

    With `config.flat_tokens` (the CPU form) and more than one token per row, one 2-D matmul
    `[B*T, in] @ [in, out]`: XLA:CPU lowers the gradient of the einsum form, whose tokens
    span two axes, through transposing copies of the activations (a learner step 1.3x
    slower). One-token decode steps keep the einsum, measured faster there, and so do
    programs under a `sharding_context` (partitioned by the named axes, in the accelerator
    programs' form, as `layers_unrolled`). Elsewhere the einsum keeps its named axes.
    A `ColumnStack` weight is multiplied in one batched matmul, its output flat `[B, T, out]`;
    a `TransposedWeight` as one 2-D matmul over the flattened tokens.
    """
    b, t = x.shape[:2]
    if isinstance(w, TransposedWeight):
        y = jax.lax.dot_general(x.reshape(b * t, w.w_oi.shape[1]), w.w_oi, (((1,), (1,)), ((), ())))
        return y.reshape(b, t, *w.out_shape)
    if isinstance(w, ColumnStack):
        n, n_in, m = w.blocks_nio.shape
        x_nri = jnp.broadcast_to(x.reshape(1, b * t, n_in), (n, b * t, n_in))
        y_nrm = jax.lax.dot_general(x_nri, w.blocks_nio, (((2,), (1,)), ((0,), (0,))))
        return jnp.transpose(y_nrm, (1, 0, 2)).reshape(b, t, n * m)
    if config.flat_tokens and t > 1 and active_context() is None:  # see layers_unrolled
        n_in, out_shape = math.prod(w.shape[:in_dims]), w.shape[in_dims:]
        y = x.reshape(b * t, n_in) @ w.reshape(n_in, math.prod(out_shape))
        return y.reshape(b, t, *out_shape)
    x_axes = "bt" + "ijk"[:in_dims]
    w_axes = "ijk"[:in_dims] + "mno"[: w.ndim - in_dims]
    return jnp.einsum(f"{x_axes},{w_axes}->bt{w_axes[in_dims:]}", x, w)


def layer_qkv(config: Qwen3Config, x_btd, lp, cos, sin):
    """Attention inputs of one block: q `[B, T, H, Dh]`, k, v `[B, T, K, Dh]` (normed, RoPE'd)."""
    dt = config.jnp_dtype
    eps = config.rms_norm_eps
    h = rms_norm(x_btd, lp["attn_norm"], eps)
    if "qkv_proj" in lp:  # q, k and v in one `ColumnStack` (`sampling.decode.compute_params`)
        b, t = h.shape[:2]
        nh, nk, dh = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        q, k, v = jnp.split(project(config, h, lp["qkv_proj"].astype(dt)), [nh * dh, (nh + nk) * dh], axis=-1)
        q, k, v = q.reshape(b, t, nh, dh), k.reshape(b, t, nk, dh), v.reshape(b, t, nk, dh)
    else:
        q, k, v = (project(config, h, lp[name].astype(dt)) for name in ("q_proj", "k_proj", "v_proj"))
    q = apply_rope(rms_norm(q, lp["q_norm"], eps), cos, sin)
    k = apply_rope(rms_norm(k, lp["k_norm"], eps), cos, sin)
    return q, k, v


def layer_out(config: Qwen3Config, x_btd, lp, a_bthd):
    """The rest of one block after attention `a_bthd`: output projection and MLP, residuals."""
    dt = config.jnp_dtype
    x_btd = x_btd + project(config, a_bthd, lp["o_proj"].astype(dt), in_dims=2)
    h = rms_norm(x_btd, lp["mlp_norm"], config.rms_norm_eps)
    gate = project(config, h, lp["gate_proj"].astype(dt))
    up = project(config, h, lp["up_proj"].astype(dt))
    return x_btd + project(config, jax.nn.silu(gate) * up, lp["down_proj"].astype(dt))


def self_attention(config: Qwen3Config, q_bthd, k_btkd, v_btkd, valid_bt):
    """Causal attention of padded rows with the kernel of `config.platform` / `attention_impl`."""
    return attention_lib.self_attention(q_bthd, k_btkd, v_btkd, valid_bt, config.jnp_dtype,
                                        impl=config.attention_impl, platform=config.platform)


def _decoder_layer(config: Qwen3Config, x_btd, lp, cos, sin, positions_bt, valid_bt, allowed_bts, cache_kv):
    """One pre-norm block; returns the new residual stream and (k, v) cache for this layer.

    Without a cache `allowed_bts` is None and attention is `self_attention` (fused on
    accelerators); with a cache it is the reference over the cache slots.
    """
    dt = config.jnp_dtype
    q, k, v = layer_qkv(config, x_btd, lp, cos, sin)
    if cache_kv is None:
        return layer_out(config, x_btd, lp, self_attention(config, q, k, v, valid_bt)), None
    ck, cv = cache_kv
    max_len = ck.shape[2]
    # Padding tokens write to an out-of-range slot, which `mode="drop"` discards.
    slots = jnp.where(valid_bt, positions_bt, max_len)
    rows = jnp.broadcast_to(jnp.arange(x_btd.shape[0])[:, None], slots.shape)
    ck = write_cache(ck, rows, slots, k)
    cv = write_cache(cv, rows, slots, v)
    a = cached_attention(q, ck.astype(dt), cv.astype(dt), allowed_bts, dt)
    return layer_out(config, x_btd, lp, a), (ck, cv)


def _remat(fn, policy: str):
    if policy == "none":
        return fn
    if policy == "full":
        return jax.checkpoint(fn)
    return jax.checkpoint(fn, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)


def default_positions(attention_mask_bt: jax.Array) -> jax.Array:
    """Position of each token = number of valid tokens before it (works for left padding)."""
    m = attention_mask_bt.astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(m, axis=1) - 1, 0)


def forward(
    config: Qwen3Config,
    params: Params,
    tokens_bt: jax.Array,
    attention_mask_bt: jax.Array | None = None,
    positions_bt: jax.Array | None = None,
    cache: KVCache | None = None,
    return_hidden: bool = False,
) -> tuple[jax.Array, KVCache | None]:
    """Runs the decoder.

    Args:
      tokens_bt: int token ids `[B, T]`.
      attention_mask_bt: 1 for real tokens, 0 for padding `[B, T]` (default all ones).
      positions_bt: RoPE positions `[B, T]`; default counts valid tokens (`default_positions`).
        With a cache they are also the cache slots written and read.
      cache: optional `KVCache`; the new tokens' keys/values are written at their
        positions and each query attends to cache slots `0..position`.
      return_hidden: return the final normed hidden states `[B, T, D]` (compute dtype)
        instead of float32 logits `[B, T, V]`.

    Returns:
      (logits or hidden, updated cache or None).
    """
    b, t = tokens_bt.shape
    if attention_mask_bt is None:
        attention_mask_bt = jnp.ones((b, t), jnp.int32)
    valid_bt = attention_mask_bt.astype(bool)
    if positions_bt is None:
        positions_bt = default_positions(attention_mask_bt)
    if cache is None:
        allowed = None  # causal + padding, inside `self_attention`
    else:
        slots = jnp.arange(cache.max_len)
        allowed = (slots[None, None, :] <= positions_bt[:, :, None]) & valid_bt[:, :, None]

    dt = config.jnp_dtype
    x = constrain(jnp.take(params["embed"], tokens_bt, axis=0).astype(dt), _RESIDUAL_AXES)
    cos, sin = rope_tables(positions_bt, config.head_dim, config.rope_theta)

    def body(x_btd, layer_inputs):
        lp, cache_kv = layer_inputs
        x_btd, new_kv = _decoder_layer(config, x_btd, lp, cos, sin, positions_bt, valid_bt, allowed, cache_kv)
        return constrain(x_btd, _RESIDUAL_AXES), new_kv

    body = _remat(body, config.remat)
    if layers_unrolled(config):
        new_kv = []
        for i in range(config.num_hidden_layers):
            cache_kv = None if cache is None else (cache.k[i], cache.v[i])
            x, kv = body(x, (layer_params(params, i), cache_kv))
            new_kv.append(kv)
        new_cache = None if cache is None else KVCache(*(jnp.stack(c) for c in zip(*new_kv)))
    else:
        cache_xs = None if cache is None else (cache.k, cache.v)
        x, new_kv = jax.lax.scan(body, x, (params["layers"], cache_xs))
        new_cache = None if cache is None else KVCache(*new_kv)

    x = constrain(rms_norm(x, params["final_norm"], config.rms_norm_eps), _RESIDUAL_AXES)
    if return_hidden:
        return x, new_cache
    w = lm_head_weight(config, params).astype(dt)
    return jnp.einsum("btd,dv->btv", x, w, preferred_element_type=jnp.float32), new_cache


def logits(config: Qwen3Config, params: Params, tokens_bt: jax.Array, attention_mask_bt: jax.Array | None = None):
    """Float32 logits `[B, T, V]` of a full (uncached) forward."""
    return forward(config, params, tokens_bt, attention_mask_bt)[0]


def hidden_states(config: Qwen3Config, params: Params, tokens_bt: jax.Array, attention_mask_bt: jax.Array | None = None):
    """Final normed hidden states `[B, T, D]` (feed `lm_head_weight` to a fused log-prob kernel)."""
    return forward(config, params, tokens_bt, attention_mask_bt, return_hidden=True)[0]
