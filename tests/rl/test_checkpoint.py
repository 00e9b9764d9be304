"""Orbax checkpoints: the whole TrainState round-trips (BNPO's carried state too); a save killed mid-write
never replaces the last good checkpoint; older layouts (renamed fields, a field added since) still resume."""

import logging
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from configs import bnpo as bnpo_config
from configs import grpo, ppo
from pipo_jax.losses import bnpo
from pipo_jax.models import qwen3
from pipo_jax.rl.state import TrainState, init_train_state
from pipo_jax.run.checkpoint import ADDED_FIELDS, Checkpointer
from pipo_jax.run.placement import Placement
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


def _bnpo_state(seed):
    """configs/bnpo.py's micro state with a pool of success rates that is not the fresh one."""
    state = _state(bnpo_config, seed)
    pool = bnpo.update_bnpo_state(bnpo.init_bnpo_state(), jax.numpy.array([0.25, 0.5, 1.0]), decay=0.9)
    return state.replace(estimator_state=bnpo.update_bnpo_state(pool, jax.numpy.array([0.0, 0.75]), decay=0.9))


def test_bnpo_pool_roundtrips(tmp_path):
    """BNPO's carried state (`TrainState.estimator_state`) is saved and restored with the rest, exactly."""
    state = _bnpo_state(3)
    assert float(state.estimator_state.weight) == pytest.approx(0.9 * 3 + 2)
    ckpt = Checkpointer(str(tmp_path), keep=2)
    ckpt.save(5, state)
    ckpt.wait()
    restored = ckpt.restore(_state(bnpo_config, 0))
    ckpt.close()
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), jax.device_get(state))
    assert type(restored.estimator_state) is bnpo.BnpoState


@pytest.mark.parametrize("module", [bnpo_config, grpo])
def test_a_checkpoint_saved_before_the_estimator_state_resumes_with_it_fresh(module, tmp_path, caplog):
    """A checkpoint written before `TrainState.estimator_state` existed (the state without that field)
    restores through the trainer's path (`Placement.restore`, an abstract template) with every saved array
    as saved and the field fresh: BNPO's pool empty, said in one log line naming the field; GRPO's None,
    nothing said (`checkpoint.ADDED_FIELDS`)."""
    import dataclasses
    from typing import Any

    import flax

    @flax.struct.dataclass
    class FormerTrainState:  # TrainState's fields as they were saved before estimator_state
        step: Any
        params: Any
        opt_state: Any
        ref_params: Any
        critic: Any
        teacher_params: Any
        pipo: Any
        rng: Any
        teacher_opt_state: Any = None
        vpd_delta: Any = None
        pi_opt_state: Any = None

    assert [f.name for f in dataclasses.fields(TrainState)] == [
        f.name for f in dataclasses.fields(FormerTrainState)] + list(ADDED_FIELDS)
    state = _bnpo_state(3) if module is bnpo_config else _state(grpo, 3)
    state = state.replace(step=state.step + 6, pipo=state.pipo.replace(count=state.pipo.count + 1))
    ckpt = Checkpointer(str(tmp_path), keep=2)
    ckpt.save(6, FormerTrainState(**{f.name: getattr(state, f.name) for f in dataclasses.fields(FormerTrainState)}))
    ckpt.wait()
    c = module.get_config("micro")
    c.pipo.enabled = True
    with caplog.at_level(logging.INFO, logger="pipo_jax.run.checkpoint"):
        restored = Placement().restore(ckpt, train_spec(c))
    ckpt.close()
    fresh = None if module is grpo else bnpo.init_bnpo_state()
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored),
                 jax.device_get(state.replace(estimator_state=fresh)))
    notes = [r.getMessage() for r in caplog.records if "estimator_state" in r.getMessage()]
    if module is grpo:
        assert restored.estimator_state is None and notes == []
    else:
        assert type(restored.estimator_state) is bnpo.BnpoState and len(notes) == 1
        assert notes[0] == (f"checkpoint step 6 at {tmp_path / '6'} was saved before TrainState.estimator_state "
                            f"({ADDED_FIELDS['estimator_state']}) existed: it starts fresh")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # not skipped as unreadable
