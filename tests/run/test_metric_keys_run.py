"""What runs emit against the declarations of `pipo_jax/run/metric_keys.py`: a micro run emits no key without a
declaration and its TensorBoard tags equal its JSONL keys; every algorithm's update (traced) emits only declared
keys, and every declared key of the update is emitted by one of them."""

import jax
import pytest

from configs import grpo
from configs import vpd as vpd_configs
from pipo_jax.rl import learn
from pipo_jax.run import metric_keys, observe
from pipo_jax.run.metric_keys import METRICS
from tests.conftest import override
from tests.rl.micro_trainer import fresh_state, micro, sampled
from tests.rl.test_config import ALGOS
from tests.rl.test_observe import read_events
from tests.typed import train_config


def test_a_micro_run_emits_only_declared_keys_and_tensorboard_tags_equal_them(tmp_path):
    """GRPO + PIPO, 2 iterations evaluated each, after a warm-up with a target and its sampled check:
    the iteration, PIPO, base / PI step, timing, evaluation and warm-up keys."""
    c = override(grpo.get_config("micro"), {
        "iterations": 2, "eval.every": 1, "log.every": 1, "log.tensorboard": True, "eval.heldout_samples": 2,
        "warmup.check_prompts": 16, "warmup.target_accuracy": 0.01, "warmup.target_mixed_groups": 0.01,
        "checkpoint.export_hf": False, "pipo.enabled": True})
    train_config(c, str(tmp_path))
    rows = observe.read_metrics(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [0, 1, 2]
    keys = {k for r in rows for k in r} - {"step"}
    assert metric_keys.undeclared(keys) == []
    # what the run's kinds of rows hold, under today's names
    assert {"groups_mixed_count", "tokens", "pi_step_applied", "train/pg_clipfrac", "pi/pg_clipfrac",
            "tokens_per_s", "heldout_accuracy", "heldout_pass_at_1", "warmup_mixed_groups_frac",
            "warmup_target_mixed_groups_frac", "warmup_target_met"} <= keys
    tags = {}
    for e in read_events(tmp_path):
        for v in e.summary.value:
            tags.setdefault(e.step, set()).add(v.tag)
    assert {s: t for s, t in tags.items()} == {r["step"]: set(r) - {"step"} for r in rows}


@pytest.mark.slow  # traces every algorithm's update (~50 s on 2 cores)
def test_every_algorithms_update_emits_only_declared_keys():
    """The metrics of `learn.learn` (traced, not run) of every algorithm with PIPO, and the variants that add
    keys: PIPO off, a separate PI optimizer, PPO's authors' gate, VPD's hybrids."""
    configs = [micro(a, True) for a in ALGOS] + [
        micro("grpo", False), micro("grpo", True, **{"pipo.pi_optimizer": "separate"}),
        micro("ppo", True, **{"pipo.compat": True})]
    for mode in ("joint", "reshape"):
        configs.append(override(vpd_configs.hybrid("micro", mode), {"pipo.enabled": True}))
    emitted = set()
    for c in configs:
        spec, state = fresh_state(c)
        batch = jax.eval_shape(lambda: sampled(spec, state.params, jax.random.PRNGKey(0)))  # noqa: B023
        step = lambda s, b: learn.learn(spec, s, b, jax.random.PRNGKey(1))  # noqa: B023,E731
        _, metrics = jax.eval_shape(step, state, batch)
        emitted |= set(metrics)
    assert metric_keys.undeclared(emitted) == []
    # every declared key of the update is emitted by one of them (none is declared for nothing)
    update = {"iteration", "pipo", "train", "pi", "critic", "advantage", "vpd"}
    declared = {m.key for m in METRICS if m.section in update and "{" not in m.key}
    assert declared - emitted == set()
