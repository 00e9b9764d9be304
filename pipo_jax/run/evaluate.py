"""Evaluation: load a policy (HF directory or a training run's orbax checkpoint), sample
`n` responses per problem with the one-jit sampler, score them, and hand the per-problem
rewards `[problems, n]` to `pipo_jax.tasks.passk` for pass@1 (mean over n) and pass@k.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax import platforms
from pipo_jax.data.prompts import build_prompts
from pipo_jax.data.sources import Example, SourceConfig, load_examples
from pipo_jax.models import hf, qwen3
from pipo_jax.config.sections import RunConfig
from pipo_jax.rl.spec import TrainSpec
from pipo_jax.run.checkpoint import Checkpointer
from pipo_jax.run.placement import Placement
from pipo_jax.run import teacher_forcing
from pipo_jax.run.setup import train_spec
from pipo_jax.run.workdir import read_config_json
from pipo_jax.sampling import sampler
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.tasks import passk
from pipo_jax.tasks.dataset import check_math_references
from pipo_jax.tasks.protocol import HostScorer


def load_run_config(workdir: str) -> RunConfig:
    """The typed config a training run saved in `workdir/config.json` (keys a release moved at their new
    place, keys it lacks at their defaults); `ConfigError` naming a key that is no longer valid."""
    path = os.path.join(workdir, "config.json")
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{workdir}: no config.json (not a pipo_jax training run directory)")
    return RunConfig.from_config(read_config_json(path))


def restore_run(workdir: str, step: int | None = None) -> tuple[TrainSpec, Any]:
    """(the run's TrainSpec, its `TrainState` at checkpoint `step`, default the newest that reads)."""
    spec = train_spec(load_run_config(workdir))
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
    try:  # step None: the newest checkpoint that reads
        state = Placement().restore(ckpt, spec, step)  # from an abstract template: nothing initialised
    finally:
        ckpt.close()
    return spec, state


def load_policy(path: str, step: int | None = None) -> tuple[qwen3.Qwen3Config, Any, TrainSpec | None]:
    """(model config, params, the run's TrainSpec or None) from a HF dir or a run workdir.

    A run workdir is recognised by `checkpoints/`; `step` picks a checkpoint (default: the newest that reads).
    """
    return load_policy_at(path, step)[:3]


def load_policy_at(path: str, step: int | None = None) -> tuple[qwen3.Qwen3Config, Any, TrainSpec | None, int | None]:
    """`load_policy` and the step of the checkpoint read (None for a HF directory)."""
    if os.path.isdir(os.path.join(path, "checkpoints")):
        spec, state = restore_run(path, step)
        return spec.model, state.params, spec, int(jax.device_get(state.step))
    if os.path.exists(os.path.join(path, "config.json")):
        config, params = hf.load(path)
        # Programs for this host's devices (start-up, not trace time).
        return config.replace(platform=platforms.of_devices(jax.devices())), params, None, None
    raise FileNotFoundError(f"{path}: neither a Hugging Face directory (config.json) nor a run workdir (checkpoints/)")


def task_sampling(spec: TrainSpec, **fields) -> SamplingParams:
    """`SamplingParams` with the spec's response budget (`rollout.max_new_tokens`, R tokens) and the
    task's stop tokens and pad id; `fields` the others (default: temperature 1, no truncation)."""
    return SamplingParams(max_new_tokens=spec.rollout.max_new_tokens, stop_token_ids=tuple(spec.task.stop_token_ids),
                          pad_id=spec.task.pad_id, **fields)


def sample_n(model: qwen3.Qwen3Config, params, prompt_tokens_bp, prompt_mask_bp, n: int, rng,
             sampling: SamplingParams, *, batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """`n` samples per prompt drawn with `sampling` (R = `sampling.max_new_tokens`): (tokens `[P, n, R]`,
    mask `[P, n, R]`), batched by `batch_size` rows (the batch from row s with key `fold_in(rng, s)`)."""
    prompts = np.repeat(np.asarray(prompt_tokens_bp), n, axis=0)
    masks = np.repeat(np.asarray(prompt_mask_bp), n, axis=0)
    outs_t, outs_m = [], []
    for start in range(0, len(prompts), batch_size):
        rows = slice(start, start + batch_size)
        pad = batch_size - len(prompts[rows])  # one compile: pad the last batch with copies
        take = lambda x: np.concatenate([x[rows], np.repeat(x[:1], pad, 0)]) if pad else x[rows]  # noqa: E731
        out = sampler.generate(model, params, jnp.asarray(take(prompts)), jnp.asarray(take(masks)),
                               jax.random.fold_in(rng, start), sampling)
        keep = batch_size - pad
        outs_t.append(np.asarray(out.tokens_br)[:keep])
        outs_m.append(np.asarray(out.mask_br)[:keep])
    p = len(prompt_tokens_bp)
    return (np.concatenate(outs_t).reshape(p, n, -1), np.concatenate(outs_m).reshape(p, n, -1))


def heldout_rewards(spec: TrainSpec, params, n_problems: int, n: int, rng, temperature: float = 1.0,
                    batch_size: int = 256) -> np.ndarray:
    """Rewards `[n_problems, n]` of `n` samples on held-out problems of a `device_reward` task
    (the built-in task), scored by its JAX reward."""
    task = spec.task
    if not task.capabilities.device_reward:
        raise ValueError(f"the {task.name} task is scored on the host: use its benchmarks (math_benchmarks)")
    k_prob, k_gen = jax.random.split(rng)
    problems = task.heldout_problems(task.prompt_table(), n_problems, k_prob)
    tokens, mask = sample_n(spec.model, params, problems.prompt_tokens_bp, problems.prompt_mask_bp, n, k_gen,
                            task_sampling(spec, temperature=temperature), batch_size=batch_size)
    repeated = jax.tree.map(lambda x: jnp.repeat(x, n, axis=0), problems)
    r = task.reward(repeated, jnp.asarray(tokens.reshape(n_problems * n, -1)),
                    jnp.asarray(mask.reshape(n_problems * n, -1)))
    return np.asarray(r).reshape(n_problems, n)


def greedy_heldout_accuracy(spec: TrainSpec, params, n_problems: int, rng) -> float:
    """Greedy accuracy on the `n_problems` held-out problems `heldout_rewards(..., rng)` samples (the same
    problem key), as the trainer's `heldout_accuracy` scores them (`teacher_forcing.heldout_accuracy`:
    teacher-forced for exact answers, else decoded and scored by the JAX reward)."""
    k_prob, _ = jax.random.split(rng)
    task = spec.task
    return float(teacher_forcing.heldout_accuracy(spec.model, params, task, task.prompt_table(), n_problems, k_prob))


def decoded_heldout_accuracy(spec: TrainSpec, params, scorer: HostScorer, n: int, batch_size: int = 64) -> float:
    """Mean greedy reward on the task's `n` held-out problems (`heldout_problems`), decoded with
    the sampler and scored by `scorer` (`Task.scorer()`): the fraction solved for math, of tests
    passed for code. For tasks without `exact_answers`; the others use `teacher_forcing`."""
    task = spec.task
    problems = jax.device_get(task.heldout_problems(task.prompt_table(), n, jax.random.PRNGKey(0)))
    rows = len(problems.prompt_tokens_bp)
    tokens, mask = sample_n(spec.model, params, problems.prompt_tokens_bp, problems.prompt_mask_bp, 1,
                            jax.random.PRNGKey(0), task_sampling(spec, temperature=0.0),
                            batch_size=min(batch_size, rows))
    return float(np.mean(scorer.score(problems, tokens[:, 0], mask[:, 0]).rewards_b))


def sampled_heldout_rewards(spec: TrainSpec, params, scorer: HostScorer, n: int, samples: int, rng,
                            batch_size: int = 64) -> np.ndarray:
    """Rewards `[n, samples]`: `samples` responses to each of the task's `n` held-out problems (those
    `decoded_heldout_accuracy` scores greedily), sampled as the rollout samples (`spec.rollout`'s
    temperature, top_k, top_p, max_new_tokens) with `rng`, scored by the host `scorer` (`Task.scorer()`).
    The trainer's `heldout_pass_at_1` for a task without a JAX reward: `samples` times the greedy decode."""
    task, r = spec.task, spec.rollout
    problems = jax.device_get(task.heldout_problems(task.prompt_table(), n, jax.random.PRNGKey(0)))
    rows = len(problems.prompt_tokens_bp)
    tokens, mask = sample_n(spec.model, params, problems.prompt_tokens_bp, problems.prompt_mask_bp, samples, rng,
                            task_sampling(spec, temperature=r.temperature, top_k=r.top_k, top_p=r.top_p),
                            batch_size=min(batch_size, rows * samples))
    repeated = jax.tree.map(lambda x: np.repeat(np.asarray(x), samples, axis=0), problems)
    scores = scorer.score(repeated, tokens.reshape(rows * samples, -1), mask.reshape(rows * samples, -1))
    return np.asarray(scores.rewards_b, np.float32).reshape(rows, samples)


def load_math_benchmark(source: SourceConfig) -> list[Example]:
    """A math benchmark's rows, every reference answer checked as the math scorer reads it: a bad one
    is a `DataError` naming its file and row when the file loads, not at the first evaluation."""
    examples = load_examples(source)
    check_math_references(examples)
    return examples


def math_benchmarks(model: qwen3.Qwen3Config, params, tokenizer, benchmarks: dict[str, Sequence], prompt_config,
                    verifier, n: int, ks: Sequence[int], rng, sampling: SamplingParams, *,
                    batch_size: int = 64) -> tuple[list, dict]:
    """pass@1 / pass@k rows (`passk.summarize`) of `n` samples per problem of every benchmark
    `{name: examples}`, and per-benchmark info (problems, prompts dropped / truncated).

    `sampling`, `batch_size`: as `math_rewards` takes them (benchmark `i` with key `fold_in(rng, i)`).
    The trainer's periodic evaluation and experiments/eval.py both score benchmarks through here.
    """
    rewards, info = {}, {}
    for i, (name, examples) in enumerate(benchmarks.items()):
        rewards[name], info[name] = math_rewards(model, params, tokenizer, examples, prompt_config, verifier, n,
                                                 jax.random.fold_in(rng, i), sampling, batch_size=batch_size)
    return passk.summarize(rewards, ks), info


def math_rewards(model: qwen3.Qwen3Config, params, tokenizer, examples, prompt_config, verifier, n: int, rng,
                 sampling: SamplingParams, *, batch_size: int = 64) -> tuple[np.ndarray, dict]:
    """Rewards `[problems, n]` of `n` samples per math problem drawn with `sampling` (its stop tokens
    and pad id the tokenizer's; the prompts are left-padded with that pad id), `batch_size` rows per
    sampling batch, verified against the reference answers.

    Prompts longer than `prompt_config.max_prompt_tokens` follow `prompt_config.overlong`
    (dropped ones are counted in the returned info, as are the responses the verifier's batch
    budget left unchecked, scored 0: "unscored").
    """
    prompt_set = build_prompts(examples, tokenizer, prompt_config)
    width = max(len(ids) for ids in prompt_set.token_ids)
    tokens = np.full((len(prompt_set.token_ids), width), sampling.pad_id, np.int32)
    mask = np.zeros_like(tokens)
    for i, ids in enumerate(prompt_set.token_ids):  # left-padded
        tokens[i, width - len(ids):] = ids
        mask[i, width - len(ids):] = 1
    out, out_mask = sample_n(model, params, tokens, mask, n, rng, sampling, batch_size=batch_size)
    texts = [tokenizer.decode(row[m == 1], skip_special_tokens=True)
             for rows, ms in zip(out, out_mask) for row, m in zip(rows, ms)]
    golds = [ex.answer for ex in prompt_set.examples for _ in range(n)]
    results = verifier.score_batch(texts, golds)
    rewards = np.asarray([r.reward for r in results], np.float32).reshape(len(prompt_set.examples), n)
    return rewards, {"dropped": prompt_set.num_dropped, "truncated": prompt_set.num_truncated,
                     "problems": len(prompt_set.examples), "unscored": sum(r.unscored for r in results)}
