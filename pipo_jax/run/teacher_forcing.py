"""Greedy accuracy by teacher forcing, for tasks whose problems have one correct response
(`Task.exact_answers`, e.g. the built-in arithmetic task); other tasks with a JAX reward
(`device_reward`, e.g. reasoning-gym's, whose verifier may accept other answers or give
partial credit) are decoded greedily and scored by that reward (`decoded_accuracy`: the share
scored 1.0).

Greedy decoding reproduces a target exactly when the teacher-forced argmax reproduces every
target token: decoding feeds back its own argmax, which is the target token as long as every
earlier prediction matched, and the first mismatch makes the greedy output wrong there. So
one forward over prompt ++ target gives greedy exact-match accuracy without a decode loop
(`tests/rl/test_evaluation.py` holds it equal to decoding with the sampler).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax.models import qwen3
from pipo_jax.sampling import sampler
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.tasks import passk
from pipo_jax.tasks.protocol import Task


def target_logits(model: qwen3.Qwen3Config, params, prompt_tokens_bp, prompt_mask_bp, target_tokens_ba,
                  target_mask_ba) -> jax.Array:
    """float32 logits `[b, a, V]`: row i predicts target token i given the (left-padded)
    prompt and the target tokens < i (one teacher-forced forward)."""
    tokens = jnp.concatenate([prompt_tokens_bp, target_tokens_ba], axis=1)
    mask = jnp.concatenate([prompt_mask_bp, target_mask_ba], axis=1)
    logits_btv, _ = qwen3.forward(model, params, tokens, mask)
    p, a = prompt_tokens_bp.shape[1], target_tokens_ba.shape[1]
    return logits_btv[:, p - 1 : p + a - 1]


def greedy_matches(model: qwen3.Qwen3Config, params, prompt_tokens_bp, prompt_mask_bp, target_tokens_ba,
                   target_mask_ba) -> jax.Array:
    """bool `[b]`: would greedy decoding produce exactly the target (masked positions free)?"""
    logits = target_logits(model, params, prompt_tokens_bp, prompt_mask_bp, target_tokens_ba, target_mask_ba)
    ok = (jnp.argmax(logits, axis=-1) == target_tokens_ba) | (target_mask_ba == 0)
    return jnp.all(ok, axis=1)


def problems_accuracy(model: qwen3.Qwen3Config, params, task: Task, problems) -> jax.Array:
    """float32 []: greedy exact-match accuracy on `problems` (their `reference_responses`)."""
    targets = task.reference_responses(problems)  # raises for a task without them
    ok = greedy_matches(model, params, problems.prompt_tokens_bp, problems.prompt_mask_bp, *targets)
    return jnp.mean(ok.astype(jnp.float32))


def decoded_accuracy(model: qwen3.Qwen3Config, params, task: Task, problems) -> jax.Array:
    """float32 []: the share of `problems` whose greedy response (`task.answer_len` tokens) the
    task's JAX reward scores 1.0, i.e. solved (partial credit does not count; `device_reward` tasks)."""
    out = sampler.generate(model, params, problems.prompt_tokens_bp, problems.prompt_mask_bp, jax.random.PRNGKey(0),
                           SamplingParams(max_new_tokens=task.answer_len, temperature=0.0,
                                          stop_token_ids=tuple(task.stop_token_ids), pad_id=task.pad_id))
    return jnp.mean((task.reward(problems, out.tokens_br, out.mask_br) >= 1.0).astype(jnp.float32))


@functools.partial(jax.jit, static_argnames=("model", "task", "n", "kind"))
def heldout_accuracy(model: qwen3.Qwen3Config, params, task: Task, table, n: int, rng: jax.Array,
                     kind: str = "none") -> jax.Array:
    """float32 []: greedy accuracy on the task's `n` held-out problems for `rng`
    (`heldout_problems`), or with kind != "none" on those problems shown that teacher context
    (`teacher_eval_problems`). Pass a fixed key to evaluate on the same problems every time."""
    if kind == "none":
        problems = task.heldout_problems(table, n, rng)
    else:
        problems = task.teacher_eval_problems(table, n, rng)[kind]
    if not task.capabilities.exact_answers and task.capabilities.device_reward:
        return decoded_accuracy(model, params, task, problems)
    return problems_accuracy(model, params, task, problems)


@functools.partial(jax.jit, static_argnames=("model", "task", "n", "samples", "sampling"))
def sampled_rewards(model: qwen3.Qwen3Config, params, task: Task, table, n: int, samples: int, problems_rng: jax.Array,
                    samples_rng: jax.Array, sampling: SamplingParams) -> jax.Array:
    """float32 `[m, samples]`: the task's JAX reward (`device_reward`) of `samples` responses to each
    of its `m` held-out problems for `problems_rng` (`heldout_problems`: `n`, or all of a held-out split
    smaller than `n`, as the greedy accuracy scores them), drawn with `sampling`
    (its stop tokens / pad id are the task's) and `samples_rng` (response j of problem i is row
    `i * samples + j` of one `sampler.generate`, which folds the row into the key). One program:
    the sampled side of the held-out figures (pass@1 = mean success, the share of mixed groups)."""
    problems = task.heldout_problems(table, n, problems_rng)
    repeated = jax.tree.map(lambda x: jnp.repeat(x, samples, axis=0), problems)
    sp = dataclasses.replace(sampling, stop_token_ids=tuple(task.stop_token_ids), pad_id=task.pad_id)
    out = sampler.generate(model, params, repeated.prompt_tokens_bp, repeated.prompt_mask_bp, samples_rng, sp)
    return task.reward(repeated, out.tokens_br, out.mask_br).reshape(-1, samples)


SOLVED = 1.0  # a response whose reward reaches this solves its problem (as in the greedy accuracy)


def pass_and_mixed(rewards_pg) -> tuple[float, float]:
    """(pass@1, mixed share) of rewards `[problems, samples]`: pass@1 is the unbiased estimator
    (`tasks/passk.py`, c / n per problem) averaged over problems; a group is mixed when some but not
    all of its responses reach `SOLVED` (the groups whose GRPO advantages are not all zero)."""
    rewards = np.asarray(rewards_pg, np.float64)
    n, c = passk.correct_counts(rewards, SOLVED)
    pass1 = float(np.mean([passk.pass_at_k(int(ni), int(ci), 1) for ni, ci in zip(n, c)]))
    return pass1, float(np.mean((c > 0) & (c < n)))
