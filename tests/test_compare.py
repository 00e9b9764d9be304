"""experiments/compare.py (on experiments/vmapped.py): seeds stacked into one vmapped program equal
separate runs; a comparison is a sweep with paired arms on the sweep's engine (experiments/schedule.py):
a stopped one reads the groups it finished, `--workers` and a SLURM array's tasks give the same results."""

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
from pipo_jax.config.sections import RunConfig
from pipo_jax.rl.spec import ConfigError
from pipo_jax.rl.state import init_train_state
from pipo_jax.run.workdir import flat_config
from tests.typed import spec_of


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
                         ("loss.bapo_rho=0.5", "loss.bapo_rho moved: set loss.bapo.rho$"),  # a moved key
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
    spec = spec_of(c)
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
    path = runs.warmed_up_model(RunConfig.from_config(c), 0, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["base_seed0"]  # no partial left behind
    stamp = os.path.getmtime(os.path.join(path, "model.safetensors"))
    assert runs.warmed_up_model(RunConfig.from_config(c), 0, str(tmp_path)) == path
    assert os.path.getmtime(os.path.join(path, "model.safetensors")) == stamp  # reused, not redone
    c.warmup.steps, c.warmup.eval_every = 3, 1
    with pytest.raises(UsageError, match=r"base_seed0 was warmed up with other settings "
                                         r"\(warmup\.eval_every, warmup\.steps\); remove it or pass another"):
        runs.warmed_up_model(RunConfig.from_config(c), 0, str(tmp_path))
    os.remove(os.path.join(path, "warmup.json"))
    with pytest.raises(UsageError, match=r"base_seed0: a base model without a readable warmup.json"):
        runs.warmed_up_model(RunConfig.from_config(grpo_configs.get_config("micro")), 0, str(tmp_path))


def test_a_sampled_warmup_target_ties_the_base_to_the_rollouts_sampling():
    """With a sampled stop target the warm-up's check draws as the rollout draws, so where it stops depends on
    the rollout's sampling: the base's record holds that sampling (a base made at another temperature is then
    refused, as any base made with other settings). Without such a target the sampling is not part of it."""
    plain, hot = grpo_configs.get_config("micro"), grpo_configs.get_config("micro")
    hot.rollout.temperature = 0.7
    assert runs.warmup_record(RunConfig.from_config(plain), 0) == runs.warmup_record(RunConfig.from_config(hot), 0)
    for c in (plain, hot):
        c.warmup.target_pass_rate, c.warmup.check_prompts = 0.3, 8
    a, b = (flat_config(runs.warmup_record(RunConfig.from_config(c), 0)) for c in (plain, hot))
    assert sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k)) == ["sampled_check.temperature"]
    assert (a["sampled_check.temperature"], b["sampled_check.temperature"]) == (1.0, 0.7)


def test_vmapped_pass_at_1_is_the_trainers_heldout_pass_at_1_per_seed():
    """compare's held-out pass@1 (samples at the rollout temperature, vmapped over seeds) equals what the
    trainer's evaluation reports for each seed's params alone (`Evaluation.pass_at_1`)."""
    from tests.rl.micro_trainer import evaluation_of

    c = grpo_configs.get_config("micro")
    c.eval.n, c.eval.heldout_samples = 8, 3
    spec = spec_of(c)
    # seeds 0 and 3: the near-uniform random policies sample with the same keys, and those of seeds 0-2 happen
    # to earn the same rewards; 0 and 3 differ somewhere
    params = [qwen3.init_params(spec.model, jax.random.PRNGKey(s)) for s in (0, 3)]
    rewards = np.asarray(vmapped.vmapped_sampled_rewards(spec, vmapped.stack(params), 8, 3))
    assert rewards.shape == (2, 8, 3)
    evaluation = evaluation_of(spec, RunConfig.from_config(c))
    for i, p in enumerate(params):
        np.testing.assert_array_equal(rewards[i], evaluation.sampled_rewards(p))
    assert len({rewards[0].tobytes(), rewards[1].tobytes()}) == 2  # each seed's own policy


ARGV = ("--algorithms=grpo", "--preset=micro", "--seeds=0,1", "--iterations=2")


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """An uninterrupted micro comparison (GRPO without and with PIPO, seeds 0 and 1, 2 iterations) in this
    process, one group after another: its --out (with the seeds' bases) and its record."""
    out = str(tmp_path_factory.mktemp("whole"))
    record = compare.compare(["grpo"], "micro", [0, 1], out, iterations=2)
    assert record["reused_points"] == [] and record["reused_arms"] == []
    assert record["groups"] == [["grpo/seed0", "grpo/seed1"], ["grpo+PIPO/seed0", "grpo+PIPO/seed1"]]
    return out, record


def _group_files(out: str) -> list[str]:
    return sorted(os.listdir(os.path.join(out, compare.study.GROUPS)))


@pytest.mark.slow  # one micro comparison, then one of its two groups again
def test_a_stopped_comparison_reads_the_groups_it_finished(whole, tmp_path, monkeypatch):
    """Each group of arms writes its own file under <out>/groups/. A comparison stopped before its second group
    (that group's file missing) and run again reruns only that group, reads the first from its file (left
    untouched) and writes the uninterrupted run's report; run once more, it reruns nothing."""
    import shutil

    done, record = whole
    out = str(tmp_path / "cmp")
    shutil.copytree(done, out)
    first, second = (compare.study.group_file(out, names) for names in record["groups"])
    assert _group_files(out) == sorted(os.path.basename(f) for f in (first, second))
    os.remove(second)  # as if stopped while the PIPO arm's group ran
    stamp = os.stat(first).st_mtime_ns
    ran = []
    run_group_points = compare.study.run_group_points  # the engine runs each program of arms through this
    monkeypatch.setattr(compare.study, "run_group_points",
                        lambda group, *a: ran.append([p.name for p in group]) or run_group_points(group, *a))
    resumed = compare.compare(["grpo"], "micro", [0, 1], out, iterations=2)
    assert ran == [["grpo+PIPO/seed0", "grpo+PIPO/seed1"]] and os.stat(first).st_mtime_ns == stamp
    assert resumed["reused_points"] == ["grpo/seed0", "grpo/seed1"] and resumed["reused_arms"] == ["grpo"]
    assert resumed["runs"] == json.loads(json.dumps(record["runs"])) and resumed["summary"] == record["summary"]
    again = compare.compare(["grpo"], "micro", [0, 1], out, iterations=2)
    assert len(ran) == 1 and again["reused_arms"] == ["grpo", "grpo+PIPO"] and again["runs"] == resumed["runs"]
    # another number of iterations is another config: every stored point is set aside, none reused
    def refuse(*args):
        raise RuntimeError("a group ran")

    monkeypatch.setattr(compare.study, "run_group_points", refuse)
    with pytest.raises(RuntimeError, match="a group ran"):
        compare.compare(["grpo"], "micro", [0, 1], out, iterations=3)
    assert len(os.listdir(os.path.join(out, compare.study.GROUPS, "stale"))) == 2


@pytest.mark.slow  # two group processes
def test_two_workers_give_the_results_of_one(whole, tmp_path):
    """--workers=2: each group its own process (`python -m experiments.compare ... --group_index=g`) writing its
    group file; the report read from those files equals the one-process run's."""
    done, record = whole
    out = str(tmp_path / "cmp")
    argv = (*ARGV, f"--out={out}", f"--base_dir={done}", "--workers=2")
    two = compare.compare(["grpo"], "micro", [0, 1], out, iterations=2, base_dir=done,
                          launch=compare.schedule.Launch(argv=argv, workers=2))
    assert sorted(os.listdir(os.path.join(out, "logs"))) == ["group0.log", "group1.log"]
    assert _group_files(out) == _group_files(done) and two["reused_points"] == []
    assert two["runs"] == json.loads(json.dumps(record["runs"])) and two["summary"] == record["summary"]


@pytest.mark.slow  # one group process
def test_the_slurm_array_has_a_task_per_group_and_each_runs_one(whole, tmp_path):
    """--emit_slurm writes a job-array script with one task per group; a task's command (run here as SLURM runs
    it, with its SLURM_ARRAY_TASK_ID) runs exactly that group, writes its file and no report."""
    import subprocess

    done, record = whole
    out, script = str(tmp_path / "cmp"), str(tmp_path / "compare.sbatch")
    argv = (*ARGV, f"--out={out}", f"--base_dir={done}", "--workers=2", f"--emit_slurm={script}")
    assert compare.compare(["grpo"], "micro", [0, 1], out, iterations=2, base_dir=done,
                           launch=compare.schedule.Launch(argv=argv, workers=2, emit_slurm=script)) is None
    text = open(script).read()
    assert f"#SBATCH --array=0-{len(record['groups']) - 1}\n" in text and "#SBATCH --job-name=pipo_compare\n" in text
    (task,) = [line for line in text.splitlines() if "--group_index=" in line]
    assert task.endswith(" -m experiments.compare " + " ".join(argv[:-2]) + ' --group_index="${SLURM_ARRAY_TASK_ID}"')
    res = subprocess.run(["bash", script], env=dict(os.environ, SLURM_ARRAY_TASK_ID="1"), capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (name,) = _group_files(out)
    assert os.path.join(out, compare.study.GROUPS, name) == compare.study.group_file(out, record["groups"][1])
    with open(os.path.join(out, compare.study.GROUPS, name)) as f:
        stored = json.load(f)["points"]
    assert list(stored) == record["groups"][1] and not os.path.exists(os.path.join(out, "compare.json"))
    assert [e["result"] for e in stored.values()] == json.loads(json.dumps(record["runs"]["grpo+PIPO"]))


def test_an_arm_leaves_the_warmup_targets_to_the_base():
    """The bases are warmed up once, with the first algorithm's settings; an arm does not check the warm-up's
    sampled targets, which PPO's one response per prompt could never meet (a group of one is never mixed)."""
    c = compare.algorithm_config("ppo", "micro", 2, ("warmup.target_mixed_groups=0.5", "warmup.target_pass_rate=0.3",
                                                     "warmup.check_prompts=8"))
    assert c.rollout.group_size == 1
    with pytest.raises(ConfigError, match=r"config\.warmup\.target_mixed_groups: 0\.5: a group of rollout\.group_size=1"):
        spec_of(c)
    arm = compare.arm_config(c, True, {"pipo.lam": 0.5})
    assert spec_of(arm).pipo.enabled and arm.pipo.lam == 0.5
    assert (c.warmup.target_mixed_groups, arm.warmup.target_mixed_groups, arm.warmup.target_pass_rate) == (0.5, None, None)


def test_a_group_says_what_it_runs(caplog):
    """`vmapped.run_group` names each chunk of iterations it runs (a chunk of a large group runs minutes on a
    CPU, and a heartbeat line follows every `log.heartbeat_s` inside one), and the programs it built."""
    import logging
    import re

    c = grpo_configs.get_config("micro")
    c.iterations = 3
    spec = spec_of(c)
    bases = [qwen3.init_params(spec.model, jax.random.PRNGKey(s)) for s in (0, 1)]
    with caplog.at_level(logging.INFO, logger="pipo_jax.run.heartbeat"):
        members = [RunConfig.from_config(compare.with_overrides(c, {"seed": s})) for s in (0, 1)]
        rows, _ = vmapped.run_group(members, bases, 2)
    lines = [r.getMessage() for r in caplog.records if r.name == "pipo_jax.run.heartbeat"]
    assert [x for x in lines if x.startswith("2 points")] == [
        "2 points in one program: evaluating iteration 0", "2 points in one program: iterations 1-2 of 3",
        "2 points in one program: iteration 3 of 3"]
    # compiled here, or loaded from the compilation cache that an earlier test process filled
    assert any(re.match(r"running iterations 1-2 of 3: (compiled|loaded) 1 ", x) for x in lines), lines
    assert [r["acc_steps"] for r in rows] == [[0, 2, 3]] * 2
