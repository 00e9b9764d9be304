"""Hugging Face parity and checkpoint I/O of the JAX Qwen3."""

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from pipo_jax.models import hf, qwen3
from tests import jitted
from tests.conftest import hf_logits, make_hf_qwen3


def _max_valid_diff(a, b, mask):
    return float(np.max(np.abs(a - b) * mask[..., None]))


def test_logits_match_transformers_on_right_padded_batch(hf_checkpoint, right_padded_batch):
    path, model, tied = hf_checkpoint
    tokens, mask = right_padded_batch
    config, params = hf.load(str(path))
    assert config.tie_word_embeddings == tied
    assert ("lm_head" in params) == (not tied)
    ours = np.asarray(jitted.logits(config, params, jnp.asarray(tokens), jnp.asarray(mask)))
    assert ours.shape == (3, 9, 128)
    assert _max_valid_diff(ours, hf_logits(model, tokens, mask), mask) <= 1e-4


def test_hidden_states_times_head_are_the_logits(hf_checkpoint, right_padded_batch):
    path, _, _ = hf_checkpoint
    tokens, mask = right_padded_batch
    config, params = hf.load(str(path))
    hidden = jitted.hidden_states(config, params, jnp.asarray(tokens), jnp.asarray(mask))
    assert hidden.shape == (3, 9, config.hidden_size)
    via_head = np.asarray(hidden @ qwen3.lm_head_weight(config, params))
    ours = np.asarray(jitted.logits(config, params, jnp.asarray(tokens), jnp.asarray(mask)))
    np.testing.assert_allclose(via_head, ours, atol=1e-5)


def test_save_then_transformers_loads_same_logits(hf_checkpoint, right_padded_batch, tmp_path):
    transformers = pytest.importorskip("transformers")
    path, model, _ = hf_checkpoint
    tokens, mask = right_padded_batch
    config, params = hf.load(str(path))
    hf.save(str(tmp_path / "out"), config, params)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    assert _max_valid_diff(hf_logits(reloaded, tokens, mask), hf_logits(model, tokens, mask), mask) == 0.0
    config2, params2 = hf.load(str(tmp_path / "out"))
    assert config2 == config
    jax.tree_util.tree_map(np.testing.assert_array_equal, params2, params)


def test_sharded_checkpoint_with_index_roundtrips(hf_checkpoint, right_padded_batch, tmp_path):
    path, model, _ = hf_checkpoint
    tokens, mask = right_padded_batch
    config, params = hf.load(str(path))
    out = tmp_path / "sharded"
    hf.save(str(out), config, params, max_shard_bytes=40_000)
    files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    assert len(files) > 2 and os.path.exists(out / hf.INDEX_FILE)
    config2, params2 = hf.load(str(out))
    ours = np.asarray(jitted.logits(config2, params2, jnp.asarray(tokens), jnp.asarray(mask)))
    assert _max_valid_diff(ours, hf_logits(model, tokens, mask), mask) <= 1e-4
    # Saving again with one shard removes the stale shards and index.
    hf.save(str(out), config, params)
    assert sorted(f for f in os.listdir(out) if "safetensors" in f) == ["model.safetensors"]


def test_transformers_sharded_save_loads(tmp_path, right_padded_batch):
    model = make_hf_qwen3(tmp_path / "src", tied=False, seed=3)
    model.save_pretrained(str(tmp_path / "sharded"), max_shard_size="50KB")
    assert os.path.exists(tmp_path / "sharded" / hf.INDEX_FILE)
    tokens, mask = right_padded_batch
    config, params = hf.load(str(tmp_path / "sharded"))
    ours = np.asarray(jitted.logits(config, params, jnp.asarray(tokens), jnp.asarray(mask)))
    assert _max_valid_diff(ours, hf_logits(model, tokens, mask), mask) <= 1e-4


def test_bfloat16_load(hf_checkpoint, right_padded_batch):
    path, model, _ = hf_checkpoint
    tokens, mask = right_padded_batch
    config, params = hf.load(str(path), dtype="bfloat16")
    assert params["layers"]["q_proj"].dtype == jnp.bfloat16 and config.dtype == "bfloat16"
    ours = np.asarray(jitted.logits(config, params, jnp.asarray(tokens), jnp.asarray(mask)))
    ref = hf_logits(model, tokens, mask)
    # bf16 weights and activations: ~3 significant digits; logits here are O(1).
    assert _max_valid_diff(ours, ref, mask) <= 0.1
    assert _max_valid_diff(ours, ref, mask) > 0.0


# ----------------------------------------------------------------------------- errors


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _edit_weights(path, fn):
    f = os.path.join(path, "model.safetensors")
    tensors = load_file(f)
    fn(tensors)
    save_file(tensors, f, metadata={"format": "pt"})


def test_missing_tensor_is_named(hf_checkpoint, tmp_path):
    path = _copy(hf_checkpoint[0], tmp_path / "ckpt")
    _edit_weights(path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(hf.CheckpointError, match=r"missing tensor.*model\.layers\.1\.mlp\.up_proj\.weight.*"
                       r"expected with shape \(96, 64\), found none"):
        hf.load(str(path))


def test_extra_tensor_is_named(hf_checkpoint, tmp_path):
    path = _copy(hf_checkpoint[0], tmp_path / "ckpt")
    _edit_weights(path, lambda t: t.__setitem__("model.layers.0.self_attn.q_proj.bias", np.zeros(64, np.float32)))
    with pytest.raises(hf.CheckpointError, match=r"unexpected tensor.*q_proj\.bias.*model\.safetensors.*"
                       r"has shape \(64,\); config.json expects no such tensor"):
        hf.load(str(path))


def test_misshaped_tensor_names_both_shapes(hf_checkpoint, tmp_path):
    path = _copy(hf_checkpoint[0], tmp_path / "ckpt")
    _edit_weights(path, lambda t: t.__setitem__("model.layers.0.self_attn.k_proj.weight", np.zeros((16, 64), np.float32)))
    with pytest.raises(hf.CheckpointError, match=r"k_proj\.weight has shape \(16, 64\), expected \(32, 64\)"):
        hf.load(str(path))


def test_unsupported_architecture(hf_checkpoint, tmp_path):
    path = _copy(hf_checkpoint[0], tmp_path / "ckpt")
    cfg_file = path / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg.update(model_type="llama", architectures=["LlamaForCausalLM"])
    cfg_file.write_text(json.dumps(cfg))
    with pytest.raises(hf.CheckpointError, match=r"unsupported architecture.*LlamaForCausalLM"):
        hf.load(str(path))


def test_missing_config_and_weights(tmp_path):
    with pytest.raises(hf.CheckpointError, match="no config.json"):
        hf.load(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(hf.config_to_hf(qwen3.preset("tiny"))))
    with pytest.raises(hf.CheckpointError, match=r"no \*\.safetensors"):
        hf.load(str(tmp_path))


def test_index_naming_a_missing_shard(hf_checkpoint, tmp_path):
    path = _copy(hf_checkpoint[0], tmp_path / "ckpt")
    (path / hf.INDEX_FILE).write_text(json.dumps({"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(hf.CheckpointError, match="model-00002-of-00002.safetensors, which is missing"):
        hf.load(str(path))


def test_config_roundtrip_and_rope_parameters():
    config = qwen3.preset("qwen3_8b")
    assert hf.config_from_hf(hf.config_to_hf(config)) == config
    d = hf.config_to_hf(config)
    d.pop("rope_theta")
    d["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    assert hf.config_from_hf(d).rope_theta == 5e5
    d["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0}
    with pytest.raises(hf.CheckpointError, match="rope type 'yarn'"):
        hf.config_from_hf(d)


def test_absent_config_keys_mean_what_they_mean_to_transformers():
    d = hf.config_to_hf(qwen3.preset("tiny"))
    for k in ("tie_word_embeddings", "rms_norm_eps", "max_position_embeddings"):
        d.pop(k)
    config = hf.config_from_hf(d)
    import transformers

    ref = transformers.Qwen3Config(**{k: v for k, v in d.items() if k not in ("architectures", "model_type")})
    assert config.tie_word_embeddings is False and ref.tie_word_embeddings is False
    assert (config.rms_norm_eps, config.max_position_embeddings) == (ref.rms_norm_eps, ref.max_position_embeddings)
    for key in ("intermediate_size", "num_key_value_heads", "head_dim"):
        with pytest.raises(hf.CheckpointError, match=f"config.json has no {key}"):
            hf.config_from_hf({k: v for k, v in d.items() if k != key})


def test_tied_config_with_a_different_stored_head_is_an_error(tmp_path):
    path = tmp_path / "ckpt"
    make_hf_qwen3(path, tied=True)
    _edit_weights(path, lambda t: t.__setitem__("lm_head.weight", t["model.embed_tokens.weight"].copy()))
    config, params = hf.load(str(path))  # an identical stored copy is fine
    assert "lm_head" not in params
    _edit_weights(path, lambda t: t.__setitem__("lm_head.weight", t["model.embed_tokens.weight"] + 1.0))
    with pytest.raises(hf.CheckpointError, match="tie_word_embeddings=true but the stored lm_head.weight"):
        hf.load(str(path))


def test_bfloat16_save_loads_in_transformers(hf_checkpoint, right_padded_batch, tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    path, _, _ = hf_checkpoint
    tokens, mask = right_padded_batch
    config, params = hf.load(str(path), dtype="bfloat16")
    assert jax.tree.leaves(params)[0].dtype == jnp.bfloat16
    hf.save(str(tmp_path / "bf16"), config, params)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "bf16"), dtype=torch.bfloat16).eval()
    sd = model.state_dict()
    assert sd["model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16
    # Same bf16 weights on both sides: transformers' float32 forward on them equals ours.
    np.testing.assert_array_equal(sd["model.layers.0.mlp.up_proj.weight"].float().numpy(),
                                  np.asarray(params["layers"]["up_proj"][0].astype(jnp.float32)).T)
    config2, params2 = hf.load(str(tmp_path / "bf16"), dtype="bfloat16")
    jax.tree_util.tree_map(np.testing.assert_array_equal, params2, params)
    ref = hf_logits(model.float(), tokens, mask)
    f32 = dataclasses.replace(config, param_dtype="float32", dtype="float32")
    ours = np.asarray(jitted.logits(f32, jax.tree.map(lambda x: x.astype(jnp.float32), params), jnp.asarray(tokens),
                                   jnp.asarray(mask)))
    assert _max_valid_diff(ours, ref, mask) <= 1e-4
