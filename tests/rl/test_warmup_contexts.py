"""Warm-up demonstrations: flawed (carry-less) answers and SDPO / VPD teacher contexts."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import sdpo as sdpo_configs
from pipo_jax.data import char_vocab as cv
from pipo_jax.rl import learn
from pipo_jax.rl.experience import Rollout
from pipo_jax.config.sections import RunConfig
from pipo_jax.run import teacher_forcing, warmup
from pipo_jax.tasks import arithmetic as ar
from tests.typed import spec_of, train_config

TASK = ar.ArithmeticTask(min_digits=2, max_digits=2, answer_format="reversed", feedback_style="reveal")


def rows(tokens, mask):
    return [cv.decode(np.asarray(t)[np.asarray(m) == 1]) for t, m in zip(tokens, mask)]


def test_carryless_answer_by_hand():
    # 47+85: columns 7+5 -> 2, 4+8 -> 2 (carries dropped); 52-38: |2-8| = 6, |5-3| = 2;
    # 12+30 and 58-23 carry / borrow nowhere, so the mistake is the true answer.
    lhs, op, rhs = np.array([47, 52, 12, 58]), np.array([0, 1, 0, 1]), np.array([85, 38, 30, 23])
    np.testing.assert_array_equal(ar.carryless_answer(lhs, op, rhs, 2), [22, 26, 42, 35])
    flawed = ar.with_answers(TASK, ar.make_problems(TASK, lhs, op, rhs), ar.carryless_answer(lhs, op, rhs, 2))
    assert rows(flawed.target_tokens_ba, flawed.target_mask_ba) == ["22<eos>", "62<eos>", "24<eos>", "53<eos>"]
    np.testing.assert_array_equal(flawed.target_len_b, [3, 3, 3, 3])


def test_context_prompts_by_hand():
    p = ar.make_problems(TASK, np.array([47, 47, 47, 47]), np.array([0, 0, 0, 0]), np.array([85, 85, 85, 85]))
    tokens, mask = ar.context_prompts(TASK, p, np.array([0, 1, 2, 2]), np.array([False, False, True, False]))
    assert tokens.shape == (4, 3 + TASK.answer_len + TASK.feedback_len + TASK.prompt_len)
    assert rows(tokens, mask) == ["<bos>47+85=", "<solution>231<eos><solve><bos>47+85=",
                                  "<feedback><correct><answer>231<solve><bos>47+85=",
                                  "<feedback><wrong><answer>231<solve><bos>47+85="]


def test_context_prompts_match_the_sdpo_teacher_contexts():
    c = sdpo_configs.get_config("micro")
    c.task.arithmetic.min_digits, c.task.arithmetic.max_digits, c.task.arithmetic.feedback_style, c.task.arithmetic.reward_mode = 2, 2, "reveal", "exact"
    c.rollout.group_size, c.rollout.prompts_per_batch, c.train.mini_batch_prompts = 2, 2, 1
    spec = spec_of(c)
    lhs, op, rhs = np.array([47, 47, 52, 52]), np.array([0, 0, 1, 1]), np.array([85, 85, 38, 38])
    problems = ar.make_problems(spec.task, lhs, op, rhs)
    # group 0: row 0 right (row 1 sees it as a solution, row 0 gets feedback <correct>);
    # group 1: both wrong (feedback <wrong> on each)
    texts = ["231<eos>", "221<eos>", "42<eos>", "3<eos>"]
    r = spec.rollout.max_new_tokens
    resp = jnp.array([cv.encode(t) + [cv.PAD_ID] * (r - len(cv.encode(t))) for t in texts])
    resp_mask = (jnp.arange(r)[None] < jnp.array([[len(cv.encode(t))] for t in texts])).astype(jnp.int32)
    rewards = ar.reward(spec.task, problems, resp, resp_mask)
    np.testing.assert_array_equal(rewards, [1, 0, 0, 0])
    rollout = Rollout(problems=problems, tokens_bl=jnp.concatenate([problems.prompt_tokens_bp, resp], 1),
                      mask_bl=jnp.concatenate([problems.prompt_mask_bp, resp_mask], 1),
                      sample_logp_br=jnp.zeros(resp.shape), rewards_b=rewards)
    t_tokens, t_mask, _ = learn.teacher_contexts(spec, rollout, rewards)
    q = t_tokens.shape[1] - r
    expected = rows(t_tokens[:, :q], t_mask[:, :q])
    got = rows(*ar.context_prompts(spec.task, problems, np.array([2, 1, 2, 2]),
                                       np.array([True, False, False, False])))
    assert got == expected
    assert got[1] == "<solution>231<eos><solve><bos>47+85="


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_demonstrations_flaw_only_plain_rows(rate):
    batch = 64
    task = dataclasses.replace(TASK, warmup_context_fraction=0.5, warmup_mistake_rate=rate)  # the task's own shaping
    demo = jax.jit(warmup.demonstrations, static_argnums=(0, 2))(task, jax.random.PRNGKey(3), batch)
    true = ar.make_problems(TASK, demo.lhs_b, demo.op_b, demo.rhs_b)
    flawed = ar.carryless_answer(demo.lhs_b, demo.op_b, demo.rhs_b, 2)
    plain = np.asarray(demo.prompt_tokens_bp[:, -TASK.prompt_len - 1]) != cv.SOLVE_ID
    assert 10 < plain.sum() < batch - 10  # about half the rows carry a context
    expected = np.where(plain & (rate == 1.0), flawed, true.answer_b)
    np.testing.assert_array_equal(demo.answer_b, expected)
    want = ar.with_answers(TASK, true, expected)
    np.testing.assert_array_equal(demo.target_tokens_ba, want.target_tokens_ba)


@pytest.mark.slow  # the main job end to end (warm-up, trainer, evaluation)
def test_trainer_logs_the_teacher_accuracy_with_a_context(tmp_path):
    from pipo_jax.run import observe
    from pipo_jax.run.trainer import EVAL_SEED

    c = sdpo_configs.get_config("micro")
    c.iterations, c.log.every = 1, 1
    c.checkpoint.export_hf = False
    train_config(c, str(tmp_path))
    row = observe.read_metrics(str(tmp_path / "metrics.jsonl"))[0]
    spec = spec_of(c)
    base, m = warmup.warmup(spec.model, spec.task, warmup.WarmupSettings.from_config(RunConfig.from_config(c), spec.task),
                            seed=c.seed)  # deterministic: the run's base
    assert row["warmup_teacher_solution_accuracy"] == m["final_teacher_solution_accuracy"]
    for kind in ("solution", "feedback"):
        expected = float(teacher_forcing.heldout_accuracy(spec.model, base, spec.task, None, c.eval.n,
                                                          jax.random.PRNGKey(EVAL_SEED), kind))
        assert row[f"teacher_accuracy_{kind}"] == expected


@pytest.mark.parametrize("use_feedback, threshold", [(True, 1.0), (False, 1.0), (True, 0.5)])
def test_the_learners_choice_renders_the_teacher_prompts_the_task_chose_before(use_feedback, threshold):
    """The learner now picks each row's context (`experience.choose_contexts`) and the task only renders
    it; the prompts are bit-equal to the task's own choice as it was made before (the first other
    successful response of the group, else feedback), written out here."""
    from pipo_jax.losses.distill import select_demonstrations
    from pipo_jax.rl.experience import choose_contexts
    from pipo_jax.tasks.protocol import TeacherSettings

    g, b = 4, 16
    k_p, k_r, k_t, k_m = jax.random.split(jax.random.PRNGKey(7), 4)
    problems = ar.sample_problems(TASK, k_p, b)
    rewards = jnp.where(jax.random.bernoulli(k_r, 0.3, (b,)), 1.0, jax.random.uniform(k_m, (b,), maxval=0.9))
    resp = jax.random.randint(k_t, (b, TASK.answer_len), 0, cv.VOCAB_SIZE)
    resp_mask = (jnp.arange(TASK.answer_len)[None] < jax.random.randint(k_m, (b, 1), 1, TASK.answer_len)).astype(
        jnp.int32)
    teacher = TeacherSettings(group_size=g, success_threshold=threshold, use_feedback=use_feedback)
    got = TASK.teacher_prompts(problems, resp, resp_mask, choose_contexts(rewards, teacher))
    demo_row, has_demo = select_demonstrations(rewards, g, success_threshold=threshold)
    safe = jnp.maximum(demo_row, 0)
    use_fb = (~has_demo) & use_feedback
    tokens, mask = ar.teacher_prompt(TASK, problems, (resp[safe], resp_mask[safe]), has_demo,
                                     ar.feedback_tokens(TASK, problems, resp, resp_mask), use_fb,
                                     jnp.ones_like(has_demo))
    for x, y in zip(got, (tokens, mask, (has_demo | use_fb).astype(jnp.float32))):
        np.testing.assert_array_equal(x, y)
    assert 0 < int(jnp.sum(has_demo)) < b  # both kinds of rows occur
