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
from pipo_jax.rl.state import init_train_state
from pipo_jax.run.checkpoint import Checkpointer
from pipo_jax.run.setup import train_spec


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
        from pipo_jax.run.checkpoint import Checkpointer
        from pipo_jax.run.setup import train_spec
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


def test_a_checkpoint_saved_with_the_former_stored_batch_names_resumes(tmp_path):
    """A run saved while PIPO's stored batch was a `StoredBatch` of `_bt`-named fields (before
    it became the `TrainBatch` cut to `STORED_FIELDS`) restores into today's state, every array
    equal, read by its stored name (`checkpoint.LEGACY_NAMES`)."""
    import flax

    from pipo_jax.run.checkpoint import LEGACY_NAMES

    @flax.struct.dataclass
    class StoredBatch:  # the former type, as it was saved
        tokens_bl: jax.Array
        attention_mask_bl: jax.Array
        mask_bt: jax.Array
        logp_old_bt: jax.Array
        logp_ref_bt: jax.Array
        attr_bt: jax.Array

    state = _state(grpo, 3)
    prev = state.pipo.prev
    shifted = jax.tree.map(lambda x: x + 1, prev)  # values a fresh template does not have
    legacy = StoredBatch(**{LEGACY_NAMES.get(f, f): getattr(shifted, f)
                            for f in ("tokens_bl", "mask_bl", "mask_br", "logp_old_br", "logp_ref_br", "attr_br")})
    ckpt = Checkpointer(str(tmp_path), keep=2)
    ckpt.save(4, state.replace(pipo=state.pipo.replace(prev=legacy)))
    ckpt.wait()
    restored = ckpt.restore(_state(grpo, 0))
    ckpt.close()
    want = state.replace(pipo=state.pipo.replace(prev=shifted))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), jax.device_get(want))
    assert type(restored.pipo.prev) is type(prev)
