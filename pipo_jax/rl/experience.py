"""What a rollout hands the learner: the `Rollout` record and the learner's reads of it (the
response part, the shaped sequence rewards, SDPO / VPD's choice of teacher contexts).

Both sides import this module and nothing of each other: `rollout.py` makes Rollouts, `learn.py`
consumes them, so a rollout's path from sampling to the update only goes down.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from pipo_jax.losses import advantages
from pipo_jax.losses.distill import select_demonstrations
from pipo_jax.rl.spec import TrainSpec
from pipo_jax.tasks.protocol import ContextChoice, TeacherSettings


@struct.dataclass
class Rollout:
    problems: Any  # the task's problems, one row per sequence [B]
    tokens_bl: jax.Array  # int32 [B, P + R]
    mask_bl: jax.Array  # int32 [B, P + R]
    sample_logp_br: jax.Array  # float32 [B, R] the sampler's log-probs
    rewards_b: jax.Array  # float32 [B] task rewards
    # SDPO / VPD on a host-reward task: host-built teacher prompts (tokens [B, Q], mask [B, Q],
    # has_context [B]); a `device_reward` task's are built in the jitted learn step instead.
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


def teacher_settings(spec: TrainSpec) -> TeacherSettings:
    """How the task builds SDPO / VPD teacher prompts (`sdpo.*`; host-built prompts `teacher_prompt_len` wide)."""
    return TeacherSettings(group_size=spec.rollout.group_size, success_threshold=spec.sdpo.success_threshold,
                           use_feedback=spec.sdpo.use_feedback, width=spec.teacher_prompt_len)


def choose_contexts(rewards_b, teacher: TeacherSettings) -> ContextChoice:
    """SDPO / VPD's choice of each row's teacher context, made by the learner for every task:
    the first *other* response of the row's group with reward >= `success_threshold`
    (`losses/distill.select_demonstrations`; `demo_row_b` 0 where there is none), else, with
    `use_feedback`, the task's feedback on the row's own response. JAX arrays `[B]`."""
    demo_row_b, has_demo_b = select_demonstrations(jnp.asarray(rewards_b, jnp.float32), teacher.group_size,
                                                   success_threshold=teacher.success_threshold)
    return ContextChoice(jnp.maximum(demo_row_b, 0), has_demo_b, (~has_demo_b) & teacher.use_feedback)


def with_rewards(rollout: Rollout, rewards_b) -> Rollout:
    return rollout.replace(rewards_b=jnp.asarray(rewards_b, jnp.float32))


def shaped_rewards(spec: TrainSpec, rewards_b, lengths_b) -> jax.Array:
    """The sequence rewards the learner uses: the task rewards plus DAPO's overlong shaping
    (`dapo.overlong_buffer` > 0; `lengths_b` the response lengths in tokens). float32 [B]."""
    if not spec.dapo.overlong_buffer:
        return rewards_b
    return rewards_b + advantages.overlong_penalty(lengths_b, max_len=spec.rollout.max_new_tokens,
                                                   buffer=spec.dapo.overlong_buffer, factor=spec.dapo.overlong_factor)
