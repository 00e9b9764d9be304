"""The host loop's reward contract (`rl/loop.py:HostReward`, a `typing.Protocol`): every host reward gives
the rewards, scores a rollout and reports its counts; a plain function is one through `RewardFunction`."""

import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo
from pipo_jax.rl import loop, rollout
from pipo_jax.rl.experience import Rollout
from tests.typed import spec_of


def _rollout(b: int) -> Rollout:
    z = jnp.zeros((b, 3), jnp.int32)
    return Rollout(problems=None, tokens_bl=z, mask_bl=z, sample_logp_br=jnp.zeros((b, 2)), rewards_b=jnp.zeros(b))


def test_a_plain_function_is_a_host_reward_through_its_adapter():
    reward = loop.RewardFunction(lambda r: np.arange(r.size) * 0.5)
    assert isinstance(reward, loop.HostReward) and not isinstance(lambda r: r, loop.HostReward)
    scored = reward.score_rollout(_rollout(3))
    assert scored.rewards_b.dtype == jnp.float32
    np.testing.assert_array_equal(scored.rewards_b, [0.0, 0.5, 1.0])
    assert reward.take_counts() == {}
    with pytest.raises(ValueError, match=r"^reward function returned shape \(2,\), expected \(3,\)$"):
        loop.RewardFunction(lambda r: np.zeros(2)).score_rollout(_rollout(3))


def test_the_tasks_reward_is_a_host_reward_whose_counts_are_its_scorers():
    spec = spec_of(grpo.get_config("micro"))
    reward = rollout.TaskReward(spec, spec.task.scorer())
    assert isinstance(reward, loop.HostReward)
    assert reward.take_counts() == {}  # the arithmetic scorer counts nothing (a math one: test_dataset_task.py)
