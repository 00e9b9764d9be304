"""The rollout interface: the one-jit sampler and the slot engine give the same responses."""

import jax
import numpy as np
import pytest

from pipo_jax.models import qwen3
from pipo_jax.sampling import generator
from pipo_jax.sampling.sampling_params import SamplingParams
from tests.sampling.test_sampler import left_padded

CONFIG = qwen3.preset("tiny").replace(vocab_size=64)
SAMPLING = SamplingParams(temperature=1.0, top_k=40, max_new_tokens=12, stop_token_ids=(3, 7, 11, 13, 17),
                          logprobs="tempered")


def test_slot_engine_equals_one_jit_sampler():
    params = qwen3.init_params(CONFIG, jax.random.PRNGKey(0), std=0.3)
    g = 3
    rng = np.random.RandomState(1)
    prompts = [list(rng.randint(20, 64, n)) for n in (3, 9, 5, 12)]
    tokens_bp, mask_bp = left_padded([p for p in prompts for _ in range(g)])
    key = jax.random.PRNGKey(7)
    one_jit = generator.OneJitSampler(CONFIG, SAMPLING)(params, tokens_bp, mask_bp, key)
    sampler = generator.SlotEngineSampler(CONFIG, SAMPLING, group_size=g, slots=5)
    slots = sampler(params, tokens_bp, mask_bp, key)
    np.testing.assert_array_equal(slots.tokens_br, np.asarray(one_jit.tokens_br))
    np.testing.assert_array_equal(slots.mask_br, np.asarray(one_jit.mask_br))
    np.testing.assert_array_equal(slots.lengths_b, np.asarray(one_jit.lengths_b))
    # cached decode in slots vs the batched while loop: float32 summation order only
    np.testing.assert_allclose(slots.logprobs_br, np.asarray(one_jit.logprobs_br), atol=1e-4)
    assert len(set(np.asarray(one_jit.lengths_b).tolist())) >= 3  # responses end at varied lengths
    assert generator.OneJitSampler.in_program and not generator.SlotEngineSampler.in_program
    # the sampler owns its engines: a second call reuses the one made (and compiled) by the first;
    # an equal sampler is another owner with none yet (no process-wide cache)
    engine = sampler.engine(tokens_bp.shape[0], tokens_bp.shape[1])
    again = sampler(params, tokens_bp, mask_bp, key)
    np.testing.assert_array_equal(again.tokens_br, slots.tokens_br)
    assert len(sampler.engines) == 1 and sampler.engine(tokens_bp.shape[0], tokens_bp.shape[1]) is engine
    other = generator.SlotEngineSampler(CONFIG, SAMPLING, group_size=g, slots=5)
    assert other == sampler and len(other.engines) == 0


def test_slot_engine_needs_whole_groups_of_one_prompt():
    params = qwen3.init_params(CONFIG, jax.random.PRNGKey(0))
    tokens_bp, mask_bp = left_padded([[21, 22], [23, 24, 25], [26]])
    with pytest.raises(ValueError, match="whole groups of 2"):
        generator.SlotEngineSampler(CONFIG, SAMPLING, group_size=2)(params, tokens_bp, mask_bp, jax.random.PRNGKey(0))
    tokens_bp, mask_bp = left_padded([[21, 22], [23, 24]])
    with pytest.raises(ValueError, match="same prompt"):
        generator.SlotEngineSampler(CONFIG, SAMPLING, group_size=2)(params, tokens_bp, mask_bp, jax.random.PRNGKey(0))
