"""The trainer's window bookkeeping with the authors' `window_twice` (pipo_verl ray_trainer.py:
mu_t is pushed before xi is computed and again after the base step)."""

import jax
import numpy as np
import pytest

from configs import grpo
from pipo_jax.models import qwen3
from pipo_jax.rl import learn, rollout
from pipo_jax.rl.spec import train_spec
from pipo_jax.rl.state import init_train_state


@pytest.mark.slow
def test_learn_pushes_mu_t_twice_and_steps_one_iteration_earlier():
    c = grpo.get_config("micro")  # K = 2
    c.pipo.enabled = True
    c.pipo.authors.window_twice = True
    spec = train_spec(c)
    state = init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(c.seed)), c.seed)
    reward_fn = lambda r: rollout.task_rewards(spec, r)
    collect = jax.jit(lambda p, k: rollout.collect(spec, p, k, reward_fn))
    step = jax.jit(lambda s, r, k: learn.learn(spec, s, r, k))
    metrics = []
    for i in range(2):
        ro, _ = collect(state.params, jax.random.PRNGKey(10 + i))
        state, m = step(state, ro, jax.random.PRNGKey(20 + i))
        metrics.append({k: float(v) for k, v in m.items() if np.ndim(v) == 0})
    mu1, mu2 = metrics[0]["mu_t"], metrics[1]["mu_t"]
    assert mu1 != mu2
    # iteration 1: window [mu1] (count 1 < K): no step; then [mu1, mu1]. Iteration 2: [mu1, mu2], full:
    # xi = (mu2 - (mu1 + mu2) / 2) / (|mu2 - mu1| / sqrt(2)) = sign(mu2 - mu1) / sqrt(2) (ddof 1)
    assert metrics[0]["pi_step_applied"] == 0.0 and metrics[1]["pi_step_applied"] == 1.0
    np.testing.assert_allclose(metrics[1]["xi"], np.sign(mu2 - mu1) / np.sqrt(2.0), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(state.pipo.mu_window_k), [mu2, mu2], rtol=0)
