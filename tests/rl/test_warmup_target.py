"""A warm-up that ends without reaching its target says so in one line, with what to change, and
records it in metrics.jsonl's row 0 and summary.json (`warmup.target_met`, `target`, `reached`)."""

import json
import logging

from pipo_jax.run import warmup
from tests.rl.micro_trainer import micro
from tests.typed import train_config


def test_miss_line_names_what_was_reached_and_what_to_change():
    m = {"target_met": False, "steps_run": 1200,
         "targets": {"target_accuracy": (0.3, 0.35), "target_pass_rate": (0.3, 0.082)}}
    assert warmup.miss_line(m, "reasoning_gym") == (
        "warm-up missed its target after all 1200 steps: sampled pass@1 0.082 < warmup.target_pass_rate=0.3. "
        "RL starts from this base model anyway; to reach the target give it more steps "
        "(--config.warmup.steps=2400) or a smaller problem (--config.task.reasoning_gym.config='{...}' with smaller "
        "values (the dataset's own size settings))")
    assert "--config.task.arithmetic.max_digits=" in warmup.miss_line(m, "arithmetic")
    assert warmup.miss_line(dict(m, target_met=True), "arithmetic") is None
    assert warmup.miss_line(dict(m, target_met=None, targets={}), "arithmetic") is None  # no target set


def _rows(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_a_missed_and_a_met_target_in_the_run_records(tmp_path, caplog):
    kw = {"iterations": 1, "checkpoint.export_hf": False}
    with caplog.at_level(logging.WARNING, logger="pipo_jax.run.trainer"):
        train_config(micro("grpo", **kw, **{"warmup.target_accuracy": 0.99}), str(tmp_path / "missed"))
    missed = [r.getMessage() for r in caplog.records if "warm-up missed its target" in r.getMessage()]
    row0 = _rows(tmp_path / "missed")[0]
    assert missed == [f"warm-up missed its target after all 2 steps: greedy held-out accuracy "
                      f"{row0['warmup_accuracy']:.3f} < warmup.target_accuracy=0.99. RL starts from this base model "
                      "anyway; to reach the target give it more steps (--config.warmup.steps=4) or a smaller problem "
                      "(--config.task.arithmetic.max_digits=<fewer digits>)"]
    assert (row0["warmup_target_met"], row0["warmup_target_accuracy"]) == (0.0, 0.99)
    summary = json.loads((tmp_path / "missed" / "summary.json").read_text())["warmup"]
    assert summary["target_met"] is False and summary["target"] == {"target_accuracy": 0.99}
    assert summary["reached"] == {"target_accuracy": row0["warmup_accuracy"]}

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pipo_jax.run.trainer"):
        # holds at the step-0 check
        train_config(micro("grpo", **kw, **{"warmup.target_accuracy": 0.0}), str(tmp_path / "met"))
    assert not [r for r in caplog.records if "warm-up missed" in r.getMessage()]
    summary = json.loads((tmp_path / "met" / "summary.json").read_text())["warmup"]
    assert summary["target_met"] is True and summary["steps"] == 0 and summary["target"] == {"target_accuracy": 0.0}

    train_config(micro("grpo", **kw), str(tmp_path / "none"))  # no target set: nothing recorded about one
    assert "warmup_target_met" not in _rows(tmp_path / "none")[0]
    assert "target_met" not in json.loads((tmp_path / "none" / "summary.json").read_text())["warmup"]
