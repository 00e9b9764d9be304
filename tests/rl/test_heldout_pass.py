"""What RL will see, reported beside the greedy figures: the trainer's `heldout_pass_at_1` (responses
sampled as the rollout samples, on the greedy accuracy's fixed problems, with a key of their own),
the warm-up's sampled-check keys refused in one line naming them where they cannot apply, the
warm-up checkpoint of the former layout read by the trainer, and the default run's training
unchanged by the extra evaluation."""

import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo
from pipo_jax.models import qwen3
from pipo_jax.rl import rollout
from pipo_jax.config.sections import RunConfig
from pipo_jax.rl.spec import ConfigError, check_run_config
from pipo_jax.run import warmup
from pipo_jax.run.checkpoint import Checkpointer
from pipo_jax.run.preemption import StopRequests
from pipo_jax.run.trainer import EVAL_SEED, PASS_SEED, WarmupCheckpoints
from pipo_jax.sampling import sampler
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.tasks.arithmetic import ArithmeticTask
from pipo_jax.tasks.protocol import TaskCapabilities
from tests.conftest import override
from tests.rl.micro_trainer import evaluation_of
from tests.typed import spec_of, train_config


def micro(**overrides):
    """The micro preset with the sampled warm-up check on (the preset turns it off to keep the suite short)."""
    c = grpo.get_config("micro")
    c.checkpoint.export_hf = False
    c.warmup.check_prompts = 64
    return override(c, overrides)


HOST_TASK = types.SimpleNamespace(name="hosted", train_size=0,
                                  capabilities=TaskCapabilities(device_reward=False, warmup=True))
DEVICE_TASK = types.SimpleNamespace(name="arithmetic", train_size=0,
                                    capabilities=TaskCapabilities(device_reward=True, warmup=True))


@pytest.mark.parametrize("overrides, task, message", [
    ({"warmup.target_pass_rate": 0.3}, HOST_TASK,
     "config.warmup.target_pass_rate: the warm-up's sampled check scores with the task's JAX reward; the hosted task"),
    ({"warmup.target_mixed_groups": 0.3}, HOST_TASK, "config.warmup.target_mixed_groups: the warm-up's sampled check"),
    ({"warmup.target_mixed_groups": 0.3, "rollout.group_size": 1}, DEVICE_TASK,
     "config.warmup.target_mixed_groups: 0.3: a group of rollout.group_size=1 response is never mixed"),
])
def test_the_sampled_targets_are_refused_where_they_cannot_apply(overrides, task, message):
    c = RunConfig.from_config(micro(**overrides))
    with pytest.raises(ConfigError) as e:
        check_run_config(c, task)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    check_run_config(RunConfig.from_config(micro()), task)  # the defaults (targets off) pass


@pytest.mark.parametrize("overrides, message", [
    ({"warmup.target_pass_rate": 1.5}, "config.warmup.target_pass_rate: 1.5 must be in [0, 1]"),
    ({"warmup.target_mixed_groups": -0.5}, "config.warmup.target_mixed_groups: -0.5 must be in [0, 1]"),
    ({"warmup.check_prompts": -1}, "config.warmup.check_prompts: -1 must be >= 0"),
    ({"warmup.target_pass_rate": 0.3, "warmup.check_prompts": 0},
     "config.warmup.target_pass_rate: 0.3 is measured on the sampled check: set warmup.check_prompts >= 1"),
    ({"eval.heldout_samples": -2}, "config.eval.heldout_samples: -2 must be >= 0"),
])
def test_the_new_keys_errors_are_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        RunConfig.from_config(micro(**overrides))
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_heldout_pass_at_1_is_the_mean_success_of_rollout_samples_on_the_eval_problems():
    c = micro(**{"rollout.temperature": 0.7, "eval.heldout_samples": 3})
    spec, run = spec_of(c), RunConfig.from_config(c)
    params = qwen3.init_params(spec.model, jax.random.PRNGKey(3), std=0.3)
    evaluation = evaluation_of(spec, run)
    rewards = evaluation.sampled_rewards(params)
    assert rewards.shape == (16, 3)
    # by hand: the greedy accuracy's problems, each repeated 3 times, sampled at the rollout's T with PASS_SEED
    task = spec.task
    problems = task.heldout_problems(rollout.prompt_table(spec), 16, jax.random.PRNGKey(EVAL_SEED))
    repeated = jax.tree.map(lambda x: jnp.repeat(x, 3, axis=0), problems)
    out = sampler.generate(spec.model, params, repeated.prompt_tokens_bp, repeated.prompt_mask_bp,
                           jax.random.PRNGKey(PASS_SEED),
                           SamplingParams(temperature=0.7, max_new_tokens=spec.rollout.max_new_tokens,
                                          stop_token_ids=tuple(task.stop_token_ids), pad_id=task.pad_id))
    direct = np.asarray(task.reward(repeated, out.tokens_br, out.mask_br)).reshape(16, 3)
    np.testing.assert_array_equal(rewards, direct)
    assert evaluation.pass_at_1(params) == pytest.approx(float(np.mean(direct >= 1.0)))
    assert 0.0 < float(np.mean(direct)) and np.unique(direct).size > 1  # graded per-token rewards: real samples
    scores = evaluation(params, 0)
    assert set(scores) == {"heldout_accuracy", "heldout_pass_at_1"}
    assert scores["heldout_pass_at_1"] == evaluation.pass_at_1(params)
    off = evaluation_of(spec, RunConfig.from_config(micro(**{"eval.heldout_samples": 0})))
    assert set(off(params, 0)) == {"heldout_accuracy"}


def test_a_heldout_split_smaller_than_eval_n_is_sampled_whole():
    """A dataset-like task gives the greedy accuracy all of a held-out split smaller than `eval.n`; the
    sampled pass@1 takes the same problems (digit sums 0..9 hold out 1 number: 1 x 3 rewards, not 16 x 3)."""
    c = micro(**{"task.name": "digit_sum", "task.digit_sum.max_digits": 1, "eval.heldout_samples": 3})
    spec = spec_of(c)
    assert spec.task.heldout_problems(rollout.prompt_table(spec), 16, None).number_b.shape == (1,)
    evaluation = evaluation_of(spec, RunConfig.from_config(c))
    rewards = evaluation.sampled_rewards(qwen3.init_params(spec.model, jax.random.PRNGKey(3), std=0.3))
    assert rewards.shape == (1, 3) and set(np.unique(rewards)) <= {0.0, 1.0}


def test_a_warmup_checkpoint_of_the_former_layout_is_read_by_the_trainer(tmp_path):
    model = warmup.task_model_config(hidden_size=64, head_dim=16, intermediate_size=128)
    config = RunConfig.from_config(micro(**{"warmup.steps": 4, "warmup.lr": 1e-2, "warmup.eval_every": 2}))
    params = warmup.initial_params(model, 0)
    opt_state = warmup.make_warmup_optimizer(1e-2).init(params)
    evals = np.zeros((4, warmup.max_evals(4, 2)), np.float32)
    evals[:, :2] = [[0, 2], [0.25, 0.5], [0.1, 0.2], [0.3, 0.4]]
    legacy = warmup.LegacyWarmupProgress(params, opt_state, np.int32(2), np.arange(4, dtype=np.float32), evals,
                                         np.int32(2))
    ckpt = Checkpointer(str(tmp_path / "warmup_checkpoints"), keep=1)
    ckpt.save(2, legacy)
    ckpt.close()
    with StopRequests() as stop:
        wc = WarmupCheckpoints(str(tmp_path), types.SimpleNamespace(model=model, task=ArithmeticTask()), config, stop)
        progress = wc.restore()
        wc.close()
    assert isinstance(progress, warmup.WarmupProgress) and int(progress.done) == 2
    np.testing.assert_array_equal(progress.evals_6e[:4], evals)
    assert np.isnan(progress.evals_6e[4:]).all()
    jax.tree.map(np.testing.assert_array_equal, progress.params, params)


def rows(workdir):
    with open(f"{workdir}/metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def test_the_extra_evaluation_leaves_the_training_unchanged(tmp_path):
    """A micro run with heldout_pass_at_1 at every evaluation and the warm-up's sampled check (the main
    job's defaults; the micro preset turns both off) and the same run with both off train identically:
    every training metric and the final params."""
    kw = {"iterations": 2, "eval.every": 1, "log.every": 1}
    on = train_config(micro(**kw, **{"eval.heldout_samples": 4, "warmup.check_prompts": 64}), str(tmp_path / "on"))
    off = train_config(micro(**kw, **{"eval.heldout_samples": 0, "warmup.check_prompts": 0}), str(tmp_path / "off"))
    a, b = rows(tmp_path / "on"), rows(tmp_path / "off")
    timing = ("time", "tokens_per_s")
    assert len(a) == len(b) == 3
    for ra, rb in zip(a, b):
        extra = {k for k in ra if "pass_at_1" in k or "mixed" in k and k.startswith("warmup")}
        assert extra == ({"heldout_pass_at_1", "warmup_pass_at_1", "warmup_mixed_groups_frac"} if ra["step"] == 0
                         else {"heldout_pass_at_1"})
        assert {k: v for k, v in ra.items() if k not in extra and not any(t in k for t in timing)} == \
               {k: v for k, v in rb.items() if not any(t in k for t in timing)}
    assert "reward_mean" in a[1] and "heldout_accuracy" in a[2]
    jax.tree.map(np.testing.assert_array_equal, on["state"].params, off["state"].params)
    summary = json.loads((tmp_path / "on" / "summary.json").read_text())
    assert summary["initial_pass_at_1"] == a[0]["heldout_pass_at_1"]
    assert summary["final_pass_at_1"] == a[-1]["heldout_pass_at_1"]
    assert summary["warmup"] == {"steps": 2, "greedy_accuracy_on_its_check_set": a[0]["warmup_accuracy"],
                                 "pass_at_1_on_its_check_set": a[0]["warmup_pass_at_1"],
                                 "mixed_groups_on_its_check_set": a[0]["warmup_mixed_groups_frac"]}
    assert "final_pass_at_1" not in json.loads((tmp_path / "off" / "summary.json").read_text())
