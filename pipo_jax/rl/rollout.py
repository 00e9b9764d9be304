"""Rollouts: sample prompts, generate G responses each, score them; DAPO's dynamic sampling.

A `Rollout` holds `B` sequences laid out `prompt (left-padded, width P) ++ response
(right-padded, width R)`, the sampler's log-probs and the task rewards. Everything here
is a pure function of fixed shapes so the whole collection can sit inside one jit.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from pipo_jax import parallel
from pipo_jax.data import char_vocab
from pipo_jax.losses import advantages
from pipo_jax.rl import steps
from pipo_jax.rl.spec import ConfigError, TrainSpec
from pipo_jax.sampling import sampler
from pipo_jax.tasks import arithmetic, dataset


@struct.dataclass
class Rollout:
    problems: Any  # the task's problems, one row per sequence [B]
    tokens_bl: jax.Array  # int32 [B, P + R]
    mask_bl: jax.Array  # int32 [B, P + R]
    sample_logp_br: jax.Array  # float32 [B, R] the sampler's log-probs
    rewards_b: jax.Array  # float32 [B] task rewards
    # Dataset tasks with SDPO / VPD: host-built teacher prompts (tokens [B, Q], mask [B, Q],
    # has_context [B]); the built-in task's are built in the jitted learn step instead.
    teacher_context: Any = None
    # DAPO's dynamic sampling: float32 [] mean sequence reward over every sampled group, kept or
    # filtered out (`pipo.mu_source=raw`); None without dynamic sampling.
    mu_raw: Any = None

    @property
    def size(self) -> int:
        return self.tokens_bl.shape[0]


def response_part(spec: TrainSpec, rollout: Rollout) -> tuple[jax.Array, jax.Array]:
    """(response tokens `[B, R]`, response mask `[B, R]`)."""
    p = spec.prompt_len
    return rollout.tokens_bl[:, p:], rollout.mask_bl[:, p:]


def prompt_table(spec: TrainSpec) -> dataset.PromptTable | None:
    """A dataset task's prompt table on the default device (the `table` argument of the
    rollout programs), or None for the built-in task."""
    return jax.device_put(dataset.prompt_arrays(spec.task)) if spec.is_dataset_task else None


def sample_problems(spec: TrainSpec, rng, n_prompts: int, split: str = "train",
                    table: dataset.PromptTable | None = None):
    """`n_prompts` task problems, each repeated G times (rows of a group are adjacent).

    A dataset task draws from `table` (`prompt_table`), an argument of the caller's program.
    """
    if spec.is_dataset_task:
        if table is None:
            raise ValueError(f"the {spec.task.kind} task samples from its prompt table: pass table=prompt_table(spec)")
        problems = dataset.sample_problems(table, rng, n_prompts, split=split)
    else:
        problems = arithmetic.sample_problems(spec.task, rng, n_prompts, split=split)
    return jax.tree.map(lambda x: jnp.repeat(x, spec.rollout.group_size, axis=0), problems)


def stop_and_pad_ids(spec: TrainSpec) -> tuple[tuple[int, ...], int]:
    """The task's response-ending token ids and its pad id."""
    if spec.is_dataset_task:
        return spec.task.stop_token_ids, spec.task.pad_id
    return (char_vocab.EOS_ID,), char_vocab.PAD_ID


def generation_passes(spec: TrainSpec, rows: int) -> tuple[int, int]:
    """(passes, batch shards) for decoding `rows` rows, `rollout.generate_rows_per_device` per
    device per pass, under the active sharding context (one pass when the key is 0)."""
    shards = parallel.batch_shards()
    per_pass = spec.rollout.generate_rows_per_device * shards
    if not per_pass or per_pass >= rows:
        return 1, shards
    if rows % per_pass:
        raise ConfigError(f"config.rollout.generate_rows_per_device: {rows} rows do not split into passes of "
                          f"{per_pass} ({spec.rollout.generate_rows_per_device} per device x {shards} batch shards)")
    return rows // per_pass, shards


def generate(spec: TrainSpec, params, problems, rng) -> Rollout:
    """Samples one response per row of `problems` with the policy `params` (rewards left 0).

    With `generate_rows_per_device` set the rows are decoded in passes (`lax.map`), each device
    decoding only rows it holds, so the KV cache holds one pass's rows; row b samples with key
    `fold_in(rng, b)` either way, so the passes change no token.
    """
    # "tempered" log-probs: log_softmax(logits / T) over the full vocabulary, what the
    # trainer recomputes as the behaviour policy (top-k / top-p only shape the sampling).
    stop_ids, pad_id = stop_and_pad_ids(spec)

    def one_pass(args):
        tokens_bp, mask_bp, keys = args
        out = sampler.generate(
            spec.model, params, tokens_bp, mask_bp, keys,
            max_new_tokens=spec.rollout.response_len, temperature=spec.rollout.temperature, top_k=spec.rollout.top_k, top_p=spec.rollout.top_p,
            stop_token_ids=stop_ids, pad_id=pad_id, logprobs="tempered")
        return out.tokens_br, out.mask_br, out.logprobs_br

    rows = problems.prompt_tokens_bp.shape[0]
    n_pass, shards = generation_passes(spec, rows)
    if n_pass == 1:
        tokens_br, mask_br, logp_br = one_pass((problems.prompt_tokens_bp, problems.prompt_mask_bp, rng))
    else:
        args = (problems.prompt_tokens_bp, problems.prompt_mask_bp, sampler.row_keys(rng, rows))
        out = jax.lax.map(one_pass, jax.tree.map(lambda x: steps.split_micro(x, n_pass, shards), args))
        tokens_br, mask_br, logp_br = jax.tree.map(lambda y: steps.merge_micro(y, shards), out)
    tokens = jnp.concatenate([problems.prompt_tokens_bp, tokens_br], axis=1).astype(jnp.int32)
    mask = jnp.concatenate([problems.prompt_mask_bp, mask_br], axis=1).astype(jnp.int32)
    return Rollout(problems=problems, tokens_bl=tokens, mask_bl=mask, sample_logp_br=logp_br,
                   rewards_b=jnp.zeros((tokens.shape[0],), jnp.float32))


def task_rewards(spec: TrainSpec, rollout: Rollout) -> jax.Array:
    """The built-in task's JAX reward `[B]` (dataset tasks are scored on the host: `DatasetScorer`)."""
    if spec.is_dataset_task:
        raise ValueError(f"the {spec.task.kind} task has no JAX reward; it is scored on the host")
    tokens_br, mask_br = response_part(spec, rollout)
    return arithmetic.reward(spec.task, rollout.problems, tokens_br, mask_br)


class DatasetScorer:
    """A dataset task's host scoring for the host loop: `scorer(rollout)` gives the rewards
    `[B]`; `scorer.score_rollout(rollout)` also attaches, for SDPO / VPD, the teacher prompts
    built from those rewards (a successful sibling, else the verifier's feedback)."""

    def __init__(self, spec: TrainSpec, reward: dataset.DatasetReward):
        self.spec, self.reward = spec, reward

    def _scores(self, rollout: Rollout) -> tuple[np.ndarray, list[str], np.ndarray, list[str]]:
        """(row ids, decoded responses, rewards, feedback) of the rollout's responses."""
        tokens_br, mask_br = jax.device_get(response_part(self.spec, rollout))
        index_b = np.asarray(jax.device_get(rollout.problems.index_b))
        texts = self.reward.decode(tokens_br, mask_br)
        return (index_b, texts, *self.reward.score_texts(texts, index_b))

    def __call__(self, rollout: Rollout) -> np.ndarray:
        return self._scores(rollout)[2]

    def score_rollout(self, rollout: Rollout) -> Rollout:
        spec = self.spec
        index_b, texts, rewards_b, feedback = self._scores(rollout)
        out = with_rewards(rollout, rewards_b)
        if spec.uses_teacher:
            context = dataset.teacher_prompts(
                spec.task, index_b, rewards_b, texts, feedback,
                group_size=spec.rollout.group_size, success_threshold=spec.sdpo.success_threshold,
                use_feedback=spec.sdpo.use_feedback, width=spec.teacher_prompt_len)
            out = out.replace(teacher_context=tuple(jnp.asarray(x) for x in context))
        return out


def with_rewards(rollout: Rollout, rewards_b) -> Rollout:
    return rollout.replace(rewards_b=jnp.asarray(rewards_b, jnp.float32))


# ----------------------------------------------------------------------------- DAPO


def sequence_reward_sum(spec: TrainSpec, rollout: Rollout) -> jax.Array:
    """Sum over the rows of the sequence reward `learn.prepare` takes mu_t from (the task reward
    plus DAPO's overlong shaping), before any filtering. float32 []."""
    rewards_b = rollout.rewards_b
    if spec.dapo.overlong_buffer:
        lengths_b = jnp.sum(response_part(spec, rollout)[1].astype(jnp.float32), axis=1)
        rewards_b = rewards_b + advantages.overlong_penalty(lengths_b, max_len=spec.rollout.response_len,
                                                            buffer=spec.dapo.overlong_buffer, factor=spec.dapo.overlong_factor)
    return jnp.sum(rewards_b)


def merge_kept_groups(spec: TrainSpec, buffer: Rollout, filled, new: Rollout, keep_p) -> tuple[Rollout, jax.Array]:
    """Appends the kept groups of `new` after the `filled` groups of `buffer` (extra ones drop).

    `buffer` holds `spec.rollout.prompts_per_batch` groups; returns (buffer, new filled count, capped at P).
    """
    g = spec.rollout.group_size
    dest_p = filled + jnp.cumsum(keep_p.astype(jnp.int32)) - 1
    dest_p = jnp.where(keep_p, dest_p, spec.rollout.prompts_per_batch)  # out of range: dropped by mode="drop"

    def put(buf, x):
        buf_g = buf.reshape((spec.rollout.prompts_per_batch, g) + buf.shape[1:])
        x_g = x.reshape((-1, g) + x.shape[1:])
        return buf_g.at[dest_p].set(x_g, mode="drop").reshape(buf.shape)

    merged = jax.tree.map(put, buffer, new)
    return merged, jnp.minimum(filled + jnp.sum(keep_p.astype(jnp.int32)), spec.rollout.prompts_per_batch)


def collect(spec: TrainSpec, params, rng, reward_fn: Callable[[Rollout], jax.Array]) -> tuple[Rollout, dict]:
    """One training batch of `P x G` scored sequences, in one jit-able function.

    Without dynamic sampling: P prompts, G samples each. With DAPO's dynamic sampling:
    generation batches of `gen_prompts` prompts, keeping groups whose rewards differ,
    until P groups are kept or `max_num_gen_batches` batches ran (then `dapo_exhausted`
    is set and the host raises a clear error).
    """
    if not spec.dapo.dynamic_sampling:
        k_prob, k_gen = jax.random.split(rng)
        rollout = generate(spec, params, sample_problems(spec, k_prob, spec.rollout.prompts_per_batch), k_gen)
        rollout = with_rewards(rollout, reward_fn(rollout))
        return rollout, {}

    def gen_batch(i):
        k_prob, k_gen = jax.random.split(jax.random.fold_in(rng, i))
        r = generate(spec, params, sample_problems(spec, k_prob, spec.dapo.gen_prompts_per_batch), k_gen)
        return with_rewards(r, reward_fn(r))

    template = jax.eval_shape(lambda: gen_batch(0))
    buffer = jax.tree.map(lambda x: jnp.zeros((spec.batch,) + x.shape[1:], x.dtype), template)

    def cond(carry):
        _, filled, n, _, _ = carry
        return (filled < spec.rollout.prompts_per_batch) & (n < spec.dapo.max_num_gen_batches)

    def body(carry):
        buf, filled, n, dropped, raw_sum = carry
        new = gen_batch(n)
        keep_p, _, counts = advantages.dapo_group_filter(new.rewards_b, spec.rollout.group_size)
        buf, filled = merge_kept_groups(spec, buf, filled, new, keep_p)
        return buf, filled, n + 1, dropped + counts["num_dropped"], raw_sum + sequence_reward_sum(spec, new)

    zero = jnp.zeros((), jnp.int32)
    buffer, filled, n, dropped, raw_sum = jax.lax.while_loop(cond, body, (buffer, zero, zero, zero,
                                                                           jnp.zeros((), jnp.float32)))
    buffer = buffer.replace(mu_raw=raw_sum / (n * spec.dapo.gen_prompts_per_batch * spec.rollout.group_size).astype(jnp.float32))
    stats = {"dapo_gen_batches": n, "dapo_groups_dropped": dropped, "dapo_groups_kept": filled,
             "dapo_exhausted": filled < spec.rollout.prompts_per_batch}
    return buffer, stats
