"""experiments/compare.py (on experiments/vmapped.py): seeds stacked into one vmapped program equal
separate runs; a stopped comparison resumes from the arms it finished."""

import json
import os

import jax
import numpy as np
import pytest

from configs import grpo as grpo_configs
from experiments import compare, runs, vmapped
from experiments.cli import UsageError
from pipo_jax.models import qwen3
from pipo_jax.rl import loop
from pipo_jax.rl.spec import ConfigError
from pipo_jax.rl.state import init_train_state
from pipo_jax.run.setup import train_spec


def test_parse_seeds():
    assert runs.parse_seeds("0-3") == [0, 1, 2, 3]
    assert runs.parse_seeds("0,5,7") == [0, 5, 7]
    with pytest.raises(ValueError, match="empty range"):
        runs.parse_seeds("3-1")


def test_set_reads_the_value_as_the_keys_type():
    c = compare.algorithm_config("grpo", "micro", 0, (
        "task.name=reasoning_gym", 'task.reasoning_gym.config={"min_terms":2,"max_terms":3}', "warmup.steps=7",
        "warmup.lr=0.5", "pipo.enabled=true", "warmup.target_accuracy=0.3"))
    assert (c.task.name, c.task.reasoning_gym.config, c.warmup.steps, c.warmup.lr, c.pipo.enabled, c.warmup.target_accuracy) == (
        "reasoning_gym", '{"min_terms":2,"max_terms":3}', 7, 0.5, True, 0.3)
    # an unset `X | None` key is read as its declared type X
    c = compare.algorithm_config("grpo", "micro", 0, ("pipo.authors.window_twice=false", "pipo.pi_clip_low=0.1"))
    assert c.pipo.authors.window_twice is False and c.pipo.pi_clip_low == 0.1
    for bad, message in (("warmup.steps=x", "warmup.steps is a int"), ("pipo.enabled=1", "expected true or false"),
                         ("task.no_key=1", "config has no key 'task.no_key'; did you mean task.name\\?$"),
                         ("nosection.a=1", "no section"),
                         ("pipo.lamb=1", "config has no key 'pipo.lamb'; did you mean pipo.lam\\?$"),
                         ("pipo.authors.window_twice=1", "expected true or false"),
                         ("warmup.steps", "expected KEY=VALUE")):
        with pytest.raises(ValueError, match=message):
            compare.algorithm_config("grpo", "micro", 0, (bad,))


def test_variants_parse_and_override():
    assert compare.parse_variant("sdpo:norm:pipo.attribution_norm=mean_abs") == (
        "sdpo", "norm", {"pipo.attribution_norm": "mean_abs"})
    assert compare.parse_variant("gspo:clip:pipo.pi_clip_low=0.2;pipo.pi_clip_high=0.2") == (
        "gspo", "clip", {"pipo.pi_clip_low": 0.2, "pipo.pi_clip_high": 0.2})
    with pytest.raises(ValueError, match="expected ALGO:LABEL:key=value"):
        compare.parse_variant("sdpo:norm")
    c = compare.with_overrides(grpo_configs.get_config("micro"), {"pipo.lam": 0, "pipo.pi_optimizer": "separate"})
    assert c.pipo.lam == 0.0 and isinstance(c.pipo.lam, float) and c.pipo.pi_optimizer == "separate"
    with pytest.raises(ValueError, match="config has no key 'pipo.nope'"):
        compare.with_overrides(c, {"pipo.nope": 1})
    with pytest.raises(ValueError, match="is not in --algorithms"):
        compare.compare(["grpo"], "micro", [0], "/tmp/unused", variants=["sdpo:x:pipo.lam=0.0"])
    # a variant arm is paired against both the no-PIPO arm and the paper's PIPO arm
    rows = lambda acc: [{"final_accuracy": a, "initial_accuracy": 0.1, "reward_auc": a, "pi_steps": 0}  # noqa: E731
                        for a in acc]
    s = compare.summarise({"grpo": rows([0.5, 0.6]), "grpo+PIPO": rows([0.6, 0.6]),
                           "grpo+PIPO[v]": rows([0.7, 0.9])}, ["grpo"])
    v = s["variants"]["grpo+PIPO[v]"]
    np.testing.assert_allclose(v["minus_base"]["final_accuracy"]["mean"], 0.25)
    np.testing.assert_allclose(v["minus_paper_pipo"]["final_accuracy"]["mean"], 0.2)


# With PIPO: the PI step's gated update runs under vmap as without it, and the base step is the
# program without PIPO. (Both arms run vmapped end to end in tests/test_experiments.py.)
@pytest.mark.slow  # the trainer compiled twice (vmapped and alone)
def test_vmapped_seeds_equal_separate_runs():
    c = grpo_configs.get_config("micro")
    c.pipo.enabled = True
    spec = train_spec(c)
    seeds = [0, 1]
    bases = [qwen3.init_params(spec.model, jax.random.PRNGKey(10 + s)) for s in seeds]
    states = vmapped.stack([init_train_state(spec, p, s) for p, s in zip(bases, seeds)])
    together, m_together = vmapped.vmapped_chunk(spec, states, 3)
    for i, (p, s) in enumerate(zip(bases, seeds)):
        alone, m_alone = loop.scan_chunk(spec, init_train_state(spec, p, s), 3)
        # the same sampled tokens and rewards (exact); params differ only through float32
        # reordering in batched vs unbatched matmuls, which Adam's g / sqrt(v) can amplify up to
        # a full step of lr per parameter and optimizer step: atol = 2 * lr * (steps <= 9 here)
        np.testing.assert_array_equal(m_together["reward_mean"][i], m_alone["reward_mean"])
        np.testing.assert_array_equal(m_together["pi_step_applied"][i], m_alone["pi_step_applied"])
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a[i], b, rtol=0, atol=2 * c.train.lr * 9),
                     jax.device_get(together.params), jax.device_get(alone.params))
    assert not np.array_equal(m_together["reward_mean"][0], m_together["reward_mean"][1])  # seeds differ


def test_a_stored_base_is_reused_only_for_the_settings_it_was_warmed_up_with(tmp_path):
    c = grpo_configs.get_config("micro")
    path = runs.warmed_up_model(c, 0, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["base_seed0"]  # no partial left behind
    stamp = os.path.getmtime(os.path.join(path, "model.safetensors"))
    assert runs.warmed_up_model(c, 0, str(tmp_path)) == path
    assert os.path.getmtime(os.path.join(path, "model.safetensors")) == stamp  # reused, not redone
    c.warmup.steps, c.warmup.eval_every = 3, 1
    with pytest.raises(UsageError, match=r"base_seed0 was warmed up with other settings "
                                         r"\(warmup\.eval_every, warmup\.steps\); remove it or pass another"):
        runs.warmed_up_model(c, 0, str(tmp_path))
    os.remove(os.path.join(path, "warmup.json"))
    with pytest.raises(UsageError, match=r"base_seed0: a base model without a readable warmup.json"):
        runs.warmed_up_model(grpo_configs.get_config("micro"), 0, str(tmp_path))


def test_vmapped_pass_at_1_is_the_trainers_heldout_pass_at_1_per_seed():
    """compare's held-out pass@1 (samples at the rollout temperature, vmapped over seeds) equals what the
    trainer's evaluation reports for each seed's params alone (`Evaluation.pass_at_1`)."""
    from pipo_jax.rl.sections import RunConfig
    from pipo_jax.run.placement import Placement
    from pipo_jax.run.trainer import Evaluation

    c = grpo_configs.get_config("micro")
    c.eval.n, c.eval.heldout_samples = 8, 3
    spec = train_spec(c)
    # seeds 0 and 3: the near-uniform random policies sample with the same keys, and those of seeds 0-2 happen
    # to earn the same rewards; 0 and 3 differ somewhere
    params = [qwen3.init_params(spec.model, jax.random.PRNGKey(s)) for s in (0, 3)]
    rewards = np.asarray(vmapped.vmapped_sampled_rewards(spec, vmapped.stack(params), 8, 3))
    assert rewards.shape == (2, 8, 3)
    evaluation = Evaluation(spec, RunConfig.from_config(c), Placement(), None)
    for i, p in enumerate(params):
        np.testing.assert_array_equal(rewards[i], evaluation.sampled_rewards(p))
    assert len({rewards[0].tobytes(), rewards[1].tobytes()}) == 2  # each seed's own policy


@pytest.mark.slow  # two micro comparisons
def test_a_stopped_comparison_reuses_the_arms_it_finished(tmp_path, monkeypatch):
    """After every arm compare.partial.json holds the arms so far with their configs. Run again with the same
    code (a clean checkout at one commit), seeds and arguments, a comparison stopped after its first arm
    reruns only the second and writes the uninterrupted run's results; from other seeds (or code) the file
    is moved aside, nothing reused."""
    origin = dict(compare.provenance.record(), commit="0" * 40)  # as a clean checkout records it
    monkeypatch.setattr(compare.provenance, "record", lambda: dict(origin))
    out = str(tmp_path / "cmp")
    whole = compare.compare(["grpo"], "micro", [0, 1], out, iterations=2)
    assert whole["reused_arms"] == []
    partial_path = os.path.join(out, compare.PARTIAL)
    with open(partial_path) as f:
        partial = json.load(f)
    assert list(partial["arms"]) == ["grpo", "grpo+PIPO"] and partial["seeds"] == [0, 1]
    del partial["arms"]["grpo+PIPO"]  # as if stopped during the second arm
    with open(partial_path, "w") as f:
        json.dump(partial, f)
    ran = []
    run_group_points = compare.study.run_group_points  # the sweep engine runs each program of arms
    monkeypatch.setattr(compare.study, "run_group_points",
                        lambda group, *a: ran.append(sorted({(p.label, p.config.pipo.enabled) for p in group}))
                        or run_group_points(group, *a))
    resumed = compare.compare(["grpo"], "micro", [0, 1], out, iterations=2)
    assert ran == [[("grpo+PIPO", True)]] and resumed["reused_arms"] == ["grpo"]
    assert resumed["runs"] == json.loads(json.dumps(whole["runs"])) and resumed["summary"] == whole["summary"]
    assert compare.stored_arms(out, origin, [0, 2]) == {}  # other seeds: moved aside, kept
    assert not os.path.exists(partial_path) and os.path.exists(os.path.join(out, "compare.partial.1.json"))


def test_an_arm_leaves_the_warmup_targets_to_the_base():
    """The bases are warmed up once, with the first algorithm's settings; an arm does not check the warm-up's
    sampled targets, which PPO's one response per prompt could never meet (a group of one is never mixed)."""
    c = compare.algorithm_config("ppo", "micro", 2, ("warmup.target_mixed_groups=0.5", "warmup.target_pass_rate=0.3",
                                                     "warmup.check_prompts=8"))
    assert c.rollout.group_size == 1
    with pytest.raises(ConfigError, match=r"config\.warmup\.target_mixed_groups: 0\.5: a group of rollout\.group_size=1"):
        train_spec(c)
    arm = compare.arm_config(c, True, {"pipo.lam": 0.5})
    assert train_spec(arm).pipo.enabled and arm.pipo.lam == 0.5
    assert (c.warmup.target_mixed_groups, arm.warmup.target_mixed_groups, arm.warmup.target_pass_rate) == (0.5, None, None)


def test_a_group_says_what_it_runs(caplog):
    """`vmapped.run_group` names each chunk of iterations it runs (a chunk of a large group runs minutes on a
    CPU, and a heartbeat line follows every `log.heartbeat_s` inside one), and the programs it built."""
    import logging
    import re

    c = grpo_configs.get_config("micro")
    c.iterations = 3
    spec = train_spec(c)
    bases = [qwen3.init_params(spec.model, jax.random.PRNGKey(s)) for s in (0, 1)]
    with caplog.at_level(logging.INFO, logger="pipo_jax.run.heartbeat"):
        rows, _ = vmapped.run_group([compare.with_overrides(c, {"seed": s}) for s in (0, 1)], bases, 2)
    lines = [r.getMessage() for r in caplog.records if r.name == "pipo_jax.run.heartbeat"]
    assert [x for x in lines if x.startswith("2 points")] == [
        "2 points in one program: evaluating iteration 0", "2 points in one program: iterations 1-2 of 3",
        "2 points in one program: iteration 3 of 3"]
    # compiled here, or loaded from the compilation cache that an earlier test process filled
    assert any(re.match(r"running iterations 1-2 of 3: (compiled|loaded) 1 ", x) for x in lines), lines
    assert [r["acc_steps"] for r in rows] == [[0, 2, 3]] * 2
