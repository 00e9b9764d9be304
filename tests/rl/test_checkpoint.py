"""Orbax checkpoints: the whole TrainState round-trips; a save killed mid-write never
replaces the last good checkpoint."""

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np

from configs import grpo, ppo
from pipo_jax.models import qwen3
from pipo_jax.rl.checkpoint import Checkpointer
from pipo_jax.rl.setup import train_spec
from pipo_jax.rl.state import init_train_state


def _state(cfg_module, seed):
    c = cfg_module.get_config("micro")
    c.pipo.enabled = True
    spec = train_spec(c)
    return init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(seed)), seed)


def test_train_state_roundtrips_with_pipo_state_critic_and_rng(tmp_path):
    for module in (grpo, ppo):
        state = _state(module, 3)
        state = state.replace(pipo=state.pipo.replace(mu_window_k=state.pipo.mu_window_k + 0.25,
                                                      count=state.pipo.count + 1))
        ckpt = Checkpointer(str(tmp_path / module.__name__), keep=2)
        ckpt.save(7, state)
        ckpt.wait()
        restored = ckpt.restore(_state(module, 0))
        ckpt.close()
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), jax.device_get(state))
        assert (restored.critic is None) == (module is grpo)


def test_keeps_the_last_k(tmp_path):
    state = _state(grpo, 0)
    ckpt = Checkpointer(str(tmp_path), keep=2)
    for step in (1, 2, 3):
        ckpt.save(step, state)
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3]
    ckpt.close()


def test_killed_save_leaves_the_previous_checkpoint(tmp_path):
    state = _state(grpo, 0)
    ckpt = Checkpointer(str(tmp_path), keep=3)
    ckpt.save(1, state)
    ckpt.close()
    # A second process starts an asynchronous save of step 2 and dies before it completes.
    script = textwrap.dedent(f"""
        import os, jax
        from configs import grpo
        from pipo_jax.models import qwen3
        from pipo_jax.rl.checkpoint import Checkpointer
        from pipo_jax.rl.setup import train_spec
        from pipo_jax.rl.state import init_train_state
        c = grpo.get_config("micro")
        spec = train_spec(c)
        state = init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(1)), 1)
        ckpt = Checkpointer({str(tmp_path)!r}, keep=3)
        ckpt.save(2, state)
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    ckpt = Checkpointer(str(tmp_path), keep=3)
    assert ckpt.latest_step() == 1, os.listdir(tmp_path)
    restored = ckpt.restore(_state(grpo, 5))
    ckpt.close()
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored.params), jax.device_get(state.params))
