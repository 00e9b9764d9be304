"""Hugging Face Qwen3 checkpoints <-> (Qwen3Config, params).

`load` reads config.json and one or many `*.safetensors` files tensor by tensor into
preallocated stacked host arrays, so host memory stays near one copy of the weights.
`save` writes config.json + sharded safetensors (+ index) that
`transformers.AutoModelForCausalLM.from_pretrained` loads.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from pipo_jax.models.qwen3 import Params, Qwen3Config, param_shapes

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM",)
INDEX_FILE = "model.safetensors.index.json"

# HF config.json keys that map 1:1 onto Qwen3Config fields.
_CONFIG_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps", "max_position_embeddings",
    "tie_word_embeddings",
)
# transformers fills absent shape keys with its own constants (head_dim 128, 32 kv
# heads) whatever the other shapes are, so an absent shape key is an error here.
_REQUIRED_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "head_dim")
_HF_DEFAULTS = {"rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": False}
_HF_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


class CheckpointError(ValueError):
    """A Hugging Face directory that does not hold a loadable Qwen3 checkpoint."""


# ----------------------------------------------------------------------------- config


def _rope_theta(hf: dict[str, Any], path: str) -> float:
    """rope_theta from either the flat key or transformers>=5 `rope_parameters`."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    rope_type = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type not in (None, "default"):
        raise CheckpointError(f"{path}: rope type {rope_type!r} is not supported (only default RoPE)")
    theta = params.get("rope_theta", hf.get("rope_theta"))
    if theta is None:
        raise CheckpointError(f"{path}: config.json has no rope_theta")
    return float(theta)


def config_from_hf(hf: dict[str, Any], path: str = "config.json", **overrides) -> Qwen3Config:
    """Qwen3Config from a parsed HF config.json; unsupported variants are clear errors."""
    archs = hf.get("architectures") or []
    if hf.get("model_type") != "qwen3" or any(a not in SUPPORTED_ARCHITECTURES for a in archs):
        raise CheckpointError(
            f"{path}: unsupported architecture model_type={hf.get('model_type')!r} "
            f"architectures={archs}; pipo_jax loads {SUPPORTED_ARCHITECTURES} (model_type 'qwen3')"
        )
    if hf.get("attention_bias"):
        raise CheckpointError(f"{path}: attention_bias=true is not supported (Qwen3 checkpoints use false)")
    if hf.get("use_sliding_window"):
        raise CheckpointError(f"{path}: use_sliding_window=true is not supported")
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{path}: hidden_act={hf.get('hidden_act')!r} is not supported (silu)")
    absent = [k for k in _REQUIRED_FIELDS if k not in hf]
    if absent:
        raise CheckpointError(f"{path}: config.json has no {', '.join(absent)}")
    kw = {k: hf[k] for k in _CONFIG_FIELDS if k in hf and k != "rope_theta"}
    kw["rope_theta"] = _rope_theta(hf, path)
    # Absent optional keys take transformers' Qwen3Config defaults (not our presets'),
    # so a checkpoint means here what it means to transformers.
    for k, v in _HF_DEFAULTS.items():
        kw.setdefault(k, v)
    kw.update(overrides)
    return Qwen3Config(**kw)


def config_to_hf(config: Qwen3Config) -> dict[str, Any]:
    """A config.json dict for `transformers.Qwen3ForCausalLM`."""
    hf = {k: getattr(config, k) for k in _CONFIG_FIELDS}
    hf.update(
        architectures=list(SUPPORTED_ARCHITECTURES),
        model_type="qwen3",
        hidden_act="silu",
        attention_bias=False,
        attention_dropout=0.0,
        use_sliding_window=False,
        initializer_range=0.02,
        torch_dtype=_HF_DTYPES[config.param_dtype],
        dtype=_HF_DTYPES[config.param_dtype],
        rope_scaling=None,
        use_cache=True,
    )
    return hf


# ----------------------------------------------------------------------------- names


def _hf_layout(config: Qwen3Config) -> dict[str, tuple[tuple[str, ...], int | None, Any]]:
    """HF tensor name -> (our param path, layer index or None, HF array -> our layout)."""
    c = config
    D, H, K, Dh = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    same = lambda w: w  # noqa: E731
    t = lambda w: w.T  # noqa: E731
    layout: dict[str, tuple[tuple[str, ...], int | None, Any]] = {
        "model.embed_tokens.weight": (("embed",), None, same),
        "model.norm.weight": (("final_norm",), None, same),
    }
    if not c.tie_word_embeddings:
        layout["lm_head.weight"] = (("lm_head",), None, t)
    per_layer = {
        "self_attn.q_proj.weight": ("q_proj", lambda w: w.T.reshape(D, H, Dh)),
        "self_attn.k_proj.weight": ("k_proj", lambda w: w.T.reshape(D, K, Dh)),
        "self_attn.v_proj.weight": ("v_proj", lambda w: w.T.reshape(D, K, Dh)),
        "self_attn.o_proj.weight": ("o_proj", lambda w: w.T.reshape(H, Dh, D)),
        "self_attn.q_norm.weight": ("q_norm", same),
        "self_attn.k_norm.weight": ("k_norm", same),
        "input_layernorm.weight": ("attn_norm", same),
        "post_attention_layernorm.weight": ("mlp_norm", same),
        "mlp.gate_proj.weight": ("gate_proj", t),
        "mlp.up_proj.weight": ("up_proj", t),
        "mlp.down_proj.weight": ("down_proj", t),
    }
    for i in range(c.num_hidden_layers):
        for suffix, (ours, fn) in per_layer.items():
            layout[f"model.layers.{i}.{suffix}"] = (("layers", ours), i, fn)
    return layout


def _to_hf(name: str, ours: np.ndarray, config: Qwen3Config) -> np.ndarray:
    """Inverse of the `_hf_layout` transforms (ours -> HF `[out, in]` layout)."""
    c = config
    if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
        return ours.reshape(c.hidden_size, -1).T
    if name.endswith("o_proj.weight"):
        return ours.reshape(-1, c.hidden_size).T
    if name.endswith(("gate_proj.weight", "up_proj.weight", "down_proj.weight", "lm_head.weight")):
        return ours.T
    return ours


def _get(tree: Params, path: tuple[str, ...]):
    for k in path:
        tree = tree[k]
    return tree


# ----------------------------------------------------------------------------- load


def _weight_files(path: str) -> dict[str, str]:
    """Tensor name -> safetensors file, from the index when there is one."""
    index = os.path.join(path, INDEX_FILE)
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no 'weight_map' object")
        files = {name: os.path.join(path, fname) for name, fname in weight_map.items()}
        for fname in sorted(set(files.values())):
            if not os.path.exists(fname):
                raise CheckpointError(f"{index} names {os.path.basename(fname)}, which is missing from {path}")
        return files
    shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not shards:
        raise CheckpointError(f"{path}: no *.safetensors files")
    files: dict[str, str] = {}
    for fname in shards:
        full = os.path.join(path, fname)
        with safe_open(full, framework="numpy") as f:
            for name in f.keys():
                files[name] = full
    return files


def _read_tensor(handle, name: str) -> np.ndarray:
    """One tensor as a numpy array (bf16 via ml_dtypes; safetensors' numpy API lacks it)."""
    try:
        return handle.get_tensor(name)
    except (TypeError, ValueError):
        return np.asarray(handle.get_slice(name)[:])


def load(path: str, dtype: str | Any = "float32", compute_dtype: str | None = None) -> tuple[Qwen3Config, Params]:
    """Loads a HF Qwen3 directory as (config, params) with parameters stored in `dtype`.

    Raises `CheckpointError` naming the file and tensor for a missing, unexpected or
    mis-shaped tensor, or an unsupported architecture.
    """
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise CheckpointError(f"{path}: no config.json")
    with open(cfg_path) as f:
        hf_cfg = json.load(f)
    dtype_name = jnp.dtype(dtype).name
    config = config_from_hf(hf_cfg, cfg_path, param_dtype=dtype_name, dtype=compute_dtype or dtype_name)
    layout = _hf_layout(config)
    shapes = param_shapes(config)
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype_name == "bfloat16" else np.dtype(dtype_name)
    host = jax.tree_util.tree_map(lambda s: np.empty(s, np_dtype), shapes, is_leaf=lambda x: isinstance(x, tuple))

    files = _weight_files(path)
    ignored = []
    if config.tie_word_embeddings and "lm_head.weight" in files:
        ignored.append("lm_head.weight")  # tied: HF may store the duplicate; embed wins
    unexpected = sorted(set(files) - set(layout) - set(ignored))
    if unexpected:
        with safe_open(files[unexpected[0]], framework="numpy") as f:
            found = tuple(f.get_slice(unexpected[0]).get_shape())
        raise CheckpointError(
            f"{path}: unexpected tensor(s) {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''} "
            f"in {os.path.basename(files[unexpected[0]])} ({unexpected[0]} has shape {found}; "
            f"config.json expects no such tensor)"
        )
    missing = sorted(set(layout) - set(files))
    if missing:
        raise CheckpointError(
            f"{path}: missing tensor(s) {missing[:5]}{' ...' if len(missing) > 5 else ''} "
            f"({missing[0]} expected with shape {_hf_shape(missing[0], layout, host, config)}, found none)")
    if ignored:
        log.info("%s: tie_word_embeddings=true, ignoring stored %s", path, ignored)

    by_file: dict[str, list[str]] = {}
    for name in layout:
        by_file.setdefault(files[name], []).append(name)
    for fname, names in by_file.items():
        with safe_open(fname, framework="numpy") as f:
            for name in names:
                ours_path, layer, fn = layout[name]
                target = _get(host, ours_path)
                expected = target.shape[1:] if layer is not None else target.shape
                raw = _read_tensor(f, name)
                try:
                    value = fn(raw)
                    ok = value.shape == tuple(expected)
                except ValueError:
                    ok = False
                if not ok:
                    hf_expected = _hf_shape(name, layout, host, config)
                    raise CheckpointError(
                        f"{fname}: tensor {name} has shape {tuple(raw.shape)}, expected {tuple(hf_expected)} "
                        f"for config.json"
                    )
                if layer is None:
                    target[...] = value
                else:
                    target[layer] = value
    if ignored:
        _check_tied_head(files["lm_head.weight"], host["embed"])
    params = jax.tree_util.tree_map(jnp.asarray, host)
    return config, params


def _hf_shape(name: str, layout, host: Params, config: Qwen3Config) -> tuple[int, ...]:
    """The HF shape config.json implies for tensor `name`."""
    ours_path, layer, _ = layout[name]
    target = _get(host, ours_path)
    expected = target.shape[1:] if layer is not None else target.shape
    return tuple(_to_hf(name, np.empty(expected, np.int8), config).shape)


def _check_tied_head(fname: str, embed_vd: np.ndarray) -> None:
    """A tied checkpoint may store lm_head.weight, but only as a copy of the embedding."""
    with safe_open(fname, framework="numpy") as f:
        head = _read_tensor(f, "lm_head.weight")
    if head.shape != embed_vd.shape or not np.array_equal(head.astype(embed_vd.dtype), embed_vd):
        raise CheckpointError(
            f"{fname}: tie_word_embeddings=true but the stored lm_head.weight (shape {tuple(head.shape)}) differs "
            f"from model.embed_tokens.weight (shape {tuple(embed_vd.shape)}): set tie_word_embeddings=false in "
            f"config.json if the head is a separate matrix")


# ----------------------------------------------------------------------------- save


def save(path: str, config: Qwen3Config, params: Params, max_shard_bytes: int = 4 << 30) -> None:
    """Writes config.json and safetensors shards (with an index when there are several)."""
    os.makedirs(path, exist_ok=True)
    for fname in os.listdir(path):  # shards of an earlier save would be read back as extras
        if _is_stale_shard(fname) or fname == INDEX_FILE:
            os.remove(os.path.join(path, fname))
    layout = _hf_layout(config)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, (ours_path, layer, _) in layout.items():
        leaf = _get(params, ours_path)
        arr = np.asarray(leaf if layer is None else leaf[layer])
        arr = np.ascontiguousarray(_to_hf(name, arr, config))
        if size and size + arr.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = arr
        size += arr.nbytes
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config_to_hf(config), f, indent=2)
    if len(shards) == 1:
        save_file(shards[0], os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    total = 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(path, fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
        total += sum(a.nbytes for a in shard.values())
    with open(os.path.join(path, INDEX_FILE), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def _is_stale_shard(fname: str) -> bool:
    return bool(re.fullmatch(r"model(-\d{5}-of-\d{5})?\.safetensors", fname))
