"""A damaged checkpoint is never resumed: every step carries an integrity record (each saved file's size
and sha256, finalized with the step), checked before a restore trusts it. Bytes written into a data file
(which orbax itself reads back silently as other values) make the restore fall back to the previous step
with one line naming the step and the file, for a resume and for export / serve loading a run alike.
Checkpoint rotation removes only the run's own complete checkpoints: a foreign or an unreadable numbered
directory stays."""

import json
import logging
import os
import shutil

import jax
import numpy as np
import pytest

from configs import grpo
from pipo_jax.run import evaluate, integrity
from pipo_jax.run.checkpoint import Checkpointer
from pipo_jax.run.integrity import CheckpointDamaged
from pipo_jax.run.placement import Placement
from tests.rl.test_checkpoint_fallback import _largest_data_file, _spec_and_states


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A run workdir (config.json, checkpoints 1, 2, 3 of `_spec_and_states`)."""
    spec, states = _spec_and_states()
    root = tmp_path_factory.mktemp("run")
    ckpt = Checkpointer(str(root / "checkpoints"), keep=5)
    for s, state in states.items():
        ckpt.save(s, state)
    ckpt.close()
    c = grpo.get_config("micro")
    c.pipo.enabled = True
    (root / "config.json").write_text(c.to_json_best_effort(indent=2))
    return spec, states, root


def _copy(saved, tmp_path):
    spec, states, root = saved
    shutil.copytree(root, tmp_path / "run")
    return spec, states, tmp_path / "run"


def _garbage_inside(step_dir, offset=None) -> str:
    """4 KiB of random bytes written over the step's largest data file at `offset` (default: its middle;
    the size kept); returns the file's path."""
    path = _largest_data_file(str(step_dir))
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2 if offset is None else offset)
        f.write(np.random.default_rng(0).bytes(4096))
    return path


def _silent_damage(step_dir, step, template) -> tuple[str, int, object]:
    """(file, offset, state): 4 KiB of garbage at the first offset (of 16 spread over the largest data
    file) where orbax, without the integrity record, reads the step without an error, as other values.
    zstd notices some damage, not all (its frames carry no checksum here)."""
    path = _largest_data_file(str(step_dir))
    pristine = open(path, "rb").read()
    for offset in np.linspace(0, len(pristine) - 4096, 16).astype(int):
        _garbage_inside(step_dir, int(offset))
        ckpt = Checkpointer(os.path.dirname(step_dir), keep=5)
        try:
            return path, int(offset), ckpt.restore(template, step=step)
        except Exception:  # noqa: BLE001 - orbax noticed this one: try another place
            with open(path, "wb") as f:
                f.write(pristine)
        finally:
            ckpt.close()
    raise AssertionError("no offset found where orbax reads the damaged step silently")


def _changed_values(restored, expected) -> int:
    return sum(int(np.sum(np.asarray(a) != np.asarray(b)))
               for a, b in zip(jax.tree.leaves(jax.device_get(restored)), jax.tree.leaves(jax.device_get(expected))))


def test_every_saved_step_carries_a_record_of_its_files(saved):
    _, _, root = saved
    for s in (1, 2, 3):
        record = json.loads((root / "checkpoints" / str(s) / integrity.RECORD_NAME).read_text())
        assert record["step"] == s and record["algorithm"] == "sha256"
        data = [f for f in record["files"] if "/d/" in f]
        assert data and "default/_METADATA" in record["files"] and "default/manifest.ocdbt" in record["files"]
        assert integrity.verify(str(root / "checkpoints" / str(s)), s) is True


def test_bytes_written_into_a_data_file_are_caught_and_the_previous_step_is_resumed(saved, tmp_path, caplog):
    spec, states, run = _copy(saved, tmp_path)
    # Without its record the damaged step reads "fine" as other values: what the record is for.
    unchecked = tmp_path / "unchecked"
    shutil.copytree(run / "checkpoints", unchecked)
    os.remove(unchecked / "3" / integrity.RECORD_NAME)
    _, offset, silently = _silent_damage(unchecked / "3", 3, states[3])
    assert int(silently.step) == 3 and _changed_values(silently, states[3]) > 100
    damaged = _garbage_inside(run / "checkpoints" / "3", offset)  # the same bytes, where the record is kept

    ckpt = Checkpointer(str(run / "checkpoints"), keep=5)
    with caplog.at_level(logging.WARNING, logger="pipo_jax.run.checkpoint"):
        restored = Placement().restore(ckpt, spec)
    ckpt.close()
    assert int(restored.step) == 2 and _changed_values(restored, states[2]) == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "pipo_jax.run.checkpoint"]
    assert lines == [f"checkpoint step 3 at {run / 'checkpoints' / '3'} is unreadable (CheckpointDamaged: {damaged}: "
                     "its bytes differ from those saved (sha256 in pipo_integrity.json)): skipped, left in place"]
    with pytest.raises(CheckpointDamaged, match=f"^{damaged}: its bytes differ"):  # asked for by its step
        Checkpointer(str(run / "checkpoints"), keep=5).restore(states[3], step=3)


def test_export_and_serve_load_the_newest_intact_checkpoint(saved, tmp_path):
    """`evaluate.load_policy_at` (what experiments.export / serve / eval / chat read a run workdir with)."""
    _, states, run = _copy(saved, tmp_path)
    _garbage_inside(run / "checkpoints" / "3")
    _, params, _, step = evaluate.load_policy_at(str(run))
    assert step == 2 and _changed_values(params, states[2].params) == 0


def test_a_truncated_or_missing_file_is_named(saved, tmp_path):
    _, _, run = _copy(saved, tmp_path)
    step3 = run / "checkpoints" / "3"
    path = _largest_data_file(str(step3))
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 1)
    with pytest.raises(CheckpointDamaged, match=f"^{path}: {size - 1} bytes, {size} bytes when saved"):
        integrity.verify(str(step3), 3)
    os.remove(path)
    with pytest.raises(CheckpointDamaged, match=f"^{path}: missing"):
        integrity.verify(str(step3), 3)
    with pytest.raises(CheckpointDamaged, match="the record is of step 3, not 4"):
        integrity.verify(str(step3), 4)  # a step directory renamed


def test_rotation_removes_only_the_runs_own_complete_checkpoints(tmp_path, caplog):
    root = tmp_path / "checkpoints"
    state = {"w": np.arange(4096, dtype=np.float32)}
    ckpt = Checkpointer(str(root), keep=2)
    for s in (1, 2, 3):
        ckpt.save(s, {"w": state["w"] + s})
    ckpt.close()
    assert sorted(os.listdir(root)) == ["2", "3"]  # keep=2: the run's own are rotated
    cut = _largest_data_file(str(root / "3"))
    with open(cut, "r+b") as f:  # unreadable: a data file cut short
        f.truncate(10)
    (root / "5").mkdir()  # foreign: a user's directory with a number for a name
    (root / "5" / "notes.txt").write_text("mine")
    shutil.copytree(root / "2", root / "9")  # a copy under another number: its record names step 2
    ckpt = Checkpointer(str(root), keep=2)
    with caplog.at_level(logging.WARNING, logger="pipo_jax.run.checkpoint"):
        for s in (4, 6, 7, 8):
            ckpt.save(s, {"w": state["w"] + s})
        ckpt.close()
    assert sorted(os.listdir(root), key=int) == ["3", "5", "7", "8", "9"]  # own whole ones: 7, 8; the others stay
    assert (root / "5" / "notes.txt").read_text() == "mine" and os.path.getsize(cut) == 10
    told = [r.getMessage() for r in caplog.records if r.name == "pipo_jax.run.checkpoint"]
    assert told == [f"checkpoints [3, 5, 9] in {root} are not whole checkpoints of this run (no integrity record of "
                    "this code, or a file missing or cut): left in place, not counted by checkpoint.keep"]


def test_a_step_found_unreadable_is_not_rotated_away(tmp_path):
    root = tmp_path / "checkpoints"
    w = np.arange(4096, dtype=np.float32)
    ckpt = Checkpointer(str(root), keep=1)
    ckpt.save(1, {"w": w + 1})
    ckpt.wait()
    os.makedirs(root / "2")
    shutil.copytree(root / "1", root / "2", dirs_exist_ok=True)  # as step 2 it fails its record's step check
    ckpt.close()
    ckpt = Checkpointer(str(root), keep=1)
    assert int(ckpt.restore({"w": w})["w"][0]) == 1 and list(ckpt.unreadable) == [2]
    ckpt.save(3, {"w": w + 3})
    ckpt.save(4, {"w": w + 4})
    ckpt.close()
    assert sorted(os.listdir(root), key=int) == ["2", "4"]
