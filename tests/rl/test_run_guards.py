"""A run is never lost or mixed with another: the workdir lock (held, stale), the resumed
config checked against the stored one (shape changes refused naming the keys, other
changes only with `checkpoint.allow_config_change`, the old config kept), a torn last
metrics line repaired, a damaged final checkpoint saved again, the warm-up continued
exactly from its own checkpoint, and a stop request saving before the run ends."""

import json
import logging
import os
import signal

import jax
import numpy as np
import pytest

from configs import grpo
from pipo_jax.config.sections import RunConfig
from pipo_jax.rl.spec import ConfigError
from pipo_jax.run import observe, warmup
from pipo_jax.run.checkpoint import saved_steps
from pipo_jax.run.preemption import RunInterrupted, StopRequests
from pipo_jax.run.workdir import WorkdirError, WorkdirLock
from pipo_jax.tasks import arithmetic
from tests.typed import spec_of, train_config


def micro(**overrides):
    c = grpo.get_config("micro")
    c.pipo.enabled = True
    c.checkpoint.export_hf = False
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = c
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-iteration micro run (checkpoints 0 and 2) to copy per test."""
    root = tmp_path_factory.mktemp("finished")
    summary = train_config(micro(iterations=2), str(root))
    return root, summary


def _copy(finished, tmp_path):
    import shutil

    root, summary = finished
    target = tmp_path / "run"
    shutil.copytree(root, target)
    return target, summary


def test_a_held_workdir_refuses_a_second_run_naming_the_holder(tmp_path):
    held = WorkdirLock(str(tmp_path)).acquire()
    held.record()
    try:
        with pytest.raises(WorkdirError, match=rf"{tmp_path} is in use by another run: pid {os.getpid()} on host "):
            train_config(micro(iterations=1), str(tmp_path))
    finally:
        held.release()
    assert sorted(os.listdir(tmp_path)) == []  # the refused run wrote nothing


def test_a_stale_lock_is_taken_over_with_a_warning(tmp_path, caplog):
    (tmp_path / ".lock").write_text(json.dumps({"pid": 999999999, "host": "gone", "started": "then",
                                                "command": "python -m experiments.train"}) + "\n")
    with caplog.at_level(logging.WARNING):
        train_config(micro(iterations=1), str(tmp_path))
    assert any("taking over the stale lock of pid 999999999 on host gone" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / ".lock").exists()  # released at the end
    assert saved_steps(str(tmp_path / "checkpoints")) == [0, 1]


def test_lock_of_a_new_workdir_refused_leaves_no_directory(tmp_path):
    held = WorkdirLock(str(tmp_path / "run")).acquire()
    held.release()
    assert not (tmp_path / "run").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(WorkdirError, match=r"--workdir .*file is a file, not a directory"):
        WorkdirLock(str(tmp_path / "file")).acquire()


def test_resume_refuses_a_shape_change_naming_the_key(finished, tmp_path):
    run, _ = _copy(finished, tmp_path)
    before = (run / "config.json").read_text()
    with pytest.raises(ConfigError, match=r"another shape; these changed keys change it: pipo\.window: 2 -> 3"):
        train_config(micro(iterations=3, **{"pipo.window": 3}), str(run))
    assert (run / "config.json").read_text() == before
    # Two changes, one of which changes shapes: only that one is named as the cause.
    with pytest.raises(ConfigError, match=r"change it: rollout\.group_size: 4 -> 2 \("):
        train_config(micro(iterations=3, **{"rollout.group_size": 2, "train.lr": 3e-4}), str(run))


def test_resume_with_another_lr_needs_the_key_and_keeps_the_old_config(finished, tmp_path):
    run, _ = _copy(finished, tmp_path)
    before = (run / "config.json").read_text()
    with pytest.raises(ConfigError, match=r"config\.checkpoint\.allow_config_change: .*train\.lr: 0\.0001 -> 0\.0003"):
        train_config(micro(iterations=3, **{"train.lr": 3e-4}), str(run))
    assert (run / "config.json").read_text() == before and not list(run.glob("config.*.json"))
    summary = train_config(micro(iterations=3, **{"train.lr": 3e-4, "checkpoint.allow_config_change": True}), str(run))
    assert summary["resumed_from"] == 2
    assert (run / "config.2.json").read_text() == before  # the config in force up to iteration 2
    assert json.loads((run / "config.json").read_text())["train"]["lr"] == 3e-4


def test_a_start_parses_the_run_config_once(tmp_path, monkeypatch):
    """`train` reads its config typed from one parse (`RunConfig.from_config`), passed down to the
    spec, the warm-up, the evaluation and the checkpoints; a second parse would be a second source of truth."""
    parses = []
    parse = RunConfig.from_config.__func__
    monkeypatch.setattr(RunConfig, "from_config",
                        classmethod(lambda cls, c, **kw: parses.append(cls) or parse(cls, c, **kw)))
    summary = train_config(micro(iterations=1), str(tmp_path))
    assert int(summary["state"].step) == 1 and parses == [RunConfig]


def test_resume_extending_iterations_is_free_and_logged(finished, tmp_path, caplog):
    run, _ = _copy(finished, tmp_path)
    with caplog.at_level(logging.WARNING):
        summary = train_config(micro(iterations=3), str(run))
    assert summary["resumed_from"] == 2
    assert any("resuming with a changed config: iterations: 2 -> 3" in r.getMessage() for r in caplog.records)
    assert json.loads((run / "config.2.json").read_text())["iterations"] == 2
    assert [r["step"] for r in observe.read_metrics(str(run / "metrics.jsonl"))] == [0, 1, 2, 3]


def test_a_config_stored_by_older_code_resumes_with_its_new_keys_logged(finished, tmp_path, caplog):
    """Keys the code added (or removed) since the run was stored are not the user's changes: the
    run resumes without `allow_config_change`, logs them, and keeps the stored config aside."""
    run, _ = _copy(finished, tmp_path)
    stored = json.loads((run / "config.json").read_text())
    del stored["task"]["dataset"]["verify_batch_budget_s"]  # as written before the key existed
    stored["task"]["retired_key"] = 1
    (run / "config.json").write_text(json.dumps(stored))
    with caplog.at_level(logging.WARNING):
        summary = train_config(micro(iterations=3), str(run))
    assert summary["resumed_from"] == 2
    drift = [r.getMessage() for r in caplog.records if "predates this code" in r.getMessage()]
    assert drift and "task.dataset.verify_batch_budget_s" in drift[0] and "task.retired_key" in drift[0]
    assert "retired_key" in json.loads((run / "config.2.json").read_text())["task"]
    assert "verify_batch_budget_s" in json.loads((run / "config.json").read_text())["task"]["dataset"]


def test_a_damaged_final_checkpoint_is_saved_again(finished, tmp_path):
    run, full = _copy(finished, tmp_path)
    step_dir = run / "checkpoints" / "2"
    os.remove(step_dir / "default" / "_METADATA")
    again = train_config(micro(iterations=2), str(run))
    assert again["resumed_from"] == 0  # 2 unreadable: the newest that reads
    assert (run / "checkpoints.unreadable" / "2").is_dir()  # moved aside, not deleted
    third = train_config(micro(iterations=2), str(run))  # the final step now reads: nothing recomputed
    assert third["resumed_from"] == 2
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(full["state"].params),
                 jax.device_get(third["state"].params))


def test_bytes_written_into_the_newest_checkpoint_make_the_resume_skip_it(finished, tmp_path, caplog):
    """4 KiB of garbage inside a data file of the final checkpoint (where orbax alone reads other values
    without an error): the resume names it and starts from the checkpoint before, and the final state is
    the undamaged run's."""
    from pipo_jax.run import integrity
    from tests.rl.test_checkpoint_fallback import _largest_data_file

    run, full = _copy(finished, tmp_path)
    damaged = _largest_data_file(str(run / "checkpoints" / "2"))
    with open(damaged, "r+b") as f:
        f.seek(os.path.getsize(damaged) // 2)
        f.write(np.random.default_rng(0).bytes(4096))
    with caplog.at_level(logging.WARNING, logger="pipo_jax.run.checkpoint"):
        again = train_config(micro(iterations=2), str(run))
    assert again["resumed_from"] == 0
    assert [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()][0] == (
        f"checkpoint step 2 at {run / 'checkpoints' / '2'} is unreadable (CheckpointDamaged: {damaged}: its bytes "
        f"differ from those saved (sha256 in {integrity.RECORD_NAME})): skipped, left in place")
    assert os.path.exists(str(damaged).replace(str(run / "checkpoints"), str(run / "checkpoints.unreadable")))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(full["state"].params),
                 jax.device_get(again["state"].params))


def test_a_torn_last_metrics_line_is_repaired_and_kept_aside(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "x": 1}\n{"step": 1, "x": 2}\n{"step": 2, "x": 3}\n{"step": 3, "x"')
    with caplog.at_level(logging.WARNING):
        logger = observe.RunLogger(str(tmp_path), total=4, progress=False, tensorboard=False, start_step=1)
    logger.log(2, {"x": 30.0})
    logger.close(plots=False)
    assert [(r["step"], r["x"]) for r in observe.read_metrics(str(path))] == [(0, 1), (1, 2), (2, 30.0)]
    superseded = [json.loads(line) for line in (tmp_path / "metrics.superseded.jsonl").read_text().splitlines()]
    assert superseded == [{"step": 2, "x": 3}, {"torn_line": '{"step": 3, "x"'}]
    assert any("last line is torn" in r.getMessage() for r in caplog.records)


def test_a_damaged_metrics_line_inside_the_file_is_one_error_naming_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\nnot json\n{"step": 2}\n')
    with pytest.raises(WorkdirError, match=r"metrics\.jsonl:2: not a metrics row"):
        observe.RunLogger(str(tmp_path), total=4, progress=False, tensorboard=False, start_step=1)


def test_a_fresh_start_keeps_an_earlier_attempts_rows_aside(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "x": 1}\n')
    observe.RunLogger(str(tmp_path), total=4, progress=False, tensorboard=False).close(plots=False)
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    assert (tmp_path / "metrics.superseded.jsonl").read_text() == '{"step": 0, "x": 1}\n'


MODEL = warmup.task_model_config(hidden_size=64, head_dim=16, intermediate_size=128)
TASK = arithmetic.ArithmeticTask(max_digits=1, heldout_fraction=0.3)


def test_the_warmup_continues_exactly_from_its_progress():
    settings = warmup.WarmupSettings(steps=6, batch=8, lr=1e-2, eval_every=2, eval_n=16)
    full_params, full = warmup.warmup(MODEL, TASK, settings, seed=0)
    saved = []

    def stop_after_first(progress):
        saved.append(jax.device_get(progress))
        raise RunInterrupted(signal.SIGTERM, "warm-up step 2", "nowhere")

    with pytest.raises(RunInterrupted):
        warmup.warmup(MODEL, TASK, settings, seed=0, after_chunk=stop_after_first)
    assert int(saved[0].done) == 2
    template = warmup.abstract_progress(MODEL, settings)
    assert jax.tree.structure(template) == jax.tree.structure(saved[0])
    params, resumed = warmup.warmup(MODEL, TASK, settings, seed=0, resume=saved[0])
    jax.tree.map(np.testing.assert_array_equal, full_params, params)
    for key in ("loss", "eval_steps", "heldout_accuracy", "teacher_solution_accuracy", "steps_run"):
        np.testing.assert_array_equal(full[key], resumed[key])


def test_a_stop_request_saves_the_state_and_ends_the_run(tmp_path):
    class StopAtOnce(StopRequests):  # a SIGTERM that arrived during the warm-up's last chunk
        def __enter__(self):
            self.requested = signal.SIGTERM
            return self

    import pipo_jax.run.trainer as trainer

    original = trainer.StopRequests
    trainer.StopRequests = StopAtOnce
    try:
        with pytest.raises(RunInterrupted, match=r"stopped by SIGTERM at warm-up step 2, checkpoint saved in "):
            train_config(micro(iterations=3), str(tmp_path))
    finally:
        trainer.StopRequests = original
    assert saved_steps(str(tmp_path / "warmup_checkpoints")) == [2]
    summary = train_config(micro(iterations=3), str(tmp_path))  # resumes the warm-up, then runs through
    assert summary["resumed_from"] is None and saved_steps(str(tmp_path / "checkpoints")) == [0, 3]
    assert not (tmp_path / "warmup_checkpoints").exists()  # dropped once iteration 0 is saved


def test_warmup_eval_every_sets_the_checks_and_the_stored_progress_it_resumes(tmp_path, caplog):
    """`warmup.eval_every=2` of 4 steps: the stop lands after the first 2-step chunk, and the
    resumed warm-up reads that progress (its template has 1 + 4 / 2 evaluation columns, not the
    default's 1 + 4 / 50) and ends with the uninterrupted run's params."""
    class StopAtOnce(StopRequests):
        def __enter__(self):
            self.requested = signal.SIGTERM
            return self

    import pipo_jax.run.trainer as trainer

    c = dict(iterations=1, **{"warmup.steps": 4, "warmup.eval_every": 2})
    original = trainer.StopRequests
    trainer.StopRequests = StopAtOnce
    try:
        with pytest.raises(RunInterrupted, match=r"at warm-up step 2, "):
            train_config(micro(**c), str(tmp_path / "stopped"))
    finally:
        trainer.StopRequests = original
    with caplog.at_level(logging.INFO):
        resumed = train_config(micro(**c), str(tmp_path / "stopped"))
    assert "warm-up resumed at step 2" in caplog.text
    through = train_config(micro(**c), str(tmp_path / "through"))
    jax.tree.map(np.testing.assert_array_equal, through["state"].params, resumed["state"].params)


# ----------------------------------------------------------------------------- faults: disk, inputs, races

def test_a_full_disk_during_resume_keeps_config_json_and_the_resume_works_once_space_is_back(finished, tmp_path):
    import shutil

    from pipo_jax.run.atomic import StorageError
    from tests import disk

    root, _ = finished
    with disk.tmpfs(tmp_path / "fs", "16m") as fs:
        run = fs / "run"
        shutil.copytree(root, run)
        stored = (run / "config.json").read_text()
        filler = disk.fill(fs, leave=4096)  # one page: the lock record fits, a copy of the config does not
        changed = micro(iterations=2, **{"train.lr": 3e-3, "checkpoint.allow_config_change": True})
        with pytest.raises(StorageError, match=rf"^{run}/config\.2\.json: no space left on device \(checkpoints "
                                               rf"\[0, 2\] in {run}/checkpoints kept; "):
            train_config(changed, str(run))
        assert (run / "config.json").read_text() == stored  # whole, and still parses
        json.loads(stored)
        assert not [n for n in os.listdir(run) if n.endswith(".tmp")]
        filler.unlink()
        again = train_config(changed, str(run))
        assert again["resumed_from"] == 2
        assert (run / "config.2.json").read_text() == stored
        assert json.loads((run / "config.json").read_text())["train"]["lr"] == 3e-3


def test_a_batch_larger_than_the_memory_is_refused_before_the_workdir_gets_a_file(tmp_path):
    with pytest.raises(ConfigError, match=r"^config\.rollout\.prompts_per_batch=100000000: a batch of "
                                          r"\d+ sequences x \d+ tokens needs at least [\d.]+ TiB .* more than the "):
        train_config(micro(**{"rollout.prompts_per_batch": 100_000_000, "train.mini_batch_prompts": 1}),
              str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_the_batch_memory_bound_counts_the_rollout_arrays_and_the_kv_cache():
    from pipo_jax.run import memory

    spec = spec_of(micro())
    m, tokens = spec.model, spec.prompt_len + spec.rollout.max_new_tokens
    kv = 2 * m.num_hidden_layers * spec.batch * tokens * m.num_key_value_heads * m.head_dim * 4  # float32
    need = memory.batch_memory_bytes(spec)
    assert need == spec.batch * tokens * 16 + kv
    memory.check_batch_memory(spec, (need, "a test"))  # fits exactly
    with pytest.raises(ConfigError, match=r"config\.rollout\.prompts_per_batch=\d+: .* more than the 0\.0 GiB of a "):
        memory.check_batch_memory(spec, (need - 1, "a test"))


def test_a_last_metrics_row_whose_step_is_no_integer_is_kept_aside_like_a_torn_one(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "x": 1}\n{"step": 1, "x": 2}\n{"step": "7"}\n')
    with caplog.at_level(logging.WARNING):
        observe.RunLogger(str(tmp_path), total=4, progress=False, tensorboard=False, start_step=1).close(plots=False)
    assert [r["step"] for r in observe.read_metrics(str(path))] == [0, 1]
    superseded = [json.loads(line) for line in (tmp_path / "metrics.superseded.jsonl").read_text().splitlines()]
    assert superseded == [{"torn_line": '{"step": "7"}'}]
    path.write_text('{"step": 0}\n{"step": "7"}\n{"step": 2}\n')  # inside the file: damage, named
    with pytest.raises(WorkdirError, match=r"metrics\.jsonl:2: not a metrics row \(\"step\" is '7', not an integer\)"):
        observe.RunLogger(str(tmp_path), total=4, progress=False, tensorboard=False, start_step=1)


def test_a_run_started_while_another_holds_the_lock_names_its_pid(finished, tmp_path):
    import subprocess
    import sys

    run, _ = _copy(finished, tmp_path)  # a workdir with checkpoints: the holder would be in its resume checks
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pipo_jax.run.workdir import WorkdirLock; "
         "WorkdirLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)", str(run)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"  # it took the lock and did nothing else yet
        with pytest.raises(WorkdirError, match=rf"{run} is in use by another run: pid {holder.pid} on host "):
            train_config(micro(iterations=2), str(run))
    finally:
        holder.kill()
        holder.wait()
