"""The Task protocol: everything the learner asks of a task, and nothing else.

A task subclasses `Task` (an abstract base class: a subclass that forgets a required member
cannot be instantiated, `TypeError` naming it) and declares what it can do in its
`capabilities` (`TaskCapabilities`); an optional member a task lacks raises naming the
capability, and `TrainSpec` / `train_spec` refuse a config that needs a capability the task
lacks (`ConfigError` naming the key). Implemented by the built-in arithmetic task
(`tasks/arithmetic.py`: JAX reward, so a whole iteration can be one jit), the countdown task
(`tasks/countdown.py`), reasoning-gym's (`tasks/reasoning_gym.py`) and the dataset tasks
(`tasks/dataset.py`: math answers or code tests, scored on the host). The learner
(`pipo_jax.rl`) reaches a task only through these members and never asks which task it has.

Problems are a pytree with at least `prompt_tokens_bp` / `prompt_mask_bp` (left-padded,
int32 `[b, P]`); their other fields are the task's own. Responses are right-padded
`tokens_br` / `mask_br` int32 `[b, R]`.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import numpy as np


class TaskConfigError(ValueError):
    """A task constructor's error about `config.task` (or another key); the message starts
    with `config.<key>:` (`run/task_config.py:make_task` raises it as a `ConfigError`)."""


@dataclasses.dataclass(frozen=True)
class TaskCapabilities:
    """What a task can do beyond the required members (each False by default).

    device_reward: `reward` is a JAX function, so an iteration can be one jit (the scan loop; it
      may call the host, as reasoning-gym's verifier through `jax.pure_callback`); False: the
      reward runs on the host only (`scorer`, the host loop, `log.jit_loop=false`).
    exact_answers: each problem has one correct response (`reference_responses`), so greedy
      accuracy is one teacher-forced forward (`run/teacher_forcing.py`); False: the trainer
      decodes greedily and scores.
    teacher_contexts: SDPO / VPD teacher prompts (`algorithm=sdpo|vpd`): `teacher_prompts` in JAX
      (with `device_reward`), else the host scorer's `teacher_prompts`.
    warmup: the supervised warm-up (`warmup.enabled`) learns `reference_responses` of train problems
      (`warmup_problems`; a task may shape them by its own settings, as the built-in task's flawed and
      context-shown demonstrations).
    answer_benchmarks: `eval.benchmarks` (math files: the scorer's `benchmark_inputs`).
    reward_components: the reward is a weighted sum of named components (`reward_weights`), each computed in
      JAX (`reward_components`, as `reward` with `device_reward`): what GDPO normalises one by one
      (`advantage.estimator=gdpo`).
    """

    device_reward: bool = False
    exact_answers: bool = False
    teacher_contexts: bool = False
    warmup: bool = False
    answer_benchmarks: bool = False
    reward_components: bool = False


class RewardComponent(NamedTuple):
    """One named part of a task's reward (`Task.reward_weights`): reward = sum_k weight_k x component_k."""

    name: str  # e.g. "answer", "format", "length"
    weight: float


class TeacherSettings(NamedTuple):
    """How SDPO / VPD choose the teacher's context of a response (config `sdpo.*`).

    A row's context is the first other response of its group (rows of a group adjacent,
    `group_size` of them) with reward >= `success_threshold`, shown as a solution; else,
    with `use_feedback`, the task's feedback on the row's own response; else none (the
    row's `has_context` is 0). `width`: the teacher prompt's width Q (host-built prompts).
    The learner makes the choice (`rl/rollout.py:choose_contexts`); the task renders it.
    """

    group_size: int
    success_threshold: float
    use_feedback: bool
    width: int = 0


class ContextChoice(NamedTuple):
    """The teacher context the learner chose for each row (`rl/rollout.py:choose_contexts`).

    demo_row_b: int32 `[b]`, the row whose response is shown as a solution (0 where none: the
      row is valid but unused); has_demo_b: bool `[b]`; feedback_b: bool `[b]`, show the task's
      feedback on the row's own response (no demonstration and `sdpo.use_feedback`).
    """

    demo_row_b: Any
    has_demo_b: Any
    feedback_b: Any


class Scored(NamedTuple):
    """What a host scorer returns for a batch of responses."""

    rewards_b: np.ndarray  # float32 [b]
    # What the scorer's `teacher_prompts` reads besides the responses (e.g. decoded texts and the
    # verifier's feedback); opaque to the learner, None when there is nothing.
    context: Any = None


@runtime_checkable
class HostScorer(Protocol):
    """A task's reward on the host (numpy in, numpy out); `take_counts() -> {metric: int}`: counts since
    the last call (e.g. the math scorer's `reward/unscored_count`; {} for a scorer that counts nothing),
    which the host loop adds to each iteration's metrics; `close()` stops its workers. A host-reward task
    with `teacher_contexts` gives `teacher_prompts(problems, tokens_br, mask_br, scored, choice,
    width) -> (tokens [b, width], mask [b, width], has_context float32 [b])` (left-padded); one with
    `answer_benchmarks` gives `benchmark_inputs() -> (tokenizer, PromptConfig, verifier)`."""

    def score(self, problems: Any, tokens_br: np.ndarray, mask_br: np.ndarray) -> Scored: ...

    def take_counts(self) -> dict[str, int]: ...

    def close(self) -> None: ...


class Task(abc.ABC):
    """What a task gives the learner (hashable: it is part of the jit-static `TrainSpec`).

    Required: name ("arithmetic", "math", ... = config `task.name`), `capabilities`, prompt_len
    (P, the prompt width), answer_len (the natural response width; 0: none, `rollout.max_new_tokens`
    must be set), stop_token_ids / pad_id (the ids that end a response and pad it), token_id_bound
    (one past the largest token id the task produces, <= the model's vocab), train_size (rows of
    a finite training split; 0: problems are generated, no epochs), `prompt_table`,
    `sample_problems`, `heldout_problems`, `scorer`. Optional, behind a capability: `reward`,
    `reference_responses`, `teacher_prompts`, `teacher_eval_problems`, `warmup_problems`, `reward_weights`,
    `reward_components`.
    tokenizer: the Hugging Face tokenizer of a text task (exported with the policy), or None.
    """

    tokenizer: Any = None

    @property
    @abc.abstractmethod
    def name(self) -> str: ...

    @property
    @abc.abstractmethod
    def capabilities(self) -> TaskCapabilities: ...

    @property
    @abc.abstractmethod
    def prompt_len(self) -> int: ...

    @property
    @abc.abstractmethod
    def answer_len(self) -> int: ...

    # Required too, as plain attributes (a dataclass field without a default is no class
    # attribute, so these are checked on the built task: `missing_attributes`).
    stop_token_ids: tuple[int, ...]
    pad_id: int

    @property
    @abc.abstractmethod
    def token_id_bound(self) -> int: ...

    @property
    @abc.abstractmethod
    def train_size(self) -> int: ...

    @abc.abstractmethod
    def prompt_table(self) -> Any:
        """Host arrays the problem samplers read (a program argument, placed once), or None."""

    @abc.abstractmethod
    def sample_problems(self, table: Any, rng: jax.Array, n: int, split: str = "train") -> Any:
        """`n` problems of `split` (pure, jit-able; `table` = `prompt_table()` placed on device)."""

    @abc.abstractmethod
    def heldout_problems(self, table: Any, n: int, rng: jax.Array) -> Any:
        """The `n` problems the trainer evaluates on (the same ones for the same `rng`)."""

    @abc.abstractmethod
    def scorer(self) -> HostScorer:
        """The task's host reward (worker processes, sandboxes: `close()` it)."""

    def _lacks(self, capability: str, member: str):
        return ValueError(f"the {self.name} task has no {member} (capabilities.{capability} is False)")

    def reward(self, problems: Any, tokens_br: jax.Array, mask_br: jax.Array) -> jax.Array:
        """float32 `[b]` reward in JAX (`device_reward`)."""
        raise self._lacks("device_reward", "JAX reward; it is scored on the host (task.scorer())")

    def reward_weights(self) -> tuple[RewardComponent, ...]:
        """The reward's components, in the column order of `reward_components`, with their weights
        (`reward_components`)."""
        raise self._lacks("reward_components", "reward components")

    def reward_components(self, problems: Any, tokens_br: jax.Array, mask_br: jax.Array) -> jax.Array:
        """float32 `[b, C]` in JAX (`reward_components`): column k is component k of `reward_weights`;
        sum_k weight_k x column k is `reward` (up to float rounding)."""
        raise self._lacks("reward_components", "reward components")

    def reference_responses(self, problems: Any) -> tuple[jax.Array, jax.Array]:
        """A correct response `(tokens_ba, mask_ba)` (stop token included) of each problem: the
        only one with `exact_answers` (greedy accuracy by teacher forcing), else a demonstration
        (`warmup`: the supervised warm-up's target, e.g. reasoning-gym's answer)."""
        raise self._lacks("exact_answers", "reference responses")

    def teacher_prompts(self, problems: Any, tokens_br: jax.Array, mask_br: jax.Array,
                        choice: ContextChoice) -> tuple[jax.Array, jax.Array, jax.Array]:
        """SDPO / VPD teacher prompts in JAX (`teacher_contexts` with `device_reward`): the chosen
        demonstration (`tokens_br[choice.demo_row_b]`) or the task's feedback on the row's own
        response, rendered with the problem: left-padded tokens and mask `[b, Q]` and has_context
        float32 `[b]`."""
        raise self._lacks("teacher_contexts", "SDPO / VPD teacher contexts in JAX")

    def prompt_note(self) -> str:
        """How a prompt of this task is written and its answer read, for a model card and a chat
        (e.g. the built-in task's `<bos>12+34=`); "" for a task whose prompts are its tokenizer's
        chat template."""
        return ""

    def teacher_eval_problems(self, table: Any, n: int, rng: jax.Array) -> dict[str, Any]:
        """`heldout_problems(table, n, rng)` shown with each kind of teacher context
        ({"solution": ..., "feedback": ...}; {} when the task has none): the trainer logs
        the policy's greedy accuracy on them as `teacher_accuracy_<kind>`."""
        return {}

    def warmup_problems(self, rng: jax.Array, n: int) -> Any:
        """A supervised warm-up batch: `n` train problems whose `reference_responses` are the
        targets (a task may shape them by its own settings)."""
        return self.sample_problems(self.prompt_table(), rng, n, "train")


REQUIRED_ATTRIBUTES = ("stop_token_ids", "pad_id")


def missing_members(cls: type) -> tuple[str, ...]:
    """The abstract members a `Task` subclass leaves unimplemented (empty: it can be built)."""
    return tuple(sorted(getattr(cls, "__abstractmethods__", ())))


# The optional members each capability promises (a device-reward task's teacher prompts are its own;
# a host-reward task's are its scorer's, checked when used).
PROMISED_MEMBERS = {"device_reward": ("reward",), "exact_answers": ("reference_responses",),
                    "warmup": ("reference_responses",), "reward_components": ("reward_weights", "reward_components")}


def missing_attributes(task: Task) -> tuple[str, ...]:
    """The required plain attributes (`REQUIRED_ATTRIBUTES`) a built task lacks, and the optional
    members its capabilities promise but it leaves to the base class (`capability -> member`)."""
    out = [a for a in REQUIRED_ATTRIBUTES if not hasattr(task, a)]
    caps = task.capabilities
    promised = dict(PROMISED_MEMBERS)
    if caps.teacher_contexts and caps.device_reward:
        promised["teacher_contexts"] = ("teacher_prompts",)
    for capability, members in promised.items():
        out += [f"{capability} -> {m}" for m in members
                if getattr(caps, capability) and getattr(type(task), m) is getattr(Task, m)]
    return tuple(out)
