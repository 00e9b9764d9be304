"""The micro-batch machinery: the device-local layout, and `learn.rollout_passes` (behaviour,
reference and teacher log-probs, values, entropies one micro-batch at a time) against the
plain full-batch computation."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.models import qwen3
from pipo_jax.rl import algorithms, learn
from pipo_jax.rl import response_logprobs as logprobs
from pipo_jax.rl import rollout, steps
from pipo_jax.rl.spec import ConfigError
from pipo_jax.rl.state import init_train_state
from tests.typed import spec_of


def test_split_micro_takes_rows_of_every_device_block_and_merge_inverts_it():
    x = jnp.arange(16)
    got = steps.split_micro(x, n_micro=2, shards=4)  # device d holds rows 4d..4d+3
    np.testing.assert_array_equal(got, [[0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]])
    np.testing.assert_array_equal(steps.merge_micro(got, shards=4), x)
    y = jnp.arange(16 * 3).reshape(16, 3)
    np.testing.assert_array_equal(steps.merge_micro(steps.split_micro(y, 4, 2), 2), y)
    np.testing.assert_array_equal(steps.split_micro(x, 4, 1), x.reshape(4, 4))  # one device: plain chunks


def test_micro_batch_settings_that_do_not_divide_name_the_key():
    spec = spec_of(importlib.import_module("configs.grpo").get_config("micro"))  # mini-batch of 8
    steps.check_micro_batching(spec.with_section("train", micro_batch_size_per_device=2), 4)
    with pytest.raises(ConfigError, match=r"config\.train\.micro_batch_size_per_device: 2 x 8 batch shards"):
        steps.check_micro_batching(spec.with_section("train", micro_batch_size_per_device=2), 8)
    with pytest.raises(ConfigError, match=r"config\.train\.micro_batch_size_per_device: 0 x 16"):
        steps.check_micro_batching(spec, 16)  # 0 = the device's share: 8 rows over 16 devices


def synthetic_rollout(spec) -> rollout.Rollout:
    """Task prompts with random responses of random lengths and 0/1 rewards (no sampler to compile)."""
    rng = np.random.RandomState(0)
    problems = rollout.sample_problems(spec.generation, jax.random.PRNGKey(1), spec.rollout.prompts_per_batch)
    b, r = spec.batch, spec.rollout.max_new_tokens
    resp = rng.randint(3, spec.model.vocab_size, (b, r)).astype(np.int32)
    resp_mask = (np.arange(r)[None, :] < rng.randint(1, r + 1, (b, 1))).astype(np.int32)
    return rollout.Rollout(problems=problems,
                           tokens_bl=jnp.concatenate([problems.prompt_tokens_bp, jnp.asarray(resp * resp_mask)], 1),
                           mask_bl=jnp.concatenate([problems.prompt_mask_bp, jnp.asarray(resp_mask)], 1),
                           sample_logp_br=jnp.zeros((b, r)), rewards_b=jnp.asarray(rng.randint(0, 2, b), jnp.float32))


@pytest.mark.parametrize("algo", ["ppo", "sdpo"])
def test_rollout_passes_equal_the_full_batch_computation(algo):
    c = importlib.import_module(f"configs.{algo}").get_config("micro")
    c.train.micro_batch_size_per_device = 2  # 8 micro-batches over the 16 rows
    spec = spec_of(c)
    state = init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(0)), 0)
    # distinct reference / teacher / critic weights, so a mix-up would show
    state = state.replace(ref_params=jax.tree.map(lambda x: x * 1.1, state.ref_params))
    if spec.has_critic:
        critic = dict(state.critic["params"], value_head=jnp.linspace(-1, 1, spec.model.hidden_size))
        state = state.replace(critic=dict(state.critic, params=critic))
    if state.teacher_params is not None:
        state = state.replace(teacher_params=jax.tree.map(lambda x: x * 0.9, state.teacher_params))
    ro = synthetic_rollout(spec)

    @jax.jit
    def both(st, r):
        teacher_inputs = learn.teacher_contexts(spec, r, r.rewards_b)[:2] if spec.uses_teacher else None
        got = learn.rollout_passes(spec, st, r.tokens_bl, r.mask_bl, teacher_inputs)
        p, kw = spec.prompt_len, dict(temperature=spec.rollout.temperature, impl=spec.logprob_impl)
        want = {}
        want["logp_old_br"], want["entropy_br"] = logprobs.response_logprobs(
            spec.model, st.params, r.tokens_bl, r.mask_bl, p, with_entropy=True, **kw)
        want["logp_ref_br"], _ = logprobs.response_logprobs(spec.model, st.ref_params, r.tokens_bl, r.mask_bl, p,
                                                            **kw)
        if spec.has_critic:
            want["values_br"] = steps.critic_values(spec, st.critic["params"], r.tokens_bl, r.mask_bl)
        if spec.uses_teacher:
            want["logp_teacher_br"] = algorithms.teacher_logprobs(spec, st.teacher_params, *teacher_inputs)
        return got, want

    got, want = both(state, ro)
    assert sorted(got) == sorted(want)
    for k in want:
        assert float(jnp.max(jnp.abs(want[k]))) > 0, k
        # float32 rounding of the same per-row math at other matmul shapes (measured <= 1e-6)
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)
