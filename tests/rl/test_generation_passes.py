"""Rollout generation in passes (`rollout.generate_rows_per_device`): the KV cache holds one
pass's rows, and since row b samples with `fold_in(rng, b)` whatever the pass, the rollout is
the one-pass rollout."""

import dataclasses
import importlib

import jax
import numpy as np
import pytest

from pipo_jax.models import qwen3
from pipo_jax.rl import rollout
from pipo_jax.rl.spec import ConfigError
from tests.typed import spec_of


def micro_spec(**overrides):
    c = importlib.import_module("configs.grpo").get_config("micro")
    c.rollout.temperature = 1.0  # sampled, not greedy: the per-row keys must line up across passes
    return spec_of(c).with_section("rollout", **overrides)


def test_generation_in_passes_equals_one_pass():
    spec = micro_spec()
    params = qwen3.init_params(spec.model, jax.random.PRNGKey(0))
    problems = rollout.sample_problems(spec.generation, jax.random.PRNGKey(1), spec.rollout.prompts_per_batch)
    rng = jax.random.PRNGKey(2)
    gen = jax.jit(rollout.generate, static_argnums=0)
    one = gen(spec.generation, params, problems, rng)
    in_passes = spec.with_section("rollout", generate_rows_per_device=4).generation
    assert rollout.generation_passes(in_passes, spec.batch) == (spec.batch // 4, 1)
    passes = gen(in_passes, params, problems, rng)
    np.testing.assert_array_equal(passes.tokens_bl, one.tokens_bl)
    np.testing.assert_array_equal(passes.mask_bl, one.mask_bl)
    # Same rows, same keys; only the decode batch size differs, which can move float32 matmul
    # rounding by a few ulp of the log-probs (|logp| < 20): 1e-5 bounds that.
    np.testing.assert_allclose(passes.sample_logp_br, one.sample_logp_br, rtol=0, atol=1e-5)
    assert np.asarray(one.mask_bl[:, -spec.rollout.max_new_tokens:]).sum() > 0


def test_generation_passes_that_do_not_divide_name_the_key():
    spec = micro_spec(generate_rows_per_device=3)
    with pytest.raises(ConfigError, match=r"config\.rollout\.generate_rows_per_device: 16 rows do not split"):
        rollout.generation_passes(spec.generation, 16)
    assert rollout.generation_passes(micro_spec(generate_rows_per_device=0).generation, 16) == (1, 1)
    assert rollout.generation_passes(micro_spec(generate_rows_per_device=32).generation, 16) == (1, 1)


def test_negative_rows_per_pass_is_a_config_error():
    c = importlib.import_module("configs.grpo").get_config("micro")
    c.rollout.generate_rows_per_device = -1
    with pytest.raises(ConfigError, match=r"rollout\.generate_rows_per_device"):
        spec_of(c)


@pytest.mark.parametrize("platform, auto", [("tpu", "gathered"), ("cuda", "sharded"), ("cpu", "sharded")])
def test_decode_weights_auto_follows_the_target_platform(platform, auto):
    """`rollout.decode_weights=auto` takes the target platform's layout (`model.platform`, never the
    host's); an explicit layout is kept on every platform; the paper presets ask for auto."""
    spec = micro_spec()
    spec = dataclasses.replace(spec, model=spec.model.replace(platform=platform))
    assert rollout.decode_weights_layout(spec.with_section("rollout", decode_weights="auto").generation) == auto
    for layout in ("sharded", "gathered"):
        assert rollout.decode_weights_layout(spec.with_section("rollout", decode_weights=layout).generation) == layout
    assert importlib.import_module("configs.grpo").get_config("qwen3_8b").rollout.decode_weights == "auto"
