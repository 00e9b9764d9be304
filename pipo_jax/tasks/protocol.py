"""The Task protocol: everything the trainer asks of a task, and nothing else.

Implemented by the built-in arithmetic task (`tasks/arithmetic.py`: JAX reward, so a whole
iteration can be one jit) and the dataset tasks (`tasks/dataset.py`: math answers or code
tests, scored on the host). The learner (`pipo_jax.rl`) reaches a task only through these
members and never asks which task it has.

Problems are a pytree with at least `prompt_tokens_bp` / `prompt_mask_bp` (left-padded,
int32 `[b, P]`); their other fields are the task's own. Responses are right-padded
`tokens_br` / `mask_br` int32 `[b, R]`.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import numpy as np

class TeacherSettings(NamedTuple):
    """How SDPO / VPD build the teacher's prompt of a response (config `sdpo.*`).

    A row's context is the first other response of its group (rows of a group adjacent,
    `group_size` of them) with reward >= `success_threshold`, shown as a solution; else,
    with `use_feedback`, the task's feedback on the row's own response; else none (the
    row's `has_context` is 0). `width`: the teacher prompt's width Q (host-built prompts).
    """

    group_size: int
    success_threshold: float
    use_feedback: bool
    width: int = 0


class Scored(NamedTuple):
    """What a host scorer returns for a batch of responses."""

    rewards_b: np.ndarray  # float32 [b]
    # SDPO / VPD (asked with a TeacherSettings): host-built teacher prompts
    # (tokens [b, Q], mask [b, Q], has_context [b]), else None.
    teacher_prompts: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


@runtime_checkable
class HostScorer(Protocol):
    """A task's reward on the host (numpy in, numpy out); `close()` stops its workers. It may also
    have `take_counts() -> {metric: int}` (counts since the last call, e.g. the math scorer's
    `reward/unscored`), which the host loop adds to each iteration's metrics."""

    def score(self, problems: Any, tokens_br: np.ndarray, mask_br: np.ndarray,
              teacher: TeacherSettings | None = None) -> Scored: ...

    def close(self) -> None: ...


@runtime_checkable
class Task(Protocol):
    """What a task gives the trainer (hashable: it is part of the jit-static `TrainSpec`).

    name: "arithmetic", "math", "code", ... (config `task.name`).
    prompt_len: P, the prompt width; answer_len: the task's natural response width (0: none,
      `rollout.max_new_tokens` must be set).
    stop_token_ids / pad_id: the ids that end a response and pad it.
    token_id_bound: one past the largest token id the task produces (<= the model's vocab).
    train_size: rows of a finite training split (0: problems are generated, no epochs).
    device_reward: `reward` / `teacher_prompts` are JAX functions, so an iteration can be one
      jit (the scan loop; the function may call the host, as reasoning-gym's verifier through
      `jax.pure_callback`); False: the reward runs on the host (`scorer`, the host loop).
    exact_answers: each problem has one correct response (`reference_responses`), so greedy
      accuracy is one teacher-forced forward (`rl/teacher_forcing.py`); False: the trainer
      decodes greedily and scores (in one program with a JAX reward).
    tokenizer: the Hugging Face tokenizer of a text task (exported with the policy), or None.
    """

    name: str

    @property
    def prompt_len(self) -> int: ...

    @property
    def answer_len(self) -> int: ...

    @property
    def stop_token_ids(self) -> tuple[int, ...]: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def token_id_bound(self) -> int: ...

    @property
    def train_size(self) -> int: ...

    @property
    def device_reward(self) -> bool: ...

    @property
    def exact_answers(self) -> bool: ...

    @property
    def tokenizer(self) -> Any: ...

    def prompt_table(self) -> Any:
        """Host arrays the problem samplers read (a program argument, placed once), or None."""

    def sample_problems(self, table: Any, rng: jax.Array, n: int, split: str = "train") -> Any:
        """`n` problems of `split` (pure, jit-able; `table` = `prompt_table()` placed on device)."""

    def heldout_problems(self, table: Any, n: int, rng: jax.Array) -> Any:
        """The `n` problems the trainer evaluates on (the same ones for the same `rng`)."""

    def reference_responses(self, problems: Any) -> tuple[jax.Array, jax.Array] | None:
        """A correct response `(tokens_ba, mask_ba)` (stop token included) of each problem:
        the only one for `exact_answers` tasks (greedy accuracy by teacher forcing), else a
        demonstration (the supervised warm-up's target, e.g. reasoning-gym's answer); None
        when the task has none."""

    def reward(self, problems: Any, tokens_br: jax.Array, mask_br: jax.Array) -> jax.Array:
        """float32 `[b]` reward in JAX (`device_reward` tasks)."""

    def teacher_prompts(self, problems: Any, tokens_br: jax.Array, mask_br: jax.Array, rewards_b: jax.Array,
                        teacher: TeacherSettings) -> tuple[jax.Array, jax.Array, jax.Array]:
        """SDPO / VPD teacher prompts in JAX (`device_reward` tasks): left-padded tokens and
        mask `[b, Q]` and has_context float32 `[b]` (see `TeacherSettings`)."""

    def teacher_eval_problems(self, table: Any, n: int, rng: jax.Array) -> dict[str, Any]:
        """`heldout_problems(table, n, rng)` shown with each kind of teacher context
        ({"solution": ..., "feedback": ...}; {} when the task has none): the trainer logs
        the policy's greedy accuracy on them as `teacher_accuracy_<kind>`."""

    def scorer(self) -> HostScorer:
        """The task's host reward (worker processes, sandboxes: `close()` it)."""

