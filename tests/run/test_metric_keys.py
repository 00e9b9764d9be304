"""Every key a run writes is declared once (`pipo_jax/run/metric_keys.py`): docs/metrics.md is the
declarations' rendering, names say counts and fractions, a key matches its declaration, a metrics.jsonl
written under the former names reads under today's, and the logger names an undeclared key.
tests/run/test_metric_keys_run.py holds what runs emit against the declarations."""

import json
import pathlib

from pipo_jax.run import metric_keys, observe
from pipo_jax.run.metric_keys import METRICS, RENAMED, Metric

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_docs_page_is_the_rendering_of_the_declarations():
    page = (ROOT / "docs" / "metrics.md").read_text()
    assert page == metric_keys.rendered_page(page), "docs/metrics.md: run python -m pipo_jax.run.metric_keys --write"
    for m in METRICS:
        assert f"| `{m.key}` | {m.kind} |" in page


def test_declarations_are_unique_tensorboard_safe_and_named_by_kind():
    keys = [m.key for m in METRICS]
    assert len(keys) == len(set(keys))
    for m in METRICS:
        assert m.kind in metric_keys.KINDS, m
        assert m.section in dict(metric_keys.SECTIONS), m
        assert metric_keys.TENSORBOARD_TAG.match(m.key), m.key
        assert metric_keys.naming_error(m) is None, metric_keys.naming_error(m)
    # the rule catches what it is for
    assert "does not say so" in metric_keys.naming_error(Metric("warmup_mixed_groups", "fraction", "", "warmup"))
    assert "does not say what it counts" in metric_keys.naming_error(Metric("reward/unscored", "count", "", "rollout"))
    assert "declared a count" in metric_keys.naming_error(Metric("groups_kept_frac", "count", "", "rollout"))


def test_a_key_matches_its_declaration_and_nothing_else():
    assert metric_keys.declaration("reward_component/answer").key == "reward_component/{name}"
    assert metric_keys.declaration("math500_pass_at_8").key == "{name}_pass_at_{k}"
    assert metric_keys.declaration("teacher_accuracy_solution").key == "teacher_accuracy_{name}"
    assert metric_keys.undeclared(["step", "xi", "reward_component/", "train/made_up", "groups_mixed", "xi2"]) == [
        "groups_mixed", "reward_component/", "train/made_up", "xi2"]


def test_former_names_read_as_todays(tmp_path):
    """A row 0 and a row 1 an earlier run wrote: read back under today's names, which are declared."""
    old = [{"step": 0, "heldout_pass@1": 0.25, "warmup_mixed_groups": 0.5, "warmup_target_mixed_groups": 0.3,
            "math500_unscored": 2},
           {"step": 1, "groups_all_fail": 3, "groups_mixed": 4, "groups_all_success": 1, "xi": 0.5,
            "train/disco_valid_groups": 0.75}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    rows = observe.read_metrics(str(tmp_path / "metrics.jsonl"))
    assert rows == [{"step": 0, "heldout_pass_at_1": 0.25, "warmup_mixed_groups_frac": 0.5,
                     "warmup_target_mixed_groups_frac": 0.3, "math500_unscored_count": 2},
                    {"step": 1, "groups_all_fail_count": 3, "groups_mixed_count": 4, "groups_all_success_count": 1,
                     "xi": 0.5, "train/disco_valid_groups_frac": 0.75}]
    assert metric_keys.undeclared({k for r in rows for k in r}) == []
    assert all(metric_keys.declaration(metric_keys.current_name(k.replace("{name}", "x"))) for k in RENAMED)


def test_the_logger_names_an_undeclared_key_once(tmp_path, caplog):
    log = observe.RunLogger(str(tmp_path), total=2, tensorboard=False, progress=False)
    log.log(1, {"xi": 0.5, "made_up": 1.0})
    log.log(2, {"xi": 0.25, "made_up": 2.0})
    log.close(plots=False)
    warned = [r.getMessage() for r in caplog.records if "not declared" in r.getMessage()]
    assert warned == ["metrics ['made_up']: not declared in pipo_jax/run/metric_keys.py (docs/metrics.md)"]
    assert [r["made_up"] for r in observe.read_metrics(str(tmp_path / "metrics.jsonl"))] == [1.0, 2.0]
