"""Greedy accuracy by teacher forcing (`run/teacher_forcing.py`) against greedy decoding, and
the trainer's two evaluation paths (teacher-forced / decoded and scored) held equal."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.data import char_vocab as cv
from pipo_jax.models import qwen3
from pipo_jax.run import evaluate, teacher_forcing, warmup
from pipo_jax.tasks import arithmetic as ar

sample = jax.jit(ar.sample_problems, static_argnums=(0, 2, 3))
forward = jax.jit(qwen3.forward, static_argnums=0)


def greedy_correct(config, params, problems):
    return jax.jit(teacher_forcing.greedy_matches, static_argnums=0)(
        config, params, problems.prompt_tokens_bp, problems.prompt_mask_bp, problems.target_tokens_ba,
        problems.target_mask_ba)


def target_logits(config, params, problems):
    return jax.jit(teacher_forcing.target_logits, static_argnums=0)(
        config, params, problems.prompt_tokens_bp, problems.prompt_mask_bp, problems.target_tokens_ba,
        problems.target_mask_ba)


# ----------------------------------------------------------------------------- greedy accuracy




def greedy_decode(config, params, problems, steps):
    """Plain step-by-step greedy generation with the KV cache: `[b, steps]` tokens."""
    b, p = problems.prompt_tokens_bp.shape
    cache = qwen3.init_cache(config, b, p + steps)
    logits, cache = forward(config, params, problems.prompt_tokens_bp, problems.prompt_mask_bp, None, cache)
    position = jnp.sum(problems.prompt_mask_bp, axis=1)
    token = jnp.argmax(logits[:, -1], axis=-1)
    out = [token]
    for _ in range(steps - 1):
        logits, cache = forward(config, params, token[:, None], jnp.ones((b, 1), jnp.int32), position[:, None], cache)
        position = position + 1
        token = jnp.argmax(logits[:, -1], axis=-1)
        out.append(token)
    return np.stack([np.asarray(t) for t in out], axis=1)


def generated_mask(tokens_bt):
    """1 up to and including the first EOS (what a sampler that stops at EOS returns)."""
    is_eos = tokens_bt == cv.EOS_ID
    before = np.cumsum(is_eos, axis=1) - is_eos
    return (before == 0).astype(np.int32)


TINY_TASK = ar.ArithmeticTask(max_digits=1, heldout_fraction=0.3)
TINY_MODEL = warmup.task_model_config(hidden_size=64, head_dim=16, intermediate_size=128)


@pytest.fixture(scope="module")
def partly_trained():
    """A model that gets some, not all, 1-digit problems right (60 warm-up steps)."""
    params, _ = warmup.warmup(TINY_MODEL, TINY_TASK,
                              warmup.WarmupSettings(steps=60, batch=32, lr=1e-2, eval_every=60, eval_n=64), seed=0)
    return params


@pytest.mark.parametrize("split", ar.SPLITS)
def test_teacher_forced_accuracy_equals_greedy_decoding(partly_trained, split):
    problems = sample(TINY_TASK, jax.random.PRNGKey(5), 64, split)
    decoded = greedy_decode(TINY_MODEL, partly_trained, problems, TINY_TASK.answer_len)
    target = np.asarray(problems.target_tokens_ba)
    n_target = np.asarray(problems.target_len_b)
    decode_ok = np.array([np.array_equal(decoded[i, : n_target[i]], target[i, : n_target[i]]) for i in range(64)])
    fast_ok = np.asarray(greedy_correct(TINY_MODEL, partly_trained, problems))
    np.testing.assert_array_equal(fast_ok, decode_ok)
    assert 0 < decode_ok.sum() < 64, "the check needs both right and wrong answers"
    # teacher-forced argmax equals the greedy tokens up to and including the first error
    pred = np.asarray(jnp.argmax(target_logits(TINY_MODEL, partly_trained, problems), axis=-1))
    for i in range(64):
        wrong = np.nonzero(pred[i, : n_target[i]] != target[i, : n_target[i]])[0]
        upto = (wrong[0] + 1) if len(wrong) else n_target[i]
        np.testing.assert_array_equal(pred[i, :upto], decoded[i, :upto])
    # the reward of the real greedy generation agrees too
    r = ar.reward(TINY_TASK, problems, decoded, generated_mask(decoded))
    np.testing.assert_array_equal(np.asarray(r), decode_ok.astype(np.float32))


def test_heldout_accuracy_is_greedy_exact_match(partly_trained):
    key = jax.random.PRNGKey(9)
    acc = float(teacher_forcing.heldout_accuracy(TINY_MODEL, partly_trained, TINY_TASK, None, 64, key))
    problems = sample(TINY_TASK, key, 64, "heldout")
    decoded = greedy_decode(TINY_MODEL, partly_trained, problems, TINY_TASK.answer_len)
    r = ar.reward(TINY_TASK, problems, decoded, generated_mask(decoded))
    assert acc == pytest.approx(float(np.mean(r)), abs=1e-7)
    assert all(ar.is_heldout(TINY_TASK, problems.lhs_b, problems.op_b, problems.rhs_b))


def test_decoded_evaluation_equals_teacher_forced(partly_trained):
    """The trainer's two held-out evaluations agree on a task with exact answers: decoding
    with the sampler and scoring on the host (`evaluate.decoded_heldout_accuracy`, the path
    of tasks without exact answers) gives the teacher-forced accuracy."""
    spec = types.SimpleNamespace(task=TINY_TASK, model=TINY_MODEL,
                                 rollout=types.SimpleNamespace(max_new_tokens=TINY_TASK.answer_len))
    decoded = evaluate.decoded_heldout_accuracy(spec, partly_trained, TINY_TASK.scorer(), 64)
    forced = float(teacher_forcing.heldout_accuracy(TINY_MODEL, partly_trained, TINY_TASK, None, 64,
                                                    jax.random.PRNGKey(0)))
    assert decoded == forced
    assert 0 < forced < 1, "the check needs both right and wrong answers"
