"""DAPO: `pipo.mu_source` picks the batch mu_t comes from: the filtered batch the step trains on
(default, docs/math.md and the authors) or every group sampled for it (`raw`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import dapo
from pipo_jax.models import qwen3
from pipo_jax.rl import learn, loop, rollout
from pipo_jax.rl.spec import ConfigError
from pipo_jax.rl.state import init_train_state
from tests.typed import spec_of


def _spec(mu_source):
    c = dapo.get_config("micro")
    c.pipo.enabled = True
    c.pipo.mu_source = mu_source
    return c, spec_of(c)


@pytest.fixture(scope="module")
def setup():
    c, spec = _spec("raw")
    state = init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(c.seed)), c.seed)
    g = spec.rollout.group_size

    def reward_fn(r):  # every other group all-correct, so DAPO's filter drops it
        all_correct = (jnp.arange(r.size) // g) % 2 == 0
        return jnp.where(all_correct, 1.0, rollout.task_rewards(spec, r))

    rng = jax.random.PRNGKey(3)
    ro, stats = jax.jit(lambda p, k: rollout.collect(spec, p, k, reward_fn))(state.params, rng)
    return spec, state, reward_fn, rng, ro, stats


def test_raw_mean_is_over_every_sampled_group(setup):
    spec, state, reward_fn, rng, ro, stats = setup
    n = int(stats["dapo_gen_batches"])
    assert n >= 2 and int(stats["dapo_groups_dropped"]) >= n  # half of every generation batch is dropped
    # plain reference: the mean task reward over all n generation batches (collect's keys)
    rewards = [np.asarray(reward_fn(loop._host_generate(spec, state.params, None, jax.random.fold_in(rng, i),
                                                        spec.dapo.gen_prompts_per_batch))) for i in range(n)]
    expected = np.mean(np.concatenate(rewards))
    np.testing.assert_allclose(float(ro.mu_raw), expected, rtol=1e-6)  # float32 sum of <= 160 rewards in [0, 1]
    assert float(ro.mu_raw) > float(jnp.mean(ro.rewards_b))  # the dropped groups were all-correct
    host, _ = loop.host_collect(spec, state.params, rng, loop.RewardFunction(lambda r: np.asarray(reward_fn(r))))
    np.testing.assert_allclose(float(host.mu_raw), float(ro.mu_raw), rtol=1e-6)


@pytest.mark.parametrize("mu_source", ["filtered", "raw"])
def test_prepare_takes_mu_t_from_the_chosen_batch(setup, mu_source):
    _, _, _, _, ro, _ = setup
    _, spec = _spec(mu_source)
    state = init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(0)), 0)
    _, mu_t, _ = jax.jit(lambda s, r: learn.prepare(spec, s, r))(state, ro)
    expected = ro.mu_raw if mu_source == "raw" else jnp.mean(ro.rewards_b)
    np.testing.assert_allclose(float(mu_t), float(expected), rtol=1e-6)


def test_mu_source_is_validated():
    c = dapo.get_config("micro")
    c.pipo.mu_source = "sampled"
    with pytest.raises(ConfigError, match=r"config.pipo.mu_source: 'sampled' is not one of \('filtered', 'raw'\)"):
        spec_of(c)
