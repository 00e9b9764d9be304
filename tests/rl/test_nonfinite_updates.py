"""Non-finite gradients (here: NaN rewards injected through the host reward): the update is
skipped with params and optimizer state unchanged, counted in the metrics, and
`train.max_bad_steps` skipped updates in a row stop the run with a clear error."""

import jax
import numpy as np
import pytest

from configs import grpo
from pipo_jax.models import qwen3
from pipo_jax.rl.loop import NonFiniteUpdates, RewardFunction
from pipo_jax.rl.spec import ConfigError
from pipo_jax.rl.state import init_train_state
from pipo_jax.run.placement import Placement
from pipo_jax.run.trainer import host_task_reward
from tests.typed import spec_of


def _setup():
    c = grpo.get_config("micro")  # 4 prompts, mini-batches of 2 prompts, 1 epoch: 2 updates per iteration
    c.log.jit_loop = False
    c.train.max_bad_steps = 3  # one spec for both tests: the second reuses the first's compiled programs
    spec = spec_of(c)
    return spec, init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(0)), 0)


def _host(tree):
    return jax.tree.map(np.array, jax.device_get(tree))


@pytest.mark.slow  # compiles the host loop's generate and learn (~1 min on a loaded 2-core CPU)
def test_nan_iteration_is_skipped_counted_and_the_next_one_applies():
    spec, state = _setup()
    task_reward = host_task_reward(spec)
    poisoned = {"on": False}

    def poisonable(rollout):
        r = np.asarray(task_reward(rollout), np.float32)
        return np.full_like(r, np.nan) if poisoned["on"] else r

    reward_fn = RewardFunction(poisonable)

    where = Placement()
    state, m1 = where.run(spec, state, 1, False, reward_fn)
    before_params, before_inner = _host(state.params), _host(state.opt_state.inner_state)
    poisoned["on"] = True
    state, m2 = where.run(spec, state, 1, False, reward_fn)
    jax.tree.map(np.testing.assert_array_equal, _host(state.params), before_params)
    jax.tree.map(np.testing.assert_array_equal, _host(state.opt_state.inner_state), before_inner)
    assert int(state.step) == 2
    assert (m1["nonfinite_updates"][0], m1["nonfinite_in_a_row"][0]) == (0, 0)
    assert (m2["nonfinite_updates"][0], m2["nonfinite_in_a_row"][0]) == (2, 2)
    assert np.isnan(m2["train/grad_norm"][0])

    poisoned["on"] = False
    state, m3 = where.run(spec, state, 1, False, reward_fn)
    assert (m3["nonfinite_updates"][0], m3["nonfinite_in_a_row"][0]) == (0, 0)
    changed = jax.tree.leaves(jax.tree.map(lambda a, b: np.any(a != b), _host(state.params), before_params))
    assert any(changed)
    assert int(state.opt_state.total_notfinite) == 2


@pytest.mark.slow
def test_max_bad_steps_in_a_row_stop_the_run():
    spec, state = _setup()
    with pytest.raises(NonFiniteUpdates, match=r"train\.max_bad_steps=3: 4 policy optimizer updates in a row had "
                                                r"non-finite .* up to iteration 2;"):
        Placement().run(spec, state, 3, False,
                        RewardFunction(lambda rollout: np.full((rollout.size,), np.nan, np.float32)))


def test_max_bad_steps_is_validated():
    c = grpo.get_config("micro")
    c.train.max_bad_steps = 0
    with pytest.raises(ConfigError, match=r"config\.train\.max_bad_steps: 0 must be >= 1"):
        spec_of(c)
