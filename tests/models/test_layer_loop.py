"""The program forms are the same function: the layer loop (`Qwen3Config.layer_loop`: one
`lax.scan` over the stacked layers, or unrolled over static per-layer slices) and the dense
layers (`dense_form`: einsums over `[B, T, ...]`, or 2-D matmuls over flattened tokens). Logits,
gradients, cached decode, sampling and the slot engine agree with the accelerator form (scan,
batched); "auto" follows the target platform, never the host."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.models import qwen3
from pipo_jax.sampling import continuous_batching, decode, sampler
from pipo_jax.sampling.engine import Engine
from pipo_jax.sampling.sampling_params import SamplingParams
from tests import jitted

BASE = qwen3.preset("tiny").replace(num_hidden_layers=3)
# The accelerator form (the reference) first, then the others; UNROLL_FLAT is what "auto" picks on cpu.
FORMS = {f"{loop}_{dense}": BASE.replace(layer_loop=loop, dense_form=dense)
         for loop, dense in (("scan", "batched"), ("unroll", "flat"), ("unroll", "batched"), ("scan", "flat"))}
SCAN, UNROLL = FORMS["scan_batched"], FORMS["unroll_flat"]
OTHERS = [name for name in FORMS if name != "scan_batched"]


@pytest.fixture(scope="module")
def params():
    return qwen3.init_params(BASE, jax.random.key(0), std=0.1)


@pytest.fixture(scope="module")
def batch():
    tokens = jax.random.randint(jax.random.key(1), (3, 9), 0, BASE.vocab_size)
    mask = jnp.array([[0, 0, 0, 1, 1, 1, 1, 1, 1], [1] * 9, [1, 1, 1, 1, 0, 0, 0, 0, 0]])
    return tokens, mask


@pytest.mark.parametrize("platform, cpu_form", [("cpu", True), ("cuda", False), ("tpu", False)])
def test_auto_follows_the_target_platform(platform, cpu_form):
    assert BASE.replace(platform=platform).unrolled_layers is cpu_form
    assert BASE.replace(platform=platform, layer_loop="scan").unrolled_layers is False
    assert BASE.replace(platform=platform, layer_loop="unroll").unrolled_layers is True
    assert BASE.replace(platform=platform).flat_tokens is cpu_form
    assert BASE.replace(platform=platform, dense_form="batched").flat_tokens is False
    assert BASE.replace(platform=platform, dense_form="flat").flat_tokens is True


def test_bad_layer_loop_or_dense_form_is_refused():
    with pytest.raises(ValueError, match="layer_loop='loop'"):
        BASE.replace(layer_loop="loop")
    with pytest.raises(ValueError, match="dense_form='2d'"):
        BASE.replace(dense_form="2d")


@pytest.mark.parametrize("in_dims, w_shape, n", [(1, (8, 3, 4), 4), (2, (3, 4, 8), 2), (1, (8, 5), 5)])
def test_project_forms_equal_the_einsum(in_dims, w_shape, n):
    x = jax.random.normal(jax.random.key(5), (2, 3) + w_shape[:in_dims])
    w = jax.random.normal(jax.random.key(6), w_shape)
    expected = np.tensordot(np.asarray(x, np.float64), np.asarray(w, np.float64), axes=in_dims)
    stack = qwen3.ColumnStack.split(w, n, in_dims)
    assert stack.blocks_nio.shape == (n, np.prod(w_shape[:in_dims]), np.prod(w_shape[in_dims:]) // n)
    np.testing.assert_array_equal(stack.whole(), w.reshape(stack.whole().shape))
    for dense in ("flat", "batched"):
        config = BASE.replace(dense_form=dense)
        got = qwen3.project(config, x, w, in_dims)
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        got = qwen3.project(config, x, stack, in_dims)  # a stack's output is flat
        assert got.shape == (2, 3, expected[0, 0].size)
        np.testing.assert_allclose(got, expected.reshape(got.shape), rtol=1e-5, atol=1e-5)
        transposed = qwen3.TransposedWeight.of(w, in_dims)
        assert transposed.w_oi.shape == (np.prod(w_shape[in_dims:]), np.prod(w_shape[:in_dims]))
        for rows in (x, x[:, :1]):  # several tokens per row, and one (a decode step)
            got = qwen3.project(config, rows, transposed, in_dims)
            assert got.shape == expected[:, : rows.shape[1]].shape
            np.testing.assert_allclose(got, expected[:, : rows.shape[1]], rtol=1e-5, atol=1e-5)


def test_column_stack_refuses_a_count_that_does_not_divide():
    with pytest.raises(ValueError, match=r"shape \(8, 5\) into 2 blocks"):
        qwen3.ColumnStack.split(jnp.zeros((8, 5)), 2)


@pytest.mark.parametrize("shape, dtype, n", [((512, 1024), jnp.float32, 4), ((512, 512), jnp.float32, 2),
                                             ((512, 1024), jnp.bfloat16, 2), ((512, 2048), jnp.float32, 1),
                                             ((64, 64), jnp.float32, 1), ((512, 5 * 64), jnp.float32, 1)])
def test_stack_blocks_by_size(shape, dtype, n):
    """Blocks of about 512 KiB for matrices under 3 MiB, a count that divides the columns:
    the benchmark model's q/k/v (2 MiB) takes 4 and o (1 MiB) 2; Eigen spreads 4 MiB itself."""
    assert decode.stack_blocks(*shape, dtype) == n


def test_flat_form_only_for_several_tokens_outside_a_sharding_context():
    """The flat form reshapes the tokens into one axis; one-token decode steps and programs
    under a `sharding_context` (partitioned by the named axes) keep the einsum."""
    from pipo_jax import parallel

    flat = BASE.replace(dense_form="flat")
    w = jnp.ones((8, 4))

    def reshapes(x):
        return str(jax.make_jaxpr(lambda x: qwen3.project(flat, x, w))(x)).count("reshape")

    assert reshapes(jnp.ones((2, 3, 8))) > 0 and reshapes(jnp.ones((2, 1, 8))) == 0
    with parallel.sharding_context(parallel.make_mesh(1, 1, 1, devices=jax.devices()[:1])):
        assert reshapes(jnp.ones((2, 3, 8))) == 0


def test_programs_under_a_sharding_context_scan_the_layers(params, batch):
    """A cpu program under a mesh keeps the accelerator loop (unrolled, XLA:CPU gathers every
    layer's fsdp shards at once); a one-device cpu program unrolls."""
    from pipo_jax import parallel

    tokens, mask = batch
    config = BASE.replace(platform="cpu")

    def lowered():
        return jax.jit(lambda p, t, m: qwen3.logits(config, p, t, m)).lower(params, tokens, mask).as_text()

    assert qwen3.layers_unrolled(config) and "stablehlo.while" not in lowered()
    with parallel.sharding_context(parallel.make_mesh(1, 1, 1, devices=jax.devices()[:1])):
        assert not qwen3.layers_unrolled(config) and "stablehlo.while" in lowered()
        assert not isinstance(decode.compute_params(config, params)["layers"], tuple)


def test_flat_form_gradients_need_no_transposes():
    """Why the cpu form is flat: XLA:CPU lowers the gradient of the block's output projection and
    MLP in the einsum form over `[B, T, ...]` with transposes of the activations (5 here); in the
    flat form with none."""
    d, f = 32, 64
    lp = {"gate_proj": jnp.ones((d, f)), "up_proj": jnp.ones((d, f)), "down_proj": jnp.ones((f, d)),
          "o_proj": jnp.ones((4, 16, d)), "mlp_norm": jnp.ones((d,))}
    x, a = jnp.ones((4, 6, d)), jnp.ones((4, 6, 4, 16))
    transposes = {}
    for dense in ("flat", "batched"):
        config = BASE.replace(hidden_size=d, intermediate_size=f, dense_form=dense)
        grad = jax.jit(jax.grad(lambda p: jnp.sum(qwen3.layer_out(config, x, p, a) ** 2)))
        transposes[dense] = len(re.findall(r"\} transpose\(", grad.lower(lp).compile().as_text()))
    assert transposes["flat"] == 0 < transposes["batched"], transposes


def test_accelerator_programs_keep_the_layer_scan_on_a_cpu_host(params, batch):
    """A program built for tpu / cuda on this CPU host scans the layers; one built for cpu does not."""
    tokens, mask = batch
    for platform, scans in (("tpu", True), ("cuda", True), ("cpu", False)):
        config = BASE.replace(platform=platform, attention_impl="xla")
        text = jax.jit(lambda p, t, m: qwen3.logits(config, p, t, m)).lower(params, tokens, mask).as_text()
        assert ("stablehlo.while" in text) is scans, platform


@pytest.mark.parametrize("form", OTHERS)
@pytest.mark.parametrize("remat", ["none", "full"])
def test_forward_and_gradients_equal(params, batch, remat, form):
    tokens, mask = batch

    def loss(config, p):
        logp = jax.nn.log_softmax(jitted.logits(config, p, tokens, mask))
        picked = jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1)[..., 0]
        return -jnp.sum(picked * mask[:, 1:]) / jnp.sum(mask[:, 1:])

    scan, unroll = SCAN.replace(remat=remat), FORMS[form].replace(remat=remat)
    np.testing.assert_allclose(jitted.logits(unroll, params, tokens, mask), jitted.logits(scan, params, tokens, mask),
                               rtol=1e-5, atol=1e-5)
    g_scan = jax.jit(jax.grad(lambda p: loss(scan, p)))(params)
    g_unroll = jax.jit(jax.grad(lambda p: loss(unroll, p)))(params)
    for path, a, b in zip(jax.tree_util.tree_leaves_with_path(g_scan), jax.tree.leaves(g_scan),
                          jax.tree.leaves(g_unroll)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path[0]))


@pytest.mark.parametrize("form", OTHERS)
def test_cached_forward_equal(params, batch, form):
    tokens, mask = batch
    positions = qwen3.default_positions(mask)
    outs = []
    for config in (SCAN, FORMS[form]):
        cache = qwen3.init_cache(config, 3, 12)
        logits, cache = jitted.forward(config, params, tokens, mask, positions, cache)
        hidden, dcache = jax.jit(decode.cached_forward, static_argnums=0)(
            config, decode.compute_params(config, params), decode.init_cache(config, 3, 12), tokens, positions, mask)
        outs.append((logits, cache, hidden, dcache))
    for a, b in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1])):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", OTHERS)
def test_sampled_tokens_equal(params, batch, form):
    tokens, mask = batch
    outs = [sampler.generate(config, params, tokens, mask, jax.random.key(3),
                             SamplingParams(max_new_tokens=7, temperature=1.0, stop_token_ids=(), pad_id=0))
            for config in (SCAN, FORMS[form])]
    np.testing.assert_array_equal(outs[1].tokens_br, outs[0].tokens_br)
    np.testing.assert_allclose(outs[1].logprobs_br, outs[0].logprobs_br, rtol=1e-5, atol=1e-5)


def test_one_row_decode_equal(params, batch, monkeypatch):
    """Batch-1 decode in the cpu form takes the small attention projections as column stacks
    (`decode.one_row_layer`; blocks of 8 KiB here, so the tiny model's q/k/v and o take 4
    and 2 as the benchmark model's do); tokens and log-probs equal the accelerator form's."""
    monkeypatch.setattr(decode, "STACK_BLOCK_BYTES", 2**13)
    weights = decode.compute_params(UNROLL, params, rows=1)
    for i, layer in enumerate(weights["layers"]):
        assert not {"q_proj", "k_proj", "v_proj"} & set(layer), "q, k and v live in qkv_proj"
        qkv_io = jnp.concatenate([params["layers"][name][i].reshape(64, -1) for name in ("q_proj", "k_proj", "v_proj")],
                                 axis=-1)
        for name, n, whole in (("qkv_proj", 4, qkv_io), ("o_proj", 2, params["layers"]["o_proj"][i].reshape(64, 64))):
            assert isinstance(layer[name], qwen3.ColumnStack) and layer[name].blocks_nio.shape[0] == n, name
            np.testing.assert_array_equal(layer[name].whole(), whole)
    for rows in (None, 2):
        leaves = jax.tree.leaves(decode.compute_params(UNROLL, params, rows=rows),
                                 is_leaf=lambda x: isinstance(x, qwen3.ColumnStack))
        assert not any(isinstance(w, qwen3.ColumnStack) for w in leaves)
    tokens, mask = batch
    for row in range(3):
        outs = [sampler.generate(config, params, tokens[row:row + 1], mask[row:row + 1], jax.random.key(3),
                                 SamplingParams(max_new_tokens=7, temperature=1.0, stop_token_ids=(), pad_id=0))
                for config in (SCAN, UNROLL)]
        np.testing.assert_array_equal(outs[1].tokens_br, outs[0].tokens_br)
        np.testing.assert_allclose(outs[1].logprobs_br, outs[0].logprobs_br, rtol=1e-5, atol=1e-5)


def test_one_row_layer_equals_the_layer(params, monkeypatch):
    """One decoder layer's q, k, v and output on one token with the stacks (4 and 2 blocks)
    equal the plain weights', to float32 rounding."""
    monkeypatch.setattr(decode, "STACK_BLOCK_BYTES", 2**13)
    layer = qwen3.layer_params(params, 1)
    stacked = decode.one_row_layer(layer)
    assert stacked["qkv_proj"].blocks_nio.shape == (4, 64, 32) and stacked["o_proj"].blocks_nio.shape == (2, 64, 32)
    x_btd = jax.random.normal(jax.random.key(7), (1, 1, 64))
    cos, sin = qwen3.rope_tables(jnp.array([[5]]), BASE.head_dim, BASE.rope_theta)
    for got, want in zip(qwen3.layer_qkv(UNROLL, x_btd, stacked, cos, sin), qwen3.layer_qkv(UNROLL, x_btd, layer, cos, sin)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    a_bthd = jax.random.normal(jax.random.key(8), (1, 1, 4, 16))
    np.testing.assert_allclose(qwen3.layer_out(UNROLL, x_btd, stacked, a_bthd), qwen3.layer_out(UNROLL, x_btd, layer, a_bthd),
                               rtol=1e-6, atol=1e-6)


def test_multi_row_decode_equal(batch, monkeypatch):
    """Decode of `TRANSPOSED_MIN_ROWS` rows or more (2 here) in the cpu form takes every dense
    weight and the (untied) head of `TRANSPOSED_MIN_BYTES` or more (any size here) transposed;
    tokens and log-probs equal the accelerator form's."""
    scan, unroll = (config.replace(tie_word_embeddings=False) for config in (SCAN, UNROLL))
    params = qwen3.init_params(scan, jax.random.key(0), std=0.1)
    monkeypatch.setattr(decode, "TRANSPOSED_MIN_ROWS", 2)
    # The tiny model's matrices (16-64 KiB) are under the size floor: they stay as stored.
    plain = decode.compute_params(unroll, params, rows=2)
    assert not any(isinstance(w, qwen3.TransposedWeight) for w in jax.tree.leaves(
        plain, is_leaf=lambda x: isinstance(x, qwen3.TransposedWeight)))
    monkeypatch.setattr(decode, "TRANSPOSED_MIN_BYTES", 0)
    weights = decode.compute_params(unroll, params, rows=2)
    assert isinstance(weights["lm_head"], qwen3.TransposedWeight)
    np.testing.assert_array_equal(weights["lm_head"].w_oi, params["lm_head"].T)
    for i, layer in enumerate(weights["layers"]):
        for name, in_dims in qwen3.DENSE_IN_DIMS.items():
            w = params["layers"][name][i]
            assert isinstance(layer[name], qwen3.TransposedWeight) and layer[name].out_shape == w.shape[in_dims:], name
            np.testing.assert_array_equal(layer[name].w_oi.T.reshape(w.shape), w)
    assert not isinstance(decode.compute_params(unroll, params, rows=1)["lm_head"], qwen3.TransposedWeight)
    assert not isinstance(decode.compute_params(scan, params, rows=2)["lm_head"], qwen3.TransposedWeight)
    tokens, mask = batch
    outs = [sampler.generate(config, params, tokens, mask, jax.random.key(3),
                             SamplingParams(max_new_tokens=7, temperature=1.0, stop_token_ids=(), pad_id=0))
            for config in (scan, unroll)]
    np.testing.assert_array_equal(outs[1].tokens_br, outs[0].tokens_br)
    np.testing.assert_allclose(outs[1].logprobs_br, outs[0].logprobs_br, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("slots", [2, 1])
def test_slot_engine_equal(params, slots, monkeypatch):
    """The engine in the accelerator form and in the cpu form ("auto" on cpu; one slot
    decodes with column stacks, of 8 KiB blocks here, and two with transposed weights, from
    2 rows and any size here)."""
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    sp = SamplingParams(max_new_tokens=6, temperature=1.0, stop_token_ids=(), pad_id=0)
    monkeypatch.setattr(decode, "STACK_BLOCK_BYTES", 2**13)
    monkeypatch.setattr(decode, "TRANSPOSED_MIN_ROWS", 2)
    monkeypatch.setattr(decode, "TRANSPOSED_MIN_BYTES", 0)
    results = []
    for config in (SCAN, UNROLL):
        engine = Engine(config, sp, max_concurrent_decodes=slots, max_len=16, prefill_buckets=(8,))
        eparams = engine.load_params(params)
        layers = eparams.weights["layers"]
        o_proj = layers[0]["o_proj"] if isinstance(layers, tuple) else layers["o_proj"]
        assert isinstance(o_proj, qwen3.ColumnStack) is (config is UNROLL and slots == 1)
        assert isinstance(o_proj, qwen3.TransposedWeight) is (config is UNROLL and slots == 2)
        results.append(continuous_batching.rollout(engine, eparams, prompts, 2, jax.random.key(4)))
    scan, unroll = results
    np.testing.assert_array_equal(unroll.lengths, scan.lengths)
    for a, b in zip(scan.tokens, unroll.tokens):
        np.testing.assert_array_equal(b, a)
    for a, b in zip(scan.logprobs, unroll.logprobs):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
