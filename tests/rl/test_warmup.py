"""Supervised warm-up of the tiny task model: loss, learning, determinism, early stop."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.data import char_vocab
from pipo_jax.models import qwen3
from pipo_jax.run import teacher_forcing, warmup
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.tasks import arithmetic as ar
from tests.typed import spec_of

TASK = ar.ArithmeticTask(max_digits=1, heldout_fraction=0.3)  # 1-digit '+'/'-', reversed answers
MODEL = warmup.task_model_config(hidden_size=64, head_dim=16, intermediate_size=128)
RUN = dict(batch=32, lr=1e-2, eval_every=20, eval_n=64)
# Jitted helpers: eager dispatch of the model's many small ops is slow on CPU.
answer_loss = jax.jit(warmup.answer_loss, static_argnums=0)
full_logits = jax.jit(qwen3.logits, static_argnums=0)


def settings(**fields) -> warmup.WarmupSettings:
    """`RUN` with `fields` (`steps` among them)."""
    return warmup.WarmupSettings(**(RUN | fields))


def tree_equal(a, b) -> bool:
    return all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), a, b)))


def test_task_model_config():
    c = warmup.task_model_config()
    assert c.vocab_size == 32 >= char_vocab.VOCAB_SIZE
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (128, 2, 4, 2)
    assert warmup.task_model_config(num_hidden_layers=3).num_hidden_layers == 3


def test_the_task_model_presets_differ_in_their_layers_only():
    """`model.preset=task_tiny` (the main job's) has 2 layers, `task_micro` (the micro preset's) 1; shapes
    otherwise equal, the vocabulary sized by the task either way."""
    from configs import grpo

    c = grpo.get_config("micro")
    assert c.model.preset == "task_micro" and grpo.get_config("tiny").model.preset == "task_tiny"
    micro = spec_of(c).model
    c.model.preset = "task_tiny"
    tiny = spec_of(c).model
    assert (tiny.num_hidden_layers, micro.num_hidden_layers) == (2, 1)
    assert tiny.replace(num_hidden_layers=1) == micro and micro.vocab_size == 32


def test_answer_loss_matches_reference():
    params = qwen3.init_params(MODEL, jax.random.PRNGKey(1), std=0.3)  # far from uniform
    p = ar.make_problems(TASK, np.array([7, 9, 3]), np.array([0, 1, 0]), np.array([5, 2, 0]))  # 21<eos>, 7<eos>, 3<eos>
    tokens = jnp.concatenate([p.prompt_tokens_bp, p.target_tokens_ba], axis=1)
    mask = jnp.concatenate([p.prompt_mask_bp, p.target_mask_ba], axis=1)
    logits = np.asarray(full_logits(MODEL, params, tokens, mask), np.float64)
    nll = []
    for b in range(3):
        for i in range(int(p.target_len_b[b])):
            z = logits[b, TASK.prompt_len - 1 + i]
            logz = np.log(np.sum(np.exp(z - z.max()))) + z.max()
            nll.append(logz - z[int(p.target_tokens_ba[b, i])])
    assert len(nll) == 3 + 2 + 2
    got = float(answer_loss(MODEL, params, p))
    assert got == pytest.approx(np.mean(nll), rel=1e-5)


@pytest.fixture(scope="module")
def short_run():
    return warmup.warmup(MODEL, TASK, settings(steps=40), seed=0)


def test_short_warmup_reduces_the_loss(short_run):
    params, m = short_run
    batch = jax.jit(ar.sample_problems, static_argnums=(0, 2, 3))(TASK, jax.random.PRNGKey(123), 256, "train")
    initial = float(answer_loss(MODEL, warmup.initial_params(MODEL, 0), batch))
    assert initial == pytest.approx(math.log(MODEL.vocab_size), abs=0.05)  # N(0, 0.02) init: near-uniform
    final = float(answer_loss(MODEL, params, batch))
    print(f"fixed-batch loss {initial:.3f} -> {final:.3f}; accuracy curve {m['heldout_accuracy']}")
    assert final < initial - 2.0, (initial, final)
    assert m["loss"].shape == (40,) and m["loss"][0] == pytest.approx(initial, abs=0.05)
    assert m["loss"][-5:].mean() < m["loss"][:5].mean() - 2.0
    assert m["eval_steps"] == [0, 20, 40] and len(m["heldout_accuracy"]) == 3
    assert m["initial_accuracy"] == 0.0 and m["steps_run"] == 40 and not m["stopped_early"]
    assert m["final_accuracy"] == m["heldout_accuracy"][-1]
    assert m["final_accuracy"] == pytest.approx(float(teacher_forcing.heldout_accuracy(MODEL, params, TASK, None, 64, jax.random.split(
        jax.random.PRNGKey(0), 3)[2])))


def test_warmup_is_deterministic(short_run):
    params, m = short_run
    again, m2 = warmup.warmup(MODEL, TASK, settings(steps=40), seed=0)
    assert tree_equal(params, again)
    np.testing.assert_array_equal(m["loss"], m2["loss"])
    assert m["heldout_accuracy"] == m2["heldout_accuracy"]
    other, _ = warmup.warmup(MODEL, TASK, settings(steps=40), seed=1)
    assert not tree_equal(params, other)


def test_stops_at_the_first_evaluation_reaching_the_target():
    target = 0.1
    params, m = warmup.warmup(MODEL, TASK, settings(steps=400, target_accuracy=target), seed=0)
    acc = m["heldout_accuracy"]
    print(f"accuracy curve {acc} at steps {m['eval_steps']}")
    assert acc[-1] >= target and all(a < target for a in acc[:-1])
    assert m["stopped_early"] and m["steps_run"] < 400 and m["steps_run"] == m["eval_steps"][-1]
    assert m["steps_run"] % RUN["eval_every"] == 0 and m["loss"].shape == (m["steps_run"],)
    # stopping early is the same run cut short
    plain, _ = warmup.warmup(MODEL, TASK, settings(steps=m["steps_run"]), seed=0)
    assert tree_equal(params, plain)


def test_target_met_at_start_and_given_params():
    start = qwen3.init_params(MODEL, jax.random.PRNGKey(7))
    params, m = warmup.warmup(MODEL, TASK, settings(steps=40, target_accuracy=0.0), seed=0, params=start)
    assert m["steps_run"] == 0 and m["stopped_early"] and m["loss"].shape == (0,) and m["eval_steps"] == [0]
    assert tree_equal(params, start)
    trained, _ = warmup.warmup(MODEL, TASK, settings(steps=20), seed=0, params=start)
    assert not tree_equal(trained, start)
    assert tree_equal(start, qwen3.init_params(MODEL, jax.random.PRNGKey(7)))  # the caller's params are not donated


@pytest.mark.parametrize("kwargs, match", [
    (dict(steps=0), "steps=0"),
    (dict(batch=0), "batch=0"),
    (dict(eval_every=0), "eval_every=0"),
    (dict(target_accuracy=1.5), "target_accuracy=1.5"),
    (dict(model_config=MODEL.replace(vocab_size=16)), "vocab_size=16"),
    (dict(model_config=MODEL.replace(max_position_embeddings=4)), "max_position_embeddings=4"),
])
def test_bad_arguments_name_the_field(kwargs, match):
    args = dict(model_config=MODEL, steps=10, batch=8, lr=1e-3) | kwargs
    model_config = args.pop("model_config")
    with pytest.raises(ValueError, match=match):
        warmup.warmup(model_config, TASK, warmup.WarmupSettings(**args), seed=0)


# The sampled check: what RL will see (pass@1 and mixed groups at the rollout's sampling).
CHECK = dict(check_prompts=16, group_size=4, sampling=SamplingParams(temperature=1.0, max_new_tokens=TASK.answer_len))


def direct_pass_and_mixed(params, seed: int = 0):
    """pass@1 and the mixed share of the warm-up's sampled check, computed here from the sampler and
    the task's reward (not through `teacher_forcing.sampled_rewards`)."""
    from pipo_jax.sampling import sampler

    k_problems, k_samples = jax.random.split(jax.random.fold_in(jax.random.split(jax.random.PRNGKey(seed), 3)[2], 1))
    problems = TASK.heldout_problems(None, 16, k_problems)
    repeated = jax.tree.map(lambda x: jnp.repeat(x, 4, axis=0), problems)
    out = sampler.generate(MODEL, params, repeated.prompt_tokens_bp, repeated.prompt_mask_bp, k_samples,
                           SamplingParams(temperature=1.0, max_new_tokens=TASK.answer_len,
                                          stop_token_ids=tuple(TASK.stop_token_ids), pad_id=TASK.pad_id))
    solved = np.asarray(TASK.reward(repeated, out.tokens_br, out.mask_br)).reshape(16, 4) >= 1.0
    return float(solved.mean()), float(np.mean(solved.any(axis=1) & ~solved.all(axis=1)))


def test_pass_and_mixed_by_hand():
    rewards = np.array([[1.0, 0.0, 0.0, 1.0],   # 2 of 4: mixed
                        [0.0, 0.0, 0.0, 0.0],   # none
                        [1.0, 1.0, 1.0, 1.0],   # all
                        [0.5, 1.0, 0.99, 0.0],  # 1 of 4 (partial credit is not success): mixed
                        [0.9, 0.9, 0.9, 0.9]])  # graded but none solved: not mixed
    pass1, mixed = teacher_forcing.pass_and_mixed(rewards)
    assert pass1 == pytest.approx((2 / 4 + 0 + 1 + 1 / 4 + 0) / 5)  # 0.35
    assert mixed == pytest.approx(2 / 5)
    assert teacher_forcing.pass_and_mixed(np.ones((3, 1))) == (1.0, 0.0)  # one sample: never mixed


@pytest.mark.parametrize("targets", [dict(target_pass_rate=0.1), dict(target_pass_rate=0.1, target_mixed_groups=0.3)])
def test_stops_at_the_first_check_where_the_sampled_targets_hold(targets):
    params, m = warmup.warmup(MODEL, TASK, settings(steps=400, **CHECK, **targets), seed=0)
    pass1, mixed = m["heldout_pass_at_1"], m["mixed_groups"]
    print(f"steps {m['eval_steps']}: greedy {m['heldout_accuracy']}, pass@1 {pass1}, mixed {mixed}")
    holds = [p >= targets["target_pass_rate"] and mx >= targets.get("target_mixed_groups", 0.0)
             for p, mx in zip(pass1, mixed)]
    assert holds[-1] and not any(holds[:-1])
    assert m["stopped_early"] and m["steps_run"] == m["eval_steps"][-1] < 400
    assert m["final_pass_at_1"] == pass1[-1] and m["final_mixed_groups"] == mixed[-1]
    assert len(pass1) == len(mixed) == len(m["heldout_accuracy"]) == len(m["eval_steps"])
    # the figures at the stop are those of a direct computation on the same params and keys
    assert direct_pass_and_mixed(params) == pytest.approx((pass1[-1], mixed[-1]), abs=1e-6)
    # the check never touches the training stream: the same run without it gives the same params and losses
    plain, pm = warmup.warmup(MODEL, TASK, settings(steps=m["steps_run"]), seed=0)
    assert tree_equal(params, plain)
    np.testing.assert_array_equal(m["loss"], pm["loss"])
    assert pm["heldout_accuracy"] == m["heldout_accuracy"] and all(math.isnan(p) for p in pm["heldout_pass_at_1"])


def test_greedy_and_sampled_targets_must_all_hold():
    targets = dict(target_accuracy=0.05, target_pass_rate=0.1)
    _, m = warmup.warmup(MODEL, TASK, settings(steps=400, **CHECK, **targets), seed=0)
    holds = [a >= 0.05 and p >= 0.1 for a, p in zip(m["heldout_accuracy"], m["heldout_pass_at_1"])]
    print(f"steps {m['eval_steps']}: greedy {m['heldout_accuracy']}, pass@1 {m['heldout_pass_at_1']}")
    assert holds[-1] and not any(holds[:-1]) and m["stopped_early"]


def test_resume_with_the_sampled_targets_equals_the_uninterrupted_run():
    import signal

    from pipo_jax.run.preemption import RunInterrupted

    run = settings(steps=60, target_pass_rate=0.1, target_mixed_groups=0.3, **CHECK)
    full_params, full = warmup.warmup(MODEL, TASK, run, seed=0)
    saved = []

    def stop_after_first(progress):
        saved.append(jax.device_get(progress))
        raise RunInterrupted(signal.SIGTERM, "warm-up step 20", "nowhere")

    with pytest.raises(RunInterrupted):
        warmup.warmup(MODEL, TASK, run, seed=0, after_chunk=stop_after_first)
    progress = saved[0]
    assert int(progress.done) == 20 and progress.evals_6e.shape == (6, warmup.max_evals(60, 20))
    np.testing.assert_array_equal(progress.evals_6e[4:, :2], [full["heldout_pass_at_1"][:2], full["mixed_groups"][:2]])
    template = warmup.abstract_progress(MODEL, run)
    assert jax.tree.structure(template) == jax.tree.structure(progress)
    params, resumed = warmup.warmup(MODEL, TASK, run, seed=0, resume=progress)
    assert tree_equal(full_params, params)
    for key in ("loss", "eval_steps", "heldout_accuracy", "heldout_pass_at_1", "mixed_groups", "steps_run",
                "stopped_early"):
        np.testing.assert_array_equal(full[key], resumed[key])

    # a progress saved before the sampled check (evals_4e) resumes too: its earlier checks have no pass@1
    legacy = warmup.LegacyWarmupProgress(progress.params, progress.opt_state, progress.done, progress.losses_s,
                                         progress.evals_6e[:4], progress.n_evals)
    plain = dataclasses.replace(run, target_pass_rate=None, target_mixed_groups=None)
    plain_params, plain_full = warmup.warmup(MODEL, TASK, plain, seed=0)
    params, resumed = warmup.warmup(MODEL, TASK, plain, seed=0, resume=legacy)
    assert tree_equal(plain_params, params)
    assert all(math.isnan(p) for p in resumed["heldout_pass_at_1"][:2])
    assert resumed["heldout_pass_at_1"][2:] == plain_full["heldout_pass_at_1"][2:]
    assert resumed["heldout_accuracy"] == plain_full["heldout_accuracy"]


@pytest.mark.parametrize("kwargs, match", [
    (dict(target_pass_rate=1.5, check_prompts=4), "target_pass_rate=1.5"),
    (dict(target_mixed_groups=-0.1, check_prompts=4), "target_mixed_groups=-0.1"),
    (dict(target_pass_rate=0.5), "target_pass_rate needs the sampled check: check_prompts=0"),
    (dict(check_prompts=-1), "check_prompts=-1"),
    (dict(group_size=0), "group_size=0"),
    (dict(check_prompts=4, sampling=SamplingParams(temperature=0.0)), "temperature=0.0"),
])
def test_bad_sampled_check_arguments_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match) as e:
        warmup.warmup(MODEL, TASK, warmup.WarmupSettings(steps=10, batch=8, lr=1e-3, **kwargs), seed=0)
    assert "\n" not in str(e.value)


def test_settings_from_a_run_config_typed_or_not():
    from configs import grpo
    from pipo_jax.config.sections import RunConfig

    c = grpo.get_config("micro")
    c.rollout.max_new_tokens, c.rollout.top_k, c.warmup.target_pass_rate, c.warmup.check_prompts = 0, 3, 0.2, 4
    want = warmup.WarmupSettings(
        steps=c.warmup.steps, batch=c.warmup.batch, lr=c.warmup.lr, eval_every=c.warmup.eval_every, eval_n=c.eval.n,
        target_accuracy=c.warmup.target_accuracy, target_pass_rate=0.2, target_mixed_groups=None,
        check_prompts=4, group_size=c.rollout.group_size,
        sampling=SamplingParams(temperature=c.rollout.temperature, top_k=3, top_p=c.rollout.top_p,
                                max_new_tokens=TASK.answer_len))  # 0: the task's answer length
    assert warmup.WarmupSettings.from_config(RunConfig.from_config(c), TASK) == want
    c.rollout.max_new_tokens = 5
    assert warmup.WarmupSettings.from_config(RunConfig.from_config(c), TASK).sampling.max_new_tokens == 5
