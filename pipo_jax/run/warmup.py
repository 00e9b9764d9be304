"""Supervised warm-up: turns a randomly initialised tiny Qwen3 into a *partial* solver of
the arithmetic task, or of any task with the `warmup` capability (`Task.reference_responses`,
e.g. a reasoning-gym dataset in the character vocabulary: the library's own answers), the RL
base model, so reinforcement learning has room to improve.

Cross-entropy on the target tokens only (answer and EOS; prompt tokens carry no loss),
AdamW through optax, `eval_every` steps per jitted `lax.scan` chunk, and a check between chunks
(the settings are one `WarmupSettings`, `WarmupSettings.from_config` a run config's):
greedy held-out accuracy (`teacher_forcing.heldout_accuracy`, on a fixed held-out set of `eval_n`
problems drawn with the seed's eval key: the warm-up's own set, not the trainer's `EVAL_SEED` one)
and, with `check_prompts > 0` on a `device_reward` task, the sampled check: `group_size` responses
to each of `check_prompts` other held-out problems, drawn as the rollout will draw them
(`sampling`: the rollout's temperature, top_k, top_p, max_new_tokens), giving pass@1 and the share
of mixed groups (`teacher_forcing.pass_and_mixed`), which is what RL starts from (a base solving
40% greedily can score 3% when sampled). The warm-up stops at the first check where every target
set holds (`target_accuracy` greedy, `target_pass_rate`, `target_mixed_groups` sampled). One INFO
line per check (`log`). Deterministic given the seed: the same seed gives bit-identical params on
one machine; the checks use keys of their own, so they never change the training batches.

The demonstrations are the task's (`Task.warmup_problems`). The built-in task shapes them by its
own settings (`config.task.arithmetic.warmup_*`). With `warmup_mistake_rate > 0` they are flawed:
on a plain row whose column sum carries (or difference borrows) the target is, with that probability, the answer with
the classic column mistake (`arithmetic.carryless_answer`). Trained to convergence on
such data, the model knows both ways; with a rate above 1/2 greedy decoding prefers the
mistake, so the base model solves about the carry-free share of problems, and sampling
solves the others at about 1 - rate: a partial solver whose gap RL can close (the
reward verifies the true answer).

With `warmup_context_fraction > 0` a share of each batch is shown in the form SDPO / VPD give
their teacher (`ArithmeticTask.teacher_prompts`, `arithmetic.context_prompts`): `<solution>` + a correct response, or
`<feedback>` + the environment's feedback on a response, then `<solve>` and the prompt.
The model thus learns to read a context (with `feedback_style='reveal'` the feedback
holds the answer; with 'position' only the solution context carries it), and the
teacher's greedy accuracy with each context is measured beside the student's.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pipo_jax.data import char_vocab
from pipo_jax.models import qwen3
from pipo_jax.parallel import shardings
from pipo_jax.config.sections import RunConfig
from pipo_jax.run import teacher_forcing
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.tasks.protocol import Task

log = logging.getLogger(__name__)


# The task models by `model.preset`: their layers (the other shapes are `task_model_config`'s). `task_micro`,
# one layer, is the `micro` preset's (the tests'): each trainer program compiles in about a quarter less time.
TASK_MODEL_LAYERS = {"task_tiny": 2, "task_micro": 1}


def task_model_config(vocab_ids: int = char_vocab.VOCAB_SIZE, **overrides) -> qwen3.Qwen3Config:
    """The tiny Qwen3 for the built-in task: `vocab_ids` (the char vocabulary; a task's
    `token_id_bound`) rounded up to 32 ids, hidden 128, 2 layers, 4 query / 2 kv heads of 32,
    MLP 256 (~0.3M parameters)."""
    vocab = -(-vocab_ids // 32) * 32
    base = qwen3.Qwen3Config(
        vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_theta=10_000.0,
        max_position_embeddings=128, tie_word_embeddings=True,
    )
    return base.replace(**overrides)


def answer_loss(model_config: qwen3.Qwen3Config, params, problems, targets=None) -> jax.Array:
    """Mean cross-entropy (nats per target token) of the answer tokens and EOS (`targets`:
    (tokens, mask) `[b, a]`, default the problems' own `target_tokens_ba` / `target_mask_ba`)."""
    target_ba, target_mask_ba = targets if targets is not None else (problems.target_tokens_ba,
                                                                    problems.target_mask_ba)
    logits_bav = teacher_forcing.target_logits(model_config, params, problems.prompt_tokens_bp, problems.prompt_mask_bp,
                                               target_ba, target_mask_ba)
    logp = jax.nn.log_softmax(logits_bav, axis=-1)
    nll_ba = -jnp.take_along_axis(logp, target_ba[..., None], axis=-1)[..., 0]
    mask = target_mask_ba.astype(jnp.float32)
    return jnp.sum(nll_ba * mask) / jnp.sum(mask)


def _seed_keys(seed: int):
    """(init, train, eval) keys of a warm-up seed."""
    return jax.random.split(jax.random.PRNGKey(seed), 3)


def check_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """(problems, samples) keys of the warm-up's sampled check for `seed`: derived from its eval
    key, apart from the init and train keys, so the check never changes what is trained. The same
    at every check (the same problems; common random numbers across checks)."""
    k_problems, k_samples = jax.random.split(jax.random.fold_in(_seed_keys(seed)[2], 1))
    return k_problems, k_samples


def initial_params(model_config: qwen3.Qwen3Config, seed: int):
    """The random params `warmup(..., seed=seed)` starts from."""
    return qwen3.init_params(model_config, _seed_keys(seed)[0])


@functools.lru_cache(maxsize=32)
def make_warmup_optimizer(lr: float, weight_decay: float = 0.01, warmup_steps: int = 20, clip_norm: float = 1.0):
    """Global-norm clipping then AdamW with a linear learning-rate warm-up to a constant `lr`.

    Cached, so equal settings give the same (static, hashable) object and `train_chunk`
    compiles once per shape across warm-up runs (e.g. several seeds).
    """
    schedule = optax.linear_schedule(0.0, lr, max(warmup_steps, 1))
    return optax.chain(optax.clip_by_global_norm(clip_norm), optax.adamw(schedule, weight_decay=weight_decay))


def demonstrations(task: Task, rng, batch: int):
    """A warm-up batch: `task.warmup_problems` (train problems whose `reference_responses` are the
    targets, shaped by the task's own settings: e.g. the built-in task's teacher contexts and flawed
    demonstrations)."""
    return task.warmup_problems(rng, batch)


@functools.partial(jax.jit, static_argnames=("model_config", "task", "optimizer", "batch", "num_steps"),
                   donate_argnames=("params", "opt_state"))
def train_chunk(model_config, task, optimizer, params, opt_state, rng, *, batch: int, num_steps: int):
    """`num_steps` AdamW steps on fresh `demonstrations`, one `lax.scan`.

    Returns (params, opt_state, losses `[num_steps]` measured before each update).
    """

    def step(carry, key):
        p, s = carry
        problems = demonstrations(task, key, batch)
        loss, grads = jax.value_and_grad(answer_loss, argnums=1)(model_config, p, problems,
                                                                 task.reference_responses(problems))
        updates, s = optimizer.update(grads, s, p)
        return (optax.apply_updates(p, updates), s), loss

    (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), jax.random.split(rng, num_steps))
    return params, opt_state, losses


class WarmupProgress(NamedTuple):
    """Where a warm-up stands after a chunk, enough to continue it exactly (a checkpointable pytree).

    `done`: steps run; `losses_s` `[steps]` (zeros past `done`); `evals_6e` `[6, E]`, rows
    (`EVAL_ROWS`): eval step, student greedy accuracy, teacher accuracy with a solution / with
    feedback, sampled pass@1, share of mixed groups (NaN: not measured), the first `n_evals` columns
    filled (E = `max_evals(steps, eval_every)`). A checkpoint of the former layout (`evals_4e`,
    no sampled rows) is read by `LegacyWarmupProgress` / `from_legacy`.
    """
    params: Any
    opt_state: Any
    done: Any  # int32 []
    losses_s: Any  # float32 [steps]
    evals_6e: Any  # float32 [6, E]
    n_evals: Any  # int32 []


EVAL_ROWS = ("step", "accuracy", "teacher_solution", "teacher_feedback", "pass@1", "mixed_groups")


class LegacyWarmupProgress(NamedTuple):
    """`WarmupProgress` as saved before the sampled check (`evals_4e` `[4, E]`: its first four rows)."""
    params: Any
    opt_state: Any
    done: Any
    losses_s: Any
    evals_4e: Any
    n_evals: Any


def from_legacy(old: LegacyWarmupProgress) -> WarmupProgress:
    """The former layout in the current one: the sampled rows of its earlier checks NaN (not measured)."""
    evals = np.asarray(old.evals_4e)
    nan = np.full((len(EVAL_ROWS) - evals.shape[0], evals.shape[1]), np.nan, np.float32)
    return WarmupProgress(old.params, old.opt_state, old.done, old.losses_s, np.concatenate([evals, nan]),
                          old.n_evals)


def max_evals(steps: int, eval_every: int) -> int:
    """Evaluations a warm-up of `steps` makes at most: at step 0 and after each chunk."""
    return 1 + -(-steps // eval_every)


@dataclasses.dataclass(frozen=True)
class WarmupSettings:
    """What a warm-up does, apart from the model, the task, the seed and where it starts (`warmup`'s
    `settings`; `from_config` reads them from a run config). Checked on construction (`ValueError`
    naming the field); what needs the task is checked by `warmup`.

    steps: optimizer steps at most; batch: demonstrations per step; lr: AdamW's learning rate after
    `lr_warmup_steps` of linear warm-up, with `weight_decay`; eval_every: steps per chunk (between
    checks); eval_n: held-out problems of the greedy check; target_accuracy / target_pass_rate /
    target_mixed_groups: the stop targets in [0, 1] (None: not set); check_prompts: held-out prompts
    of the sampled check (0: none), each answered `group_size` times, drawn with `sampling` (the
    rollout's temperature / top_k / top_p / max_new_tokens; its stop tokens and pad id are the
    task's; None: temperature 1, no truncation, the task's answer length).
    """

    steps: int
    batch: int
    lr: float
    eval_every: int = 50
    eval_n: int = 512
    target_accuracy: float | None = None
    target_pass_rate: float | None = None
    target_mixed_groups: float | None = None
    check_prompts: int = 0
    group_size: int = 8
    sampling: SamplingParams | None = None
    weight_decay: float = 0.01
    lr_warmup_steps: int = 20

    def __post_init__(self):
        for name in ("steps", "batch", "eval_every", "eval_n", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"warmup: {name}={getattr(self, name)} must be >= 1")
        if self.check_prompts < 0:
            raise ValueError(f"warmup: check_prompts={self.check_prompts} must be >= 0")
        for name in ("target_accuracy", "target_pass_rate", "target_mixed_groups"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"warmup: {name}={value} must be in [0, 1]")
        if self.sampled_targets and self.check_prompts < 1:
            raise ValueError(f"warmup: {self.sampled_targets[0]} needs the sampled check: "
                             f"check_prompts={self.check_prompts} must be >= 1")

    @property
    def sampled_targets(self) -> tuple[str, ...]:
        """The names of the targets set that the sampled check measures."""
        return tuple(n for n in ("target_pass_rate", "target_mixed_groups") if getattr(self, n) is not None)

    @classmethod
    def from_config(cls, config: RunConfig, task: Task) -> WarmupSettings:
        """The settings of `config.warmup`, with `config.eval.n` held-out problems and the sampled check
        drawn as the rollout draws (`config.rollout`: group_size, temperature, top_k, top_p,
        max_new_tokens, 0: `task.answer_len`)."""
        w, r = config.warmup, config.rollout
        return cls(steps=w.steps, batch=w.batch, lr=w.lr, eval_every=w.eval_every, eval_n=config.eval.n,
                   target_accuracy=w.target_accuracy, target_pass_rate=w.target_pass_rate,
                   target_mixed_groups=w.target_mixed_groups, check_prompts=w.check_prompts,
                   group_size=r.group_size,
                   sampling=SamplingParams(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
                                           max_new_tokens=r.max_new_tokens or task.answer_len))


# Each target (a `WarmupSettings` field, `config.warmup.<name>`) and the check's curve it is reached on.
TARGET_CURVES = (("target_accuracy", "accuracy"), ("target_pass_rate", "pass@1"),
                 ("target_mixed_groups", "mixed_groups"))
TARGET_MEASURES = {"target_accuracy": "greedy held-out accuracy", "target_pass_rate": "sampled pass@1",
                   "target_mixed_groups": "share of mixed groups"}
# The keys that make a task's problems smaller (fewer digits, a smaller dataset config): the advice of `miss_line`.
SMALLER_PROBLEMS = {"arithmetic": "--config.task.arithmetic.max_digits=<fewer digits>",
                    "digit_sum": "--config.task.digit_sum.max_digits=<fewer digits>",
                    "reasoning_gym": "--config.task.reasoning_gym.config='{...}' with smaller values (the dataset's "
                                     "own size settings)"}


def miss_line(metrics: dict[str, Any], task_name: str) -> str | None:
    """One line for a warm-up that ended without reaching its targets (`warmup`'s `metrics`): what it
    reached against each target missed, and what to change; None when they hold or none was set."""
    if metrics.get("target_met") is not False:
        return None
    missed = [f"{TARGET_MEASURES[name]} {value:.3f} < warmup.{name}={target:g}"
              for name, (target, value) in metrics["targets"].items() if not value >= target]
    steps = metrics["steps_run"]
    smaller = SMALLER_PROBLEMS.get(task_name, "an easier task")
    return (f"warm-up missed its target after all {steps} steps: {'; '.join(missed)}. RL starts from this base model "
            f"anyway; to reach the target give it more steps (--config.warmup.steps={2 * steps}) or a smaller "
            f"problem ({smaller})")


def abstract_progress(model_config: qwen3.Qwen3Config, settings: WarmupSettings, *,
                      legacy: bool = False) -> WarmupProgress | LegacyWarmupProgress:
    """The `WarmupProgress` of a `warmup(model_config, task, settings, ...)` as `jax.ShapeDtypeStruct`s
    (the template a checkpoint of it is restored into; it reads `steps`, `lr`, `eval_every`,
    `weight_decay`, `lr_warmup_steps`); `legacy`: the former layout's."""
    s = settings

    def build():
        params = qwen3.init_params(model_config, jax.random.PRNGKey(0))
        opt_state = make_warmup_optimizer(s.lr, s.weight_decay, s.lr_warmup_steps).init(params)
        kind, rows = (LegacyWarmupProgress, 4) if legacy else (WarmupProgress, len(EVAL_ROWS))
        return kind(params, opt_state, jnp.int32(0), jnp.zeros((s.steps,), jnp.float32),
                    jnp.zeros((rows, max_evals(s.steps, s.eval_every)), jnp.float32), jnp.int32(0))

    return jax.eval_shape(build)


def warmup(
    model_config: qwen3.Qwen3Config,
    task,
    settings: WarmupSettings,
    *,
    seed: int,
    params: Any = None,
    resume: WarmupProgress | None = None,
    after_chunk: Callable[[WarmupProgress], None] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Trains `params` (default: `initial_params(model_config, seed)`) for up to `settings.steps` steps.

    A check at step 0 and after every `eval_every` steps (and at the last step): greedy held-out
    accuracy on the same `eval_n` held-out problems, and with `check_prompts > 0` on a
    `device_reward` task the sampled check: `group_size` responses to each of `check_prompts`
    held-out problems (`check_keys(seed)`: the same ones each time), drawn as the rollout draws them
    (`settings.sampling`; its stop tokens and pad id are the task's), scored by the task's JAX reward:
    pass@1 and the share of mixed groups (`teacher_forcing.pass_and_mixed`). Training stops at the
    first check (step 0 included) where every target set holds: greedy accuracy >= `target_accuracy`,
    pass@1 >= `target_pass_rate`, mixed share >= `target_mixed_groups`. The demonstrations are
    `task.warmup_problems` (module docstring); the teacher's accuracy with a solution / a feedback
    context is measured at every check beside the student's. The seed drives the initial params, the
    train batches and the held-out sets; the result is a deterministic function of the arguments.

    `after_chunk(progress)` is called after each chunk's check (the trainer checkpoints it there,
    and may raise to stop); `resume=progress` continues from it, and the result is the same as had
    the warm-up run through. One INFO line per check (`log`).

    Returns (params, metrics) with metrics:
      loss: float array `[steps_run]` (train loss of each step's batch, before its update),
      eval_steps / heldout_accuracy: lists (the greedy accuracy curve on the warm-up's check set),
      heldout_pass_at_1 / mixed_groups: lists, the sampled check (NaN where not measured),
      teacher_solution_accuracy / teacher_feedback_accuracy: lists, the same problems with a context,
      initial_accuracy, final_accuracy, final_pass_at_1, final_mixed_groups, final_teacher_solution_accuracy,
      final_teacher_feedback_accuracy, check_problems (eval_n), check_prompts, check_samples (group_size),
      steps_run, stopped_early, wall_time_s,
      targets: {target name (`WarmupSettings`' field, e.g. "target_accuracy"): (target, value at the last check)}
        of the targets set, target_met: whether they all hold at the last check (None: no target set).
    """
    s = settings
    steps, eval_every, eval_n, check_prompts, group_size = (s.steps, s.eval_every, s.eval_n, s.check_prompts,
                                                            s.group_size)
    if model_config.vocab_size < task.token_id_bound:
        raise ValueError(f"warmup: model_config.vocab_size={model_config.vocab_size} < the task vocabulary "
                         f"({task.token_id_bound} tokens)")
    if model_config.max_position_embeddings < task.prompt_len + task.answer_len:
        raise ValueError(f"warmup: model_config.max_position_embeddings={model_config.max_position_embeddings} "
                         f"< the task's prompt + answer length {task.prompt_len + task.answer_len}")
    if not task.capabilities.warmup:
        raise ValueError(f"warmup: the {task.name} task has no reference responses to learn from")
    if s.sampled_targets and not task.capabilities.device_reward:
        raise ValueError(f"warmup: {s.sampled_targets[0]} needs the task's JAX reward; the {task.name} task is "
                         "scored on the host")
    sampled = check_prompts > 0 and task.capabilities.device_reward
    sampling = None
    if sampled:
        sampling = s.sampling if s.sampling is not None else SamplingParams(max_new_tokens=task.answer_len)
        if sampling.temperature <= 0:
            raise ValueError(f"warmup: temperature={sampling.temperature} must be > 0 (the sampled check)")

    start = time.perf_counter()
    _, k_train, k_eval = _seed_keys(seed)
    k_check_problems, k_check_samples = check_keys(seed)
    if resume is not None:
        if isinstance(resume, LegacyWarmupProgress):
            resume = from_legacy(resume)
        params, opt_state = jax.tree.map(jnp.array, (resume.params, resume.opt_state))
        done, n_evals = int(resume.done), int(resume.n_evals)
        evals = np.asarray(resume.evals_6e)[:, :n_evals]
        eval_steps = [int(x) for x in evals[0]]
        curves = {name: [float(x) for x in row] for name, row in zip(EVAL_ROWS[1:], evals[1:])}
        losses = [np.asarray(resume.losses_s)[:done]]
    else:
        if params is None:
            params = initial_params(model_config, seed)
        else:  # a copy: train_chunk donates its input buffers
            params = jax.tree.map(jnp.array, params)
    optimizer = make_warmup_optimizer(s.lr, s.weight_decay, s.lr_warmup_steps)
    if resume is None:
        opt_state = optimizer.init(params)
    params, opt_state = shardings.on_default_device((params, opt_state))  # each program compiles once

    table = task.prompt_table()  # None for a task that generates its problems

    def evaluate(kind: str = "none") -> float:
        return float(teacher_forcing.heldout_accuracy(model_config, params, task, table, eval_n, k_eval, kind))

    contexts = jax.eval_shape(lambda: task.teacher_eval_problems(table, 1, k_eval))  # {} for a task without any

    def check() -> None:
        """The check of the current params, appended to the curves (NaN: not measured / no such context)."""
        curves["accuracy"].append(evaluate())
        for kind in ("solution", "feedback"):
            curves[f"teacher_{kind}"].append(evaluate(kind) if kind in contexts else float("nan"))
        pass1 = mixed = float("nan")
        if sampled:
            rewards = teacher_forcing.sampled_rewards(model_config, params, task, table, check_prompts, group_size,
                                                      k_check_problems, k_check_samples, sampling)
            pass1, mixed = teacher_forcing.pass_and_mixed(jax.device_get(rewards))
        curves["pass@1"].append(pass1)
        curves["mixed_groups"].append(mixed)

    def report() -> None:
        step, chunk = eval_steps[-1], losses[-1]
        parts = [f"loss {float(np.mean(chunk)):.4f}"] if len(chunk) and step else []
        parts.append(f"greedy held-out accuracy {curves['accuracy'][-1]:.3f} (the warm-up's own {eval_n} "
                     "seed-drawn problems)")
        if sampled:
            parts.append(f"sampled pass@1 {curves['pass@1'][-1]:.3f}, mixed groups {curves['mixed_groups'][-1]:.3f} "
                         f"({check_prompts} prompts x {group_size} at T={sampling.temperature:g})")
        if contexts:
            parts.append(f"teacher with a solution {curves['teacher_solution'][-1]:.3f}, "
                         f"with feedback {curves['teacher_feedback'][-1]:.3f}")
        log.info("warm-up step %d/%d: %s, %.1fs", step, steps, ", ".join(parts), time.perf_counter() - start)

    if resume is None:
        curves = {name: [] for name in EVAL_ROWS[1:]}
        eval_steps, losses = [0], [np.zeros((0,), np.float32)]
        check()
        report()
        done = 0

    def reached() -> bool:
        set_ = [(getattr(s, t), curves[name][-1]) for t, name in TARGET_CURVES if getattr(s, t) is not None]
        return bool(set_) and all(value >= t for t, value in set_)  # NaN (not measured) never reaches

    def progress() -> WarmupProgress:
        evals = np.zeros((len(EVAL_ROWS), max_evals(steps, eval_every)), np.float32)
        evals[:, :len(eval_steps)] = [eval_steps] + [curves[name] for name in EVAL_ROWS[1:]]
        run = np.concatenate(losses)
        return WarmupProgress(params, opt_state, np.int32(done), np.pad(run, (0, steps - len(run))), evals,
                              np.int32(len(eval_steps)))

    while done < steps and not reached():
        n = min(eval_every, steps - done)
        params, opt_state, chunk_losses = train_chunk(
            model_config, task, optimizer, params, opt_state, jax.random.fold_in(k_train, done), batch=s.batch,
            num_steps=n)
        losses.append(np.asarray(chunk_losses))
        done += n
        eval_steps.append(done)
        check()
        report()
        if after_chunk is not None:
            after_chunk(progress())
    targets = {name: (getattr(s, name), curves[curve][-1]) for name, curve in TARGET_CURVES
                if getattr(s, name) is not None}
    metrics = {
        "targets": targets,
        "target_met": reached() if targets else None,
        "loss": np.concatenate(losses),
        "eval_steps": eval_steps,
        "heldout_accuracy": curves["accuracy"],
        "heldout_pass_at_1": curves["pass@1"],
        "mixed_groups": curves["mixed_groups"],
        "initial_accuracy": curves["accuracy"][0],
        "final_accuracy": curves["accuracy"][-1],
        "final_pass_at_1": curves["pass@1"][-1],
        "final_mixed_groups": curves["mixed_groups"][-1],
        "teacher_solution_accuracy": curves["teacher_solution"],
        "teacher_feedback_accuracy": curves["teacher_feedback"],
        "final_teacher_solution_accuracy": curves["teacher_solution"][-1],
        "final_teacher_feedback_accuracy": curves["teacher_feedback"][-1],
        "check_problems": eval_n,
        "check_prompts": check_prompts if sampled else 0,
        "check_samples": group_size,
        "steps_run": done,
        "stopped_early": done < steps,
        "wall_time_s": time.perf_counter() - start,
    }
    return params, metrics
