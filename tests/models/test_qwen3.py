"""Qwen3 forward: KV cache, padding, presets, parameter axes, remat, dtypes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.models import qwen3
from tests import jitted

CONFIG = qwen3.preset("tiny")


@pytest.fixture(scope="module")
def params():
    return qwen3.init_params(CONFIG, jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def tokens():
    return jax.random.randint(jax.random.PRNGKey(1), (2, 10), 0, CONFIG.vocab_size)


def test_prefill_then_one_token_decode_equals_full_forward(params, tokens):
    full = jitted.logits(CONFIG, params, tokens)
    cache = qwen3.init_cache(CONFIG, batch=2, max_len=16)
    k = 4
    step = jax.jit(lambda p, t, pos, c: qwen3.forward(CONFIG, p, t, positions_bt=pos, cache=c))
    out, cache = step(params, tokens[:, :k], jnp.broadcast_to(jnp.arange(k), (2, k)), cache)
    outs = [out]
    for t in range(k, 10):
        out, cache = step(params, tokens[:, t : t + 1], jnp.full((2, 1), t), cache)
        outs.append(out)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, atol=1e-5)
    # The cache holds exactly positions 0..9; slots beyond stay empty.
    assert float(jnp.abs(cache.k[:, :, :, 10:]).max()) == 0.0  # [L, B, K, S, Dh]
    assert float(jnp.abs(cache.k[:, :, :, :10]).min(axis=(2, 4)).max()) > 0.0


def test_decode_rows_at_different_positions(params, tokens):
    """Left-padded prefill of ragged prompts, then decode: each row equals its own full forward."""
    mask = jnp.array([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    prompt = tokens[:, :6]
    cache = qwen3.init_cache(CONFIG, batch=2, max_len=12)
    pos = qwen3.default_positions(mask)
    _, cache = jitted.forward(CONFIG, params, prompt, mask, pos, cache)
    nxt = tokens[:, 6:7]
    out, _ = jitted.forward(CONFIG, params, nxt, None, pos[:, -1:] + 1, cache)
    row0 = jitted.logits(CONFIG, params, jnp.concatenate([prompt[:1, 3:], nxt[:1]], axis=1))
    row1 = jitted.logits(CONFIG, params, jnp.concatenate([prompt[1:], nxt[1:]], axis=1))
    np.testing.assert_allclose(out[0, 0], row0[0, -1], atol=1e-5)
    np.testing.assert_allclose(out[1, 0], row1[0, -1], atol=1e-5)


def test_left_and_right_padding_leave_valid_logits_unchanged(params, tokens):
    ref = jitted.logits(CONFIG, params, tokens[:1, 2:8])
    left = jitted.logits(CONFIG, params, tokens[:1, :8], jnp.array([[0, 0, 1, 1, 1, 1, 1, 1]]))
    right = jitted.logits(CONFIG, params, tokens[:1, 2:], jnp.array([[1, 1, 1, 1, 1, 1, 0, 0]]))
    np.testing.assert_allclose(left[0, 2:], ref[0], atol=1e-5)
    np.testing.assert_allclose(right[0, :6], ref[0], atol=1e-5)
    assert np.isfinite(np.asarray(left)).all() and np.isfinite(np.asarray(right)).all()


def test_remat_policies_give_same_values_and_grads(params, tokens):
    def loss(p, config):
        return jnp.mean(jitted.logits(config, p, tokens) ** 2)

    base_v, base_g = jax.value_and_grad(loss)(params, CONFIG)
    for policy in ("full", "dots_saveable"):
        v, g = jax.value_and_grad(loss)(params, CONFIG.replace(remat=policy))
        np.testing.assert_allclose(v, base_v, rtol=1e-6)
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), g, base_g)


def test_bfloat16_compute_is_close_to_float32(params, tokens):
    config = CONFIG.replace(param_dtype="bfloat16", dtype="bfloat16")
    p16 = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
    out = jitted.logits(config, p16, tokens)
    assert out.dtype == jnp.float32
    assert jitted.hidden_states(config, p16, tokens).dtype == jnp.bfloat16
    ref = jitted.logits(CONFIG, params, tokens)
    err = float(jnp.max(jnp.abs(out - ref)))
    assert 0.0 < err < 0.05 * float(jnp.max(jnp.abs(ref))) + 1e-2


def test_param_axes_match_param_tree(params):
    axes = qwen3.param_axes(CONFIG)
    is_axes = lambda x: isinstance(x, tuple)  # noqa: E731
    assert jax.tree_util.tree_structure(axes, is_leaf=is_axes) == jax.tree_util.tree_structure(params)
    for a, p in zip(jax.tree_util.tree_leaves(axes, is_leaf=is_axes), jax.tree_util.tree_leaves(params)):
        assert len(a) == p.ndim
        assert set(a) <= {"embed", "vocab", "heads", "kv_heads", "head_dim", "mlp", "layers"}
    untied = CONFIG.replace(tie_word_embeddings=False)
    assert qwen3.param_axes(untied)["lm_head"] == ("embed", "vocab")
    assert qwen3.init_params(untied, jax.random.PRNGKey(0))["lm_head"].shape == (64, 256)


@pytest.mark.parametrize(
    "name,non_embedding,total",
    # Published model cards, to the precision they print: 0.6B (0.44B non-embedding),
    # 1.7B (1.4B), 4.0B (3.6B), 8.2B (6.95B).
    [("qwen3_0.6b", "0.44", "0.6"), ("qwen3_1.7b", "1.4", "1.7"), ("qwen3_4b", "3.6", "4.0"), ("qwen3_8b", "6.95", "8.2")],
)
def test_presets_have_published_parameter_counts(name, non_embedding, total):
    c = qwen3.preset(name)
    embedding = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    as_card = lambda n, like: f"{n / 1e9:.{len(like.split('.')[1])}f}"  # noqa: E731
    assert as_card(c.num_params - embedding, non_embedding) == non_embedding
    assert as_card(c.num_params, total) == total
    assert c.vocab_size == 151_936 and c.head_dim == 128 and c.rope_theta == 1e6


def test_num_params_counts_init_params():
    for tied in (True, False):
        c = CONFIG.replace(tie_word_embeddings=tied)
        p = qwen3.init_params(c, jax.random.PRNGKey(0))
        assert sum(x.size for x in jax.tree_util.tree_leaves(p)) == c.num_params


@pytest.mark.parametrize("param_dtype, std", [("float32", 0.02), ("bfloat16", 0.1)])
def test_init_params_equals_its_leaf_by_leaf_draws_bit_for_bit(param_dtype, std):
    """Leaf i is `std * normal(split(rng, leaves)[i])` drawn and scaled op by op (the form every
    recorded run was initialised with), the norms ones: equal to the last bit, so no record moves."""
    c = CONFIG.replace(param_dtype=param_dtype, tie_word_embeddings=False)
    rng = jax.random.PRNGKey(3)
    got, treedef = jax.tree_util.tree_flatten_with_path(qwen3.init_params(c, rng, std=std))
    keys = jax.random.split(rng, len(got))
    for (path, leaf), key in zip(got, keys):
        if path[-1].key.endswith("norm"):
            expected = jnp.ones(leaf.shape, c.jnp_param_dtype)
        else:
            expected = (std * jax.random.normal(key, leaf.shape, jnp.float32)).astype(c.jnp_param_dtype)
        assert leaf.dtype == expected.dtype, path
        np.testing.assert_array_equal(np.asarray(leaf, np.float32), np.asarray(expected, np.float32), str(path))


def test_layers_are_scanned_so_program_size_does_not_grow_with_depth(tokens):
    """With `layer_loop="scan"` (what "auto" picks for cuda / tpu)."""
    def hlo_size(layers):
        c = CONFIG.replace(num_hidden_layers=layers, layer_loop="scan")
        p = jax.eval_shape(lambda: qwen3.init_params(c, jax.random.PRNGKey(0)))
        text = jax.jit(lambda p: qwen3.logits(c, p, tokens)).lower(p).as_text()
        return text.count("\n"), text.count("dot_general")

    assert hlo_size(12) == hlo_size(2)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="num_attention_heads=6 is not a multiple of num_key_value_heads=4"):
        CONFIG.replace(num_attention_heads=6, num_key_value_heads=4)
    with pytest.raises(ValueError, match="dtype='fp8'"):
        CONFIG.replace(dtype="fp8")
    with pytest.raises(ValueError, match="remat='some'"):
        CONFIG.replace(remat="some")
    with pytest.raises(ValueError, match="unknown Qwen3 preset 'qwen3_70b'"):
        qwen3.preset("qwen3_70b")
