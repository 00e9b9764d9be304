"""Orbax checkpoints: the whole TrainState round-trips (BNPO's carried state too); a save killed mid-write
never replaces the last good checkpoint, and what it left is removed before the next run's first save (robustly: a
path already gone is fine; nothing else is removed, and a reader removes nothing); older layouts (renamed fields, a
field added since) still resume."""

import logging
import os
import shutil
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
from pipo_jax.run import integrity
from pipo_jax.run.checkpoint import ADDED_FIELDS, Checkpointer, remove_partial_saves, remove_tree
from pipo_jax.run.placement import Placement
from tests.typed import spec_of


def _state(cfg_module, seed):
    c = cfg_module.get_config("micro")
    c.pipo.enabled = True
    spec = spec_of(c)
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
        from pipo_jax.rl.state import init_train_state
        from tests.typed import spec_of
        c = grpo.get_config("micro")
        spec = spec_of(c)
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


def _killed_runs_leftovers(root) -> dict[str, object]:
    """In `root` (step 1 saved there): what a run killed while saving step 2 (its integrity record written,
    not yet renamed), saving step 3 (no record yet) and rotating out step 0 leaves, and things that look
    alike but are not the run's own. Returns {name: what it is}."""
    shutil.copytree(root / "1", root / "2.orbax-checkpoint-tmp")
    integrity.write_record(str(root / "2.orbax-checkpoint-tmp"), 2)
    shutil.copytree(root / "1", root / "3.orbax-checkpoint-tmp")
    os.remove(root / "3.orbax-checkpoint-tmp" / integrity.RECORD_NAME)
    shutil.copytree(root / "1", root / ".0.removing")
    (root / "notes.orbax-checkpoint-tmp").mkdir()  # a user's directory: not a step's
    (root / "notes.orbax-checkpoint-tmp" / "a.txt").write_text("mine")
    (root / "4.orbax-checkpoint-tmp.bak").mkdir()
    (root / "5.removing").mkdir()
    outside = root.parent / "outside"
    outside.mkdir()
    (outside / "b.txt").write_text("mine")
    os.symlink(outside, root / "6.orbax-checkpoint-tmp")  # a link: removing it or its target is not ours
    return {"leftovers": ["2.orbax-checkpoint-tmp", "3.orbax-checkpoint-tmp", ".0.removing"],
            "foreign": ["4.orbax-checkpoint-tmp.bak", "5.removing", "6.orbax-checkpoint-tmp",
                        "notes.orbax-checkpoint-tmp"], "outside": outside}


def test_a_killed_runs_leftovers_go_before_the_next_first_save_and_nothing_else(tmp_path, caplog):
    root = tmp_path / "checkpoints"
    w = np.arange(4096, dtype=np.float32)
    ckpt = Checkpointer(str(root), keep=3)
    ckpt.save(1, {"w": w + 1})
    ckpt.close()
    made = _killed_runs_leftovers(root)
    everything = sorted(["1"] + made["leftovers"] + made["foreign"])
    ckpt = Checkpointer(str(root), keep=3)
    assert ckpt.all_steps() == [1] and int(ckpt.restore({"w": w})["w"][0]) == 1
    assert sorted(os.listdir(root)) == everything  # opened and read: nothing removed yet
    with caplog.at_level(logging.INFO, logger="pipo_jax.run.checkpoint"):
        ckpt.save(2, {"w": w + 2})
        ckpt.save(3, {"w": w + 3})
        ckpt.close()
    assert sorted(os.listdir(root)) == sorted(["1", "2", "3"] + made["foreign"])
    assert (root / "notes.orbax-checkpoint-tmp" / "a.txt").read_text() == "mine"
    assert os.listdir(made["outside"]) == ["b.txt"] and os.path.islink(root / "6.orbax-checkpoint-tmp")
    told = [r.getMessage() for r in caplog.records if r.name == "pipo_jax.run.checkpoint"]
    assert told == [f"checkpoint: {root / n}, left by a run that was stopped while saving or rotating, removed"
                    for n in sorted(made["leftovers"])]
    ckpt = Checkpointer(str(root), keep=3)
    for step in (1, 2, 3):  # the new saves of steps 2 and 3 are whole and hold their own values
        assert integrity.verify(ckpt.step_path(step), step)
        np.testing.assert_array_equal(ckpt.restore({"w": w}, step=step)["w"], w + step)
    ckpt.close()


def test_a_reader_removes_nothing_of_a_live_runs_directory(tmp_path):
    """eval / export / serve open a run's checkpoints with the default `keep` (3) while the run may be
    saving: neither its save in flight nor its checkpoints beyond that `keep` are removed."""
    root = tmp_path / "checkpoints"
    w = np.arange(64, dtype=np.float32)
    ckpt = Checkpointer(str(root), keep=5)
    for step in range(1, 6):
        ckpt.save(step, {"w": w + step})
    ckpt.close()
    shutil.copytree(root / "5", root / "6.orbax-checkpoint-tmp")  # the run's save of step 6, in flight
    reader = Checkpointer(str(root))
    assert int(reader.restore({"w": w})["w"][0]) == 5
    reader.wait()
    reader.close()
    assert sorted(os.listdir(root)) == ["1", "2", "3", "4", "5", "6.orbax-checkpoint-tmp"]


def test_a_partial_save_already_gone_is_removed_without_an_error(tmp_path, monkeypatch):
    """Two clean-ups over one partial save (this code's and orbax's, in a thread, until orbax's was
    turned off) each find entries the other removed first: every file and directory here is gone
    when `rmtree` reaches it, as if the other was always faster."""
    root = tmp_path / "checkpoints"
    for sub in ("a", "a/b", "c"):
        (root / "7.orbax-checkpoint-tmp" / sub).mkdir(parents=True)
        for i in range(3):
            (root / "7.orbax-checkpoint-tmp" / sub / f"{i}.bin").write_bytes(b"x" * 10)
    unlink, rmdir, raced = os.unlink, os.rmdir, []

    def faster_unlink(path, *, dir_fd=None):
        unlink(path, dir_fd=dir_fd)
        raced.append(path)
        unlink(path, dir_fd=dir_fd)  # FileNotFoundError, as rmtree meets it after the other clean-up

    def faster_rmdir(path, *, dir_fd=None):
        rmdir(path, dir_fd=dir_fd)
        raced.append(path)
        rmdir(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", faster_unlink)
    monkeypatch.setattr(os, "rmdir", faster_rmdir)
    removed, left = remove_partial_saves(str(root))
    monkeypatch.undo()
    assert removed == [str(root / "7.orbax-checkpoint-tmp")] and left == {} and os.listdir(root) == []
    assert len(raced) == 9 + 3 + 1  # every file, every subdirectory and the partial save itself raced


def test_a_partial_save_that_cannot_be_removed_is_named_and_left(tmp_path, monkeypatch, caplog):
    root = tmp_path / "checkpoints"
    (root / "7.orbax-checkpoint-tmp").mkdir(parents=True)
    (root / "7.orbax-checkpoint-tmp" / "d.bin").write_bytes(b"x")
    (root / ".6.removing").mkdir()
    unlink = os.unlink

    def refused(path, *, dir_fd=None):
        if path == "d.bin":
            raise PermissionError(13, "Permission denied", path)
        unlink(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", refused)
    with pytest.raises(PermissionError):
        remove_tree(str(root / "7.orbax-checkpoint-tmp"))
    ckpt = Checkpointer(str(root), keep=3)
    with caplog.at_level(logging.INFO, logger="pipo_jax.run.checkpoint"):
        ckpt.save(1, {"w": np.arange(8, dtype=np.float32)})
        ckpt.close()
    monkeypatch.undo()
    assert sorted(os.listdir(root)) == ["1", "7.orbax-checkpoint-tmp"]
    told = [r.getMessage() for r in caplog.records if r.name == "pipo_jax.run.checkpoint"]
    assert told == [f"checkpoint: {root / '.6.removing'}, left by a run that was stopped while saving or rotating, "
                    "removed",
                    f"checkpoint: {root / '7.orbax-checkpoint-tmp'}, left by a run that was stopped while saving or "
                    "rotating, could not be removed (PermissionError: [Errno 13] Permission denied: 'd.bin'): left "
                    "in place"]


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
        restored = Placement().restore(ckpt, spec_of(c))
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
