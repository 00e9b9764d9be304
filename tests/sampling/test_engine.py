"""JetStream-style Engine and the continuous-batching driver reproduce the one-jit sampler."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.models import qwen3
from pipo_jax.sampling import continuous_batching, sampler
from pipo_jax.sampling.engine import DecodeState, Engine, Prefix
from pipo_jax.sampling.sampling_params import SamplingParams
from tests.sampling.test_sampler import left_padded

CONFIG = qwen3.preset("tiny").replace(vocab_size=64)
# Many stop ids on a 64-token vocabulary: responses end at varied lengths.
SAMPLING = SamplingParams(temperature=1.0, top_k=40, max_new_tokens=20, stop_token_ids=(3, 7, 11, 13, 17))


@pytest.fixture(scope="module")
def params():
    return qwen3.init_params(CONFIG, jax.random.PRNGKey(0), std=0.3)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.RandomState(0)
    return [list(rng.randint(20, 64, n)) for n in (3, 9, 5, 17, 2)]  # buckets 16 and 32


@pytest.fixture(scope="module")
def engine_and_params(params):
    engine = Engine(CONFIG, SAMPLING, max_concurrent_decodes=4, max_len=48, prefill_buckets=(16, 32), attn_block=16)
    return engine, engine.load_params(params)


def _one_jit(params, prompts, g, rng, sp=SAMPLING, budgets=None):
    rep = [p for p in prompts for _ in range(g)]
    tokens, mask = left_padded(rep)
    return sampler.generate(CONFIG, params, tokens, mask, rng, sp, max_new_b=budgets)


def test_rollout_equals_one_jit_generate(params, prompts, engine_and_params):
    engine, eparams = engine_and_params
    g = 3
    rng = jax.random.key(42)
    res = continuous_batching.rollout(engine, eparams, prompts, g, rng)
    ref = _one_jit(params, prompts, g, rng)
    tokens, logprobs, mask = res.padded(SAMPLING.max_new_tokens, SAMPLING.pad_id)
    np.testing.assert_array_equal(tokens, np.asarray(ref.tokens_br))
    np.testing.assert_array_equal(mask, np.asarray(ref.mask_br))
    np.testing.assert_allclose(logprobs, np.asarray(ref.logprobs_br), atol=1e-4)
    np.testing.assert_array_equal(res.lengths, np.asarray(ref.lengths_b))
    np.testing.assert_array_equal(res.stopped, np.asarray(ref.stopped_b))
    np.testing.assert_array_equal(res.prompt_index, np.repeat(np.arange(5), g))
    # The test exercises refills: varied lengths, more requests than slots.
    assert len(set(res.lengths.tolist())) >= 4 and res.stopped.any() and not res.stopped.all()
    assert res.stats["prefills"] == 5  # one prefill per prompt, shared by its G samples
    assert res.stats["resizes"] >= 2  # the cache grew and shrank along (16, 32, 48)
    assert res.stats["slot_steps_used"] == int(np.sum(res.lengths - 1))  # first tokens come from prefill
    assert engine.free_slots() == [0, 1, 2, 3]


def test_rollout_with_per_request_budgets_and_greedy(params, prompts):
    sp = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=(5,))
    engine = Engine(CONFIG, sp, max_concurrent_decodes=2, max_len=40, prefill_buckets=(32,))
    budgets = np.array([1, 12, 4, 7, 12, 2, 9, 3, 12, 5])
    res = continuous_batching.rollout(engine, engine.load_params(params), prompts, 2, jax.random.key(0), budgets)
    ref = _one_jit(params, prompts, 2, jax.random.key(0), sp, jnp.asarray(budgets))
    tokens, _, _ = res.padded(12)
    np.testing.assert_array_equal(tokens, np.asarray(ref.tokens_br))
    np.testing.assert_array_equal(res.lengths, np.asarray(ref.lengths_b))
    assert (res.lengths <= budgets).all()


def test_rollout_dispatches_a_step_ahead_without_stepping_past_budgets(params):
    """Each step is dispatched before the previous one is read; a request that ends by its
    budget is never stepped past it (one request of budget 9: exactly 8 decode steps), and a
    request that stops on a stop token costs its slot at most one idle step."""
    prompt = [[21, 22, 23]]
    sp = SamplingParams(temperature=0.0, max_new_tokens=9, stop_token_ids=())
    engine = Engine(CONFIG, sp, max_concurrent_decodes=1, max_len=16, prefill_buckets=(8,))
    res = continuous_batching.rollout(engine, engine.load_params(params), prompt, 1, jax.random.key(0))
    assert res.lengths.tolist() == [9] and res.stats["decode_steps"] == 8
    res = continuous_batching.rollout(engine, engine.load_params(params), prompt * 3, 1, jax.random.key(0),
                                      max_new_tokens=[1, 1, 1])  # every request ends at its prefill
    assert res.lengths.tolist() == [1, 1, 1] and res.stats["decode_steps"] == 0
    sp = SamplingParams(temperature=1.0, max_new_tokens=20, stop_token_ids=SAMPLING.stop_token_ids)
    engine = Engine(CONFIG, sp, max_concurrent_decodes=1, max_len=32, prefill_buckets=(8,))
    res = continuous_batching.rollout(engine, engine.load_params(params), prompt, 6, jax.random.key(1))
    stopped_late = int(np.sum(res.stopped & (res.lengths > 1)))  # stopped in a decode step (not at prefill)
    assert stopped_late >= 2
    assert int(np.sum(res.lengths - 1)) <= res.stats["decode_steps"] <= int(np.sum(res.lengths - 1)) + stopped_late


@pytest.mark.parametrize("steps", [2, 3])
def test_rollout_with_several_steps_per_call_equals_one_jit_generate(params, prompts, steps):
    """`steps_per_call` steps in one program: the same tokens and log-probs as the one-jit
    sampler (varied lengths, stop tokens, refills, per-request budgets), `steps` steps a call."""
    engine = Engine(CONFIG, SAMPLING, max_concurrent_decodes=4, max_len=48, prefill_buckets=(16, 32), attn_block=16,
                    steps_per_call=steps)
    budgets = np.array([1, 20, 4, 7, 20, 2, 9, 3, 20, 5, 13, 20, 6, 11, 20])
    rng = jax.random.key(42)
    res = continuous_batching.rollout(engine, engine.load_params(params), prompts, 3, rng, budgets)
    ref = _one_jit(params, prompts, 3, rng, budgets=jnp.asarray(budgets))
    tokens, logprobs, mask = res.padded(SAMPLING.max_new_tokens, SAMPLING.pad_id)
    np.testing.assert_array_equal(tokens, np.asarray(ref.tokens_br))
    np.testing.assert_array_equal(mask, np.asarray(ref.mask_br))
    np.testing.assert_allclose(logprobs, np.asarray(ref.logprobs_br), atol=1e-4)
    np.testing.assert_array_equal(res.stopped, np.asarray(ref.stopped_b))
    assert res.stats["slot_steps_used"] == int(np.sum(res.lengths - 1))
    assert engine.free_slots() == [0, 1, 2, 3]


def test_generate_steps_rows_equal_single_steps(params, prompts, engine_and_params):
    engine, eparams = engine_and_params
    multi = Engine(CONFIG, SAMPLING, max_concurrent_decodes=4, max_len=48, prefill_buckets=(16, 32), attn_block=16,
                   steps_per_call=3)
    state = engine.init_decode_state(48)
    for slot, p in enumerate(prompts[:3]):
        tok, length = engine.pad_to_bucket(p)
        state = engine.insert(engine.prefill(eparams, tok, length, jax.random.key(slot), 5), state, slot)
    copy = jax.tree.map(jnp.copy, state)
    rows = []
    for _ in range(3):
        state, r = engine.generate(eparams, state)
        rows.append(jax.device_get(r))
    _, many = multi.generate_steps(eparams, copy)
    for j, r in enumerate(rows):
        for a, b in zip(r, jax.device_get(many)):
            np.testing.assert_allclose(np.asarray(b)[j], np.asarray(a), rtol=1e-6, atol=1e-6)
    for slot in range(3):
        engine.free_resource(slot)
    with pytest.raises(ValueError, match="steps_per_call=0"):
        Engine(CONFIG, SAMPLING, max_concurrent_decodes=1, max_len=16, steps_per_call=0)


def test_manual_prefill_insert_generate(params, prompts, engine_and_params):
    """JetStream-style use by hand: two requests in slots 3 and 1, stepped together."""
    engine, eparams = engine_and_params
    keys = [jax.random.key(100), jax.random.key(200)]
    state = engine.init_decode_state()
    assert isinstance(state, DecodeState) and state.cache.k.shape == (2, 4, 2, 16, 16)  # [L, S, K, width, Dh]
    assert engine.cache_widths == (16, 32, 48)
    state = engine.resize(state, 32)
    outs = {}
    for slot, prompt, key in ((3, prompts[1], keys[0]), (1, prompts[4], keys[1])):
        toks, length = engine.pad_to_bucket(prompt)
        prefix = engine.prefill(eparams, toks, length, key)
        assert isinstance(prefix, Prefix) and prefix.cache.max_len == 16
        state = engine.insert(prefix, state, slot)
        outs[slot] = ([int(prefix.token)], [float(prefix.logprob)])
    old = state
    state, result = engine.generate(eparams, state)
    assert old.cache.k.is_deleted()  # the state was donated
    for _ in range(25):
        for slot, (t, lp) in outs.items():
            if result.valid_s[slot]:
                t.append(int(result.tokens_s[slot]))
                lp.append(float(result.logprobs_s[slot]))
        assert not bool(result.valid_s[0]) and not bool(result.valid_s[2])  # empty slots stay idle
        if bool(result.done_s[1]) and bool(result.done_s[3]):
            break
        state, result = engine.generate(eparams, state)
    kv = state.kv_cache()  # qwen3.KVCache view: slot 3 holds prompt 1 (9 tokens) + its tokens
    assert kv.k.shape == (2, 4, 2, 32, 16)  # [L, S, K, width, Dh]
    filled = 9 + len(outs[3][0]) - 1  # the last sampled token is never fed back
    assert float(jnp.abs(kv.k[:, 3, :, :filled]).max(axis=(1, 3)).min()) > 0
    assert float(jnp.abs(kv.k[:, 3, :, filled:]).max()) == 0.0
    for slot, prompt, key in ((3, prompts[1], keys[0]), (1, prompts[4], keys[1])):
        tokens, mask = left_padded([prompt])
        ref = sampler.generate(CONFIG, params, tokens, mask, key[None], SAMPLING)
        n = int(ref.lengths_b[0])
        assert outs[slot][0] == np.asarray(ref.tokens_br[0, :n]).tolist()
        np.testing.assert_allclose(outs[slot][1], np.asarray(ref.logprobs_br[0, :n]), atol=1e-4)


def test_resample_prefix_draws_the_first_token_with_the_new_key(engine_and_params, prompts):
    engine, eparams = engine_and_params
    toks, length = engine.pad_to_bucket(prompts[0])
    base = engine.prefill(eparams, toks, length, jax.random.key(1))
    for seed in (2, 3, 4):
        again = engine.resample_prefix(base, jax.random.key(seed))
        fresh = engine.prefill(eparams, toks, length, jax.random.key(seed))
        assert int(again.token) == int(fresh.token)
        np.testing.assert_allclose(float(again.logprob), float(fresh.logprob), atol=1e-6)


def test_engine_errors_name_the_problem(engine_and_params, prompts):
    engine, eparams = engine_and_params
    with pytest.raises(TypeError, match="load_params"):
        engine.generate({"embed": 0}, engine.init_decode_state())
    with pytest.raises(ValueError, match="largest prefill bucket"):
        engine.pad_to_bucket(list(range(40)))
    with pytest.raises(ValueError, match="empty prompt"):
        engine.pad_to_bucket([])
    with pytest.raises(ValueError, match="bucket"):
        engine.prefill(eparams, np.zeros((20,), np.int32), 3, jax.random.key(0))
    with pytest.raises(ValueError, match="max_len=48"):
        engine.prefill(eparams, np.zeros((32,), np.int32), 30, jax.random.key(0), max_new_tokens=20)
    with pytest.raises(ValueError, match="slot=4"):
        engine.free_resource(4)
    with pytest.raises(ValueError, match="cache_widths"):
        engine.resize(engine.init_decode_state(), 20)
    toks, length = engine.pad_to_bucket(list(range(1, 20)))
    with pytest.raises(ValueError, match="resize"):
        engine.insert(engine.prefill(eparams, toks, length, jax.random.key(0), 5), engine.init_decode_state(), 0)
    with pytest.raises(ValueError, match="request 3 \\(prompt 1\\)"):
        continuous_batching.rollout(engine, eparams, prompts, 2, jax.random.key(0),
                                    max_new_tokens=[5, 5, 5, 45, 5, 5, 5, 5, 5, 5])
    with pytest.raises(ValueError, match="prompt 1"):
        continuous_batching.rollout(engine, eparams, [[1, 2], list(range(1, 40))], 1, jax.random.key(0))
    with pytest.raises(ValueError, match="prefill_buckets"):
        Engine(CONFIG, SAMPLING, 2, 48, prefill_buckets=(32, 16))
