"""Damaged checkpoints: restore falls back to the newest one that reads, names each skipped
one (step, path, reason) in one log line and leaves it on disk; with none readable, one
clear error. A refused run (`checkpoint.resume=false` on a used workdir) changes nothing
in the workdir."""

import gc
import glob
import hashlib
import logging
import os
import shutil
import sys

import jax
import numpy as np
import pytest

from configs import grpo
from pipo_jax.models import qwen3
from pipo_jax.rl.spec import ConfigError
from pipo_jax.rl.state import init_train_state
from pipo_jax.run import integrity
from pipo_jax.run.checkpoint import Checkpointer, NoReadableCheckpoint
from pipo_jax.run.placement import Placement
from tests.typed import spec_of, train_config


def _spec_and_states():
    c = grpo.get_config("micro")
    c.pipo.enabled = True
    spec = spec_of(c)
    base = init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(0)), 0)
    # Three distinguishable states: step s has every params leaf shifted by s.
    return spec, {s: base.replace(step=base.step + s, params=jax.tree.map(lambda x: x + s, base.params))
                  for s in (1, 2, 3)}


def _file_digests(root) -> dict[str, str]:
    out = {}
    for path in sorted(glob.glob(os.path.join(root, "**"), recursive=True)):
        rel = os.path.relpath(path, root)
        out[rel] = "dir" if os.path.isdir(path) else hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


def _largest_data_file(step_dir) -> str:
    return max(glob.glob(os.path.join(step_dir, "default", "ocdbt.process_0", "d", "*")), key=os.path.getsize)


def _truncate(step_dir):
    with open(_largest_data_file(step_dir), "r+b") as f:
        f.truncate(100)


def _garbage(step_dir):
    path = _largest_data_file(step_dir)
    size = os.path.getsize(path)
    with open(path, "wb") as f:
        f.write(np.random.default_rng(0).bytes(size))


def _delete_manifest(step_dir):
    os.remove(os.path.join(step_dir, "default", "manifest.ocdbt"))


def _delete_data(step_dir):
    for path in glob.glob(os.path.join(step_dir, "default", "ocdbt.process_0", "d", "*")):
        os.remove(path)


def _delete_metadata(step_dir):
    os.remove(os.path.join(step_dir, "default", "_METADATA"))


DAMAGES = {"truncated": _truncate, "garbage": _garbage, "deleted_metadata": _delete_metadata,
           "deleted_manifest": _delete_manifest, "deleted_data": _delete_data}
# The reason names the damaged file: the integrity record's check (`run/integrity.py`) or orbax's.
REASONS = {"truncated": "bytes when saved (pipo_integrity.json)", "garbage": "its bytes differ from those saved",
           "deleted_metadata": "_METADATA is missing", "deleted_manifest": "manifest.ocdbt: missing",
           "deleted_data": ": missing (listed in pipo_integrity.json)"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint directory with steps 1, 2, 3 of `_spec_and_states`."""
    spec, states = _spec_and_states()
    root = tmp_path_factory.mktemp("ckpt")
    ckpt = Checkpointer(str(root), keep=5)
    for s, state in states.items():
        ckpt.save(s, state)
    ckpt.close()
    return spec, states, root


def _copy_of(saved, tmp_path):
    spec, states, root = saved
    target = tmp_path / "checkpoints"
    shutil.copytree(root, target)
    return spec, states, target


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_newest_falls_back_to_the_previous(saved, tmp_path, caplog, damage):
    spec, states, root = _copy_of(saved, tmp_path)
    DAMAGES[damage](str(root / "3"))
    before = _file_digests(root)
    ckpt = Checkpointer(str(root), keep=5)
    with caplog.at_level(logging.WARNING, logger="pipo_jax.run.checkpoint"):
        restored = Placement().restore(ckpt, spec)
    ckpt.close()
    assert int(restored.step) == 2
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored.params), jax.device_get(states[2].params))
    lines = [r.getMessage() for r in caplog.records if r.name == "pipo_jax.run.checkpoint"]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"checkpoint step 3 at {root / '3'} is unreadable (")
    assert lines[0].endswith("): skipped, left in place") and "\n" not in lines[0]
    assert REASONS.get(damage, "") in lines[0]  # the reason names the file where tensorstore does
    assert _file_digests(root) == before  # nothing deleted or repaired


def test_abandoned_reads_are_collected_silently_and_only_after_a_failed_read(saved, tmp_path, monkeypatch):
    """Orbax abandons the pending reads of a checkpoint that fails to read; closing them raises again. The
    restore collects them before it returns, so no later collection reports them. A restore that read
    everything skips that collection (it walks every object of the process)."""
    spec, states, root = _copy_of(saved, tmp_path)
    _truncate(str(root / "3"))
    os.remove(root / "3" / integrity.RECORD_NAME)  # as older code saved it: orbax's read is what fails
    intact = tmp_path / "intact"
    shutil.copytree(saved[2], intact)
    unraisable, full_collections = [], []
    gc.collect()  # what earlier tests left
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    def count(phase, info):
        if phase == "start" and info["generation"] == 2:
            full_collections.append(1)

    def restored_and_collections(path):
        ckpt = Checkpointer(str(path), keep=5)
        before = len(full_collections)
        state = Placement().restore(ckpt, spec)
        ckpt.close()
        return int(state.step), len(full_collections) - before

    gc.callbacks.append(count)
    gc.disable()  # only the restores' own collections are counted
    try:
        falling_back = restored_and_collections(root)  # step 3 fails, step 2 reads
        reading = restored_and_collections(intact)  # step 3 reads
    finally:
        gc.enable()
        gc.callbacks.remove(count)
    gc.collect()  # what the restores left behind, collected outside them
    assert falling_back[0] == 2 and falling_back[1] >= 1
    assert reading == (3, 0)
    assert [u for u in unraisable if type(u.object).__name__ == "coroutine"] == []


def test_two_damaged_each_named_and_the_oldest_restored(saved, tmp_path, caplog):
    spec, states, root = _copy_of(saved, tmp_path)
    _truncate(str(root / "3"))
    _garbage(str(root / "2"))
    ckpt = Checkpointer(str(root), keep=5)
    with caplog.at_level(logging.WARNING, logger="pipo_jax.run.checkpoint"):
        restored = Placement().restore(ckpt, spec)
    ckpt.close()
    assert int(restored.step) == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "pipo_jax.run.checkpoint"]
    assert [line.split(" at ")[0] for line in lines] == ["checkpoint step 3", "checkpoint step 2"]


def test_none_readable_is_one_clear_error(saved, tmp_path):
    spec, _, root = _copy_of(saved, tmp_path)
    for s in (1, 2, 3):
        _garbage(str(root / str(s)))
    ckpt = Checkpointer(str(root), keep=5)
    with pytest.raises(NoReadableCheckpoint,
                       match=r"none of the checkpoints \[1, 2, 3\] is readable \(newest, step 3: "):
        Placement().restore(ckpt, spec)
    ckpt.close()


def test_saving_over_an_unreadable_step_moves_it_aside(saved, tmp_path):
    spec, states, root = _copy_of(saved, tmp_path)
    _truncate(str(root / "3"))
    damaged = _file_digests(root / "3")
    ckpt = Checkpointer(str(root), keep=5)
    Placement().restore(ckpt, spec)
    ckpt.save(3, states[3])
    ckpt.wait()
    restored = Placement().restore(ckpt, spec)
    ckpt.close()
    assert int(restored.step) == 3
    assert _file_digests(f"{root}.unreadable/3") == damaged


def test_refused_run_leaves_the_workdir_byte_for_byte(saved, tmp_path):
    # A finished run's workdir: its config, metrics, export and checkpoints 1..3 (as `train` writes them).
    _copy_of(saved, tmp_path)
    c = grpo.get_config("micro")
    c.pipo.enabled = True
    (tmp_path / "config.json").write_text(c.to_json_best_effort(indent=2))
    (tmp_path / "metrics.jsonl").write_text('{"step": 3, "reward_mean": 0.5}\n')
    (tmp_path / "hf_export").mkdir()
    (tmp_path / "hf_export" / "config.json").write_text("{}")
    before = _file_digests(tmp_path)
    mtimes = {p: os.stat(p).st_mtime_ns for p in glob.glob(os.path.join(tmp_path, "**"), recursive=True)}
    refused = c.copy_and_resolve_references()
    refused.checkpoint.resume = False
    refused.rollout.max_new_tokens = 7  # a different config, which must not land in config.json
    with pytest.raises(ConfigError, match=r"config\.checkpoint\.resume: false, but .* holds checkpoints \[1, 2, 3\]"):
        train_config(refused, str(tmp_path))
    assert _file_digests(tmp_path) == before
    assert {p: os.stat(p).st_mtime_ns for p in glob.glob(os.path.join(tmp_path, "**"), recursive=True)} == mtimes


def test_invalid_config_creates_no_workdir(tmp_path):
    c = grpo.get_config("micro")
    c.pipo.enabled, c.pipo.window = True, 1
    with pytest.raises(ConfigError, match=r"config\.pipo\.window"):
        train_config(c, str(tmp_path / "run"))
    assert not os.path.exists(tmp_path / "run")
