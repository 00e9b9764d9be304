"""The trainer's rollout through either implementation of the rollout interface
(`rollout.engine`): the host loop's generate gives the same rollout with the slot engine as
with the one-jit sampler; settings that cannot hold fail at start-up naming the key."""

import jax
import numpy as np
import pytest

from configs import grpo
from pipo_jax.rl import loop
from pipo_jax.rl.spec import ConfigError
from pipo_jax.run import warmup
from pipo_jax.run.placement import Placement
from tests.typed import spec_of


def micro(**rollout):
    c = grpo.get_config("micro")
    c.log.jit_loop = False
    for key, value in rollout.items():
        c.rollout[key] = value
    return c


@pytest.mark.parametrize("steps", [1, 3])
def test_host_loop_rollout_is_the_same_with_the_slot_engine(steps):
    ref_spec = spec_of(micro())
    slots_spec = spec_of(micro(engine="slots", engine_slots=5, engine_steps=steps))
    assert slots_spec.generator.steps_per_call == steps
    params = warmup.initial_params(ref_spec.model, 0)
    rng = jax.random.PRNGKey(3)
    n = ref_spec.rollout.prompts_per_batch
    ref = loop.single_device_programs(ref_spec).generate(params, rng, n)
    placement = Placement()
    programs = placement.host_programs(slots_spec)
    got = programs.generate(params, rng, n)
    assert placement.host_programs(slots_spec) is programs  # kept: the slot engines compile once a run
    np.testing.assert_array_equal(got.tokens_bl, ref.tokens_bl)
    np.testing.assert_array_equal(got.mask_bl, ref.mask_bl)
    np.testing.assert_allclose(got.sample_logp_br, ref.sample_logp_br, atol=1e-4)  # float32 summation order
    np.testing.assert_array_equal(got.problems.answer_b, ref.problems.answer_b)
    assert got.tokens_bl.shape == (ref_spec.batch, ref_spec.seq_len)


def test_slot_engine_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="config.log.jit_loop: rollout.engine=slots is driven from the host"):
        c = micro(engine="slots")
        c.log.jit_loop = True
        spec_of(c)
    with pytest.raises(ConfigError, match="config.rollout.engine"):
        spec_of(micro(engine="vllm"))
    with pytest.raises(ConfigError, match="config.rollout.engine_slots: 4 slots are for rollout.engine=slots"):
        spec_of(micro(engine_slots=4))
    with pytest.raises(ConfigError, match="config.rollout.engine_steps: 2 steps per call are for rollout.engine=slots"):
        spec_of(micro(engine_steps=2))
    with pytest.raises(ConfigError, match="config.rollout.engine_steps: 0 must be >= 1"):
        spec_of(micro(engine="slots", engine_steps=0))
    with pytest.raises(ConfigError, match="config.rollout.generate_rows_per_device: generation passes"):
        spec_of(micro(engine="slots", generate_rows_per_device=2))
