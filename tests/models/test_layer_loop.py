"""The two layer-loop forms (`Qwen3Config.layer_loop`: one `lax.scan` over the stacked layers,
or unrolled over static per-layer slices) are the same function: logits, gradients, cached
decode, sampling and the slot engine agree; "auto" follows the target platform, never the host."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.models import qwen3
from pipo_jax.sampling import continuous_batching, decode, sampler
from pipo_jax.sampling.engine import Engine
from pipo_jax.sampling.sampling_params import SamplingParams

BASE = qwen3.preset("tiny").replace(num_hidden_layers=3)
SCAN, UNROLL = BASE.replace(layer_loop="scan"), BASE.replace(layer_loop="unroll")


@pytest.fixture(scope="module")
def params():
    return qwen3.init_params(BASE, jax.random.key(0), std=0.1)


@pytest.fixture(scope="module")
def batch():
    tokens = jax.random.randint(jax.random.key(1), (3, 9), 0, BASE.vocab_size)
    mask = jnp.array([[0, 0, 0, 1, 1, 1, 1, 1, 1], [1] * 9, [1, 1, 1, 1, 0, 0, 0, 0, 0]])
    return tokens, mask


@pytest.mark.parametrize("platform, unrolled", [("cpu", True), ("cuda", False), ("tpu", False)])
def test_auto_follows_the_target_platform(platform, unrolled):
    assert BASE.replace(platform=platform).unrolled_layers is unrolled
    assert BASE.replace(platform=platform, layer_loop="scan").unrolled_layers is False
    assert BASE.replace(platform=platform, layer_loop="unroll").unrolled_layers is True


def test_bad_layer_loop_is_refused():
    with pytest.raises(ValueError, match="layer_loop='loop'"):
        BASE.replace(layer_loop="loop")


def test_accelerator_programs_keep_the_layer_scan_on_a_cpu_host(params, batch):
    """A program built for tpu / cuda on this CPU host scans the layers; one built for cpu does not."""
    tokens, mask = batch
    for platform, scans in (("tpu", True), ("cuda", True), ("cpu", False)):
        config = BASE.replace(platform=platform, attention_impl="xla")
        text = jax.jit(lambda p, t, m: qwen3.logits(config, p, t, m)).lower(params, tokens, mask).as_text()
        assert ("stablehlo.while" in text) is scans, platform


@pytest.mark.parametrize("remat", ["none", "full"])
def test_forward_and_gradients_equal(params, batch, remat):
    tokens, mask = batch

    def loss(config, p):
        logp = jax.nn.log_softmax(qwen3.logits(config, p, tokens, mask))
        picked = jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1)[..., 0]
        return -jnp.sum(picked * mask[:, 1:]) / jnp.sum(mask[:, 1:])

    scan, unroll = SCAN.replace(remat=remat), UNROLL.replace(remat=remat)
    np.testing.assert_allclose(qwen3.logits(unroll, params, tokens, mask), qwen3.logits(scan, params, tokens, mask),
                               rtol=1e-5, atol=1e-5)
    g_scan = jax.grad(lambda p: loss(scan, p))(params)
    g_unroll = jax.grad(lambda p: loss(unroll, p))(params)
    for path, a, b in zip(jax.tree_util.tree_leaves_with_path(g_scan), jax.tree.leaves(g_scan),
                          jax.tree.leaves(g_unroll)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path[0]))


def test_cached_forward_equal(params, batch):
    tokens, mask = batch
    positions = qwen3.default_positions(mask)
    outs = {}
    for config in (SCAN, UNROLL):
        cache = qwen3.init_cache(config, 3, 12)
        logits, cache = qwen3.forward(config, params, tokens, mask, positions, cache)
        hidden, dcache = decode.cached_forward(config, decode.compute_params(config, params),
                                               decode.init_cache(config, 3, 12), tokens, positions, mask)
        outs[config.layer_loop] = (logits, cache, hidden, dcache)
    for a, b in zip(jax.tree.leaves(outs["scan"]), jax.tree.leaves(outs["unroll"])):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_sampled_tokens_equal(params, batch):
    tokens, mask = batch
    outs = [sampler.generate(config, params, tokens, mask, jax.random.key(3),
                             SamplingParams(max_new_tokens=7, temperature=1.0, stop_token_ids=(), pad_id=0))
            for config in (SCAN, UNROLL)]
    np.testing.assert_array_equal(outs[1].tokens_br, outs[0].tokens_br)
    np.testing.assert_allclose(outs[1].logprobs_br, outs[0].logprobs_br, rtol=1e-5, atol=1e-5)


def test_slot_engine_equal(params):
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    sp = SamplingParams(max_new_tokens=6, temperature=1.0, stop_token_ids=(), pad_id=0)
    results = []
    for config in (SCAN, UNROLL):
        engine = Engine(config, sp, max_concurrent_decodes=2, max_len=16, prefill_buckets=(8,))
        results.append(continuous_batching.rollout(engine, engine.load_params(params), prompts, 2, jax.random.key(4)))
    scan, unroll = results
    np.testing.assert_array_equal(unroll.lengths, scan.lengths)
    for a, b in zip(scan.tokens, unroll.tokens):
        np.testing.assert_array_equal(b, a)
    for a, b in zip(scan.logprobs, unroll.logprobs):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
