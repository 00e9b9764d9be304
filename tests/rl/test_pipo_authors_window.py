"""The trainer's window bookkeeping with the authors' `window_twice` (pipo_verl ray_trainer.py:
mu_t is pushed before xi is computed and again after the base step)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo
from pipo_jax.rl import rollout
from tests.rl.micro_trainer import fresh_state, learned, sampled

# micro: 4 groups of G = 4, mixed groups so GRPO's advantages are nonzero; batch means 0.25, then 0.5
REWARDS = [jnp.array([1, 0, 0, 0] * 4, jnp.float32), jnp.array([1, 1, 0, 0] * 4, jnp.float32)]


@pytest.mark.slow
@pytest.mark.parametrize("compat, xi2", [
    (False, 1 / np.sqrt(2.0)),  # window_twice alone: std([0.25, 0.5], ddof 1) = 0.125 * sqrt(2)
    (True, 1.0),  # every behaviour: ddof 0 -> std 0.125
])
def test_learn_pushes_mu_t_twice_and_steps_one_iteration_earlier(compat, xi2):
    c = grpo.get_config("micro")  # K = 2
    c.pipo.enabled = True
    c.pipo.authors.window_twice = True
    c.pipo.compat = compat
    spec, state = fresh_state(c)
    metrics = []
    for i, pattern in enumerate(REWARDS):
        ro = sampled(spec, state.params, jax.random.PRNGKey(10 + i))
        state, m = learned(spec, state, rollout.with_rewards(ro, pattern), jax.random.PRNGKey(20 + i))
        metrics.append({k: float(v) for k, v in m.items() if np.ndim(v) == 0})
    assert [m["mu_t"] for m in metrics] == [0.25, 0.5]
    # iteration 1: window [0.25] (count 1 < K): no step; then [0.25, 0.25]. Iteration 2: [0.25, 0.5], full:
    # xi = (0.5 - 0.375) / std([0.25, 0.5])
    assert metrics[0]["pi_step_applied"] == 0.0 and metrics[1]["pi_step_applied"] == 1.0
    np.testing.assert_allclose(metrics[1]["xi"], xi2, rtol=1e-6)
    assert metrics[1]["pi/grad_norm"] > 0
    np.testing.assert_allclose(np.asarray(state.pipo.mu_window_k), [0.5, 0.5], rtol=0)
