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
from pipo_jax.losses import advantages
from pipo_jax.models import qwen3
from pipo_jax.rl import steps
from pipo_jax.rl.experience import (Rollout, choose_contexts, response_part, shaped_rewards, teacher_settings,
                                    with_rewards)
from pipo_jax.rl.spec import ConfigError, GenerationSpec, TrainSpec
from pipo_jax.sampling import decode, sampler
from pipo_jax.tasks.protocol import HostScorer


def prompt_table(spec: TrainSpec) -> Any:
    """The task's prompt table on the default device (the `table` argument of the rollout
    programs), or None when the task has none (the built-in task generates its problems)."""
    table = spec.task.prompt_table()
    return None if table is None else jax.device_put(table)


def sample_problems(spec: GenerationSpec, rng, n_prompts: int, split: str = "train", table: Any = None):
    """`n_prompts` task problems, each repeated G times (rows of a group are adjacent).

    A task with a prompt table draws from `table` (`prompt_table`), an argument of the caller's program.
    """
    problems = spec.task.sample_problems(table, rng, n_prompts, split)
    return jax.tree.map(lambda x: jnp.repeat(x, spec.rollout.group_size, axis=0), problems)


def generation_passes(spec: GenerationSpec, rows: int) -> tuple[int, int]:
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


# `rollout.decode_weights=auto` per target platform: gathered on TPU (v5p-16, 8B: generate 39.6 GB a chip
# with the training state beside it, and no 15 GB of weight all-gathers per decode step); sharded elsewhere
# (the GPU target, 8B at fsdp=8: gathered needs 63.4 GB a device with the state, over the 48 GB budget).
# The measured costs of each: docs/scaling.md.
DECODE_WEIGHTS_BY_PLATFORM = {"tpu": "gathered", "cuda": "sharded", "cpu": "sharded"}


def decode_weights_layout(spec: GenerationSpec) -> str:
    """"sharded" or "gathered": `rollout.decode_weights`, "auto" resolved by the target platform."""
    choice = spec.rollout.decode_weights
    return DECODE_WEIGHTS_BY_PLATFORM[spec.model.platform] if choice == "auto" else choice


def decode_weights(spec: GenerationSpec, params):
    """The policy's weights as a generate call decodes with them (`decode_weights_layout`): as given
    ("sharded": on a mesh the decode loop gathers each layer's fsdp shards at every step), or
    ("gathered", under a sharding context) in the compute dtype, gathered over `fsdp` once per call."""
    if decode_weights_layout(spec) == "sharded" or parallel.active_context() is None:
        return params
    params = decode.in_compute_dtype(spec.model, params)
    return parallel.gathered_over(params, qwen3.param_axes(spec.model), "fsdp")


def generate(spec: GenerationSpec, params, problems, rng) -> Rollout:
    """Samples one response per row of `problems` with the policy `params` (rewards left 0),
    inside the caller's program (`spec.generator`, an `in_program` one).

    With `generate_rows_per_device` set the rows are decoded in passes (`lax.map`), each device
    decoding only rows it holds, so the KV cache holds one pass's rows; row b samples with key
    `fold_in(rng, b)` either way, so the passes change no token.
    """
    generator = spec.generator
    if not generator.in_program:
        raise ValueError(f"rollout.engine={spec.rollout.engine!r} is driven from the host: "
                         "use the host loop (log.jit_loop=false)")

    def one_pass(args):
        out = generator(params, *args)
        return out.tokens_br, out.mask_br, out.logprobs_br

    params = decode_weights(spec, params)
    rows = problems.prompt_tokens_bp.shape[0]
    n_pass, shards = generation_passes(spec, rows)
    if n_pass == 1:
        tokens_br, mask_br, logp_br = one_pass((problems.prompt_tokens_bp, problems.prompt_mask_bp, rng))
    else:
        args = (problems.prompt_tokens_bp, problems.prompt_mask_bp, sampler.row_keys(rng, rows))
        out = jax.lax.map(one_pass, jax.tree.map(lambda x: steps.split_micro(x, n_pass, shards), args))
        tokens_br, mask_br, logp_br = jax.tree.map(lambda y: steps.merge_micro(y, shards), out)
    return from_generation(problems, tokens_br, mask_br, logp_br)


def from_generation(problems, tokens_br, mask_br, logp_br) -> Rollout:
    """The `Rollout` of `problems` and their responses `[B, R]` (rewards left 0)."""
    tokens = jnp.concatenate([problems.prompt_tokens_bp, tokens_br], axis=1).astype(jnp.int32)
    mask = jnp.concatenate([problems.prompt_mask_bp, mask_br], axis=1).astype(jnp.int32)
    return Rollout(problems=problems, tokens_bl=tokens, mask_bl=mask, sample_logp_br=jnp.asarray(logp_br, jnp.float32),
                   rewards_b=jnp.zeros((tokens.shape[0],), jnp.float32))


def generate_on_host(generator, params, problems, rng) -> Rollout:
    """`generate` with a host-driven `generator` (the caller's instance of `spec.generator`, the
    slots engine, which keeps its compiled engines): the same keys, so the same tokens as the
    one-jit sampler. Problems and params are device arrays."""
    out = generator(params, problems.prompt_tokens_bp, problems.prompt_mask_bp, rng)
    return from_generation(problems, *(jnp.asarray(x) for x in (out.tokens_br, out.mask_br, out.logprobs_br)))


def task_rewards(spec: TrainSpec, rollout: Rollout) -> jax.Array:
    """The task's JAX reward `[B]` (`device_reward` tasks; the others are scored on the host: `TaskReward`)."""
    return spec.task.reward(rollout.problems, *response_part(spec, rollout))


class TaskReward:
    """The task's host scorer (`Task.scorer()`) as the host loop's reward (`loop.HostReward`):
    `reward(rollout)` gives the rewards `[B]` (what each process computes for its rows on a mesh);
    `reward.score_rollout(rollout)` returns the rollout with its rewards and, for SDPO / VPD
    on a task that builds them on the host, the teacher prompts."""

    def __init__(self, spec: TrainSpec, scorer: HostScorer):
        self.spec, self.scorer = spec, scorer

    def __call__(self, rollout: Rollout) -> np.ndarray:
        problems, tokens_br, mask_br = jax.device_get((rollout.problems, *response_part(self.spec, rollout)))
        return self.scorer.score(problems, tokens_br, mask_br).rewards_b

    def score_rollout(self, rollout: Rollout) -> Rollout:
        """The rollout with its rewards and, for SDPO / VPD on a host-reward task, the teacher
        prompts the scorer renders for the learner's `choose_contexts`."""
        problems, tokens_br, mask_br = jax.device_get((rollout.problems, *response_part(self.spec, rollout)))
        scored = self.scorer.score(problems, tokens_br, mask_br)
        out = with_rewards(rollout, scored.rewards_b)
        if self.spec.uses_teacher and not self.spec.task.capabilities.device_reward:
            settings = teacher_settings(self.spec)
            choice = jax.device_get(choose_contexts(scored.rewards_b, settings))
            prompts = self.scorer.teacher_prompts(problems, tokens_br, mask_br, scored, choice, settings.width)
            out = out.replace(teacher_context=tuple(jnp.asarray(x) for x in prompts))
        return out

    def take_counts(self) -> dict[str, int]:
        """The scorer's counts since the last call (e.g. `reward/unscored_count`; on several processes,
        this process's rows); {} for a scorer that counts nothing."""
        return self.scorer.take_counts()

    def close(self) -> None:
        self.scorer.close()


# ----------------------------------------------------------------------------- DAPO


def sequence_reward_sum(spec: TrainSpec, rollout: Rollout) -> jax.Array:
    """Sum over the rows of the sequence reward `learn.prepare` takes mu_t from (`shaped_rewards`),
    before any filtering. float32 []."""
    lengths_b = jnp.sum(response_part(spec, rollout)[1].astype(jnp.float32), axis=1)
    return jnp.sum(shaped_rewards(spec, rollout.rewards_b, lengths_b))


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


@struct.dataclass
class DynamicSampling:
    """DAPO's dynamic sampling in progress: the batch being filled and its counts (int32 / float32 [])."""

    buffer: Rollout  # P x G rows; the first `filled` groups are kept ones
    filled: jax.Array  # groups kept so far (<= P)
    batches: jax.Array  # generation batches run
    dropped: jax.Array  # groups dropped (all rewards equal)
    raw_sum: jax.Array  # sum of `sequence_reward_sum` over every generated row


def dynamic_sampling_start(spec: TrainSpec, like: Rollout) -> DynamicSampling:
    """An empty batch with the leaves of a generation batch `like` (arrays or shape structs)."""
    zero = jnp.zeros((), jnp.int32)
    buffer = jax.tree.map(lambda x: jnp.zeros((spec.batch,) + x.shape[1:], x.dtype), like)
    return DynamicSampling(buffer, zero, zero, zero, jnp.zeros((), jnp.float32))


def dynamic_sampling_more(spec: TrainSpec, ds: DynamicSampling) -> jax.Array:
    """bool []: fewer than P groups kept and generation batches left (`dapo.max_num_gen_batches`)."""
    return (ds.filled < spec.rollout.prompts_per_batch) & (ds.batches < spec.dapo.max_num_gen_batches)


def dynamic_sampling_add(spec: TrainSpec, ds: DynamicSampling, new: Rollout) -> DynamicSampling:
    """Keeps the groups of the scored generation batch `new` whose rewards differ (`dapo_group_filter`)."""
    keep_p, _, counts = advantages.dapo_group_filter(new.rewards_b, spec.rollout.group_size)
    buffer, filled = merge_kept_groups(spec, ds.buffer, ds.filled, new, keep_p)
    return DynamicSampling(buffer, filled, ds.batches + 1, ds.dropped + counts["num_dropped"],
                           ds.raw_sum + sequence_reward_sum(spec, new))


def dynamic_sampling_result(spec: TrainSpec, ds: DynamicSampling) -> tuple[Rollout, dict]:
    """(the batch with `mu_raw` = the mean shaped reward over every generated row, stats)."""
    rows = ds.batches * spec.dapo.gen_prompts_per_batch * spec.rollout.group_size
    batch = ds.buffer.replace(mu_raw=ds.raw_sum / rows.astype(jnp.float32))
    stats = {"dapo_gen_batches": ds.batches, "dapo_groups_dropped": ds.dropped, "dapo_groups_kept": ds.filled,
             "dapo_exhausted": ds.filled < spec.rollout.prompts_per_batch}
    return batch, stats


def collect(spec: TrainSpec, params, rng, reward_fn: Callable[[Rollout], jax.Array]) -> tuple[Rollout, dict]:
    """One training batch of `P x G` scored sequences, in one jit-able function.

    Without dynamic sampling: P prompts, G samples each. With DAPO's dynamic sampling:
    generation batches of `gen_prompts` prompts (batch n with key `fold_in(rng, n)`), keeping
    groups whose rewards differ, until P groups are kept or `max_num_gen_batches` batches ran
    (then `dapo_exhausted` is set and the host raises a clear error). The host loop
    (`loop.host_collect`) runs the same `dynamic_sampling_*` steps with a host reward.
    """
    gen = spec.generation
    if not spec.dapo.dynamic_sampling:
        k_prob, k_gen = jax.random.split(rng)
        rollout = generate(gen, params, sample_problems(gen, k_prob, spec.rollout.prompts_per_batch), k_gen)
        rollout = with_rewards(rollout, reward_fn(rollout))
        return rollout, {}

    def gen_batch(i):
        k_prob, k_gen = jax.random.split(jax.random.fold_in(rng, i))
        r = generate(gen, params, sample_problems(gen, k_prob, spec.dapo.gen_prompts_per_batch), k_gen)
        return with_rewards(r, reward_fn(r))

    ds = dynamic_sampling_start(spec, jax.eval_shape(lambda: gen_batch(0)))
    ds = jax.lax.while_loop(lambda d: dynamic_sampling_more(spec, d),
                            lambda d: dynamic_sampling_add(spec, d, gen_batch(d.batches)), ds)
    return dynamic_sampling_result(spec, ds)
