"""`TrainSpec`: the validated, hashable (jit-static) view of a typed run config (`RunConfig`).

Pure: no file is read here and no task module is imported (`tests/test_layers.py` checks that
importing this module loads neither the math verifier, the code sandbox nor the warm-up).
`run/setup.py:train_spec(run)` loads what the typed config points at (the model's `config.json`,
the task) and then validates: `spec_from_config(run, model, task)` takes the typed run config
(`config/sections.py:RunConfig`, parsed once at the entry point) and builds the `TrainSpec` that ties its
sections together and resolves the algorithm's registered pieces (`rl/registry.py`, filled by `rl/algorithms.py`).
Every error is a `ConfigError` naming the key (unknown algorithm, K < 2, lam outside
[0, 1], G = 1 with a group method, a mini-batch that does not divide the batch, a
missing model path, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import os

from pipo_jax.config.sections import (AdvantageConfig, ConfigError, CriticConfig, DapoConfig, EvalConfig, LossConfig,
                                      PipoConfig, RolloutConfig, RunConfig, SdpoConfig, TrainConfig, VpdConfig)
from pipo_jax.config.sections import need as _need
from pipo_jax.models import qwen3
from pipo_jax.rl import controller, hyper
from pipo_jax.rl import registry as algorithms
from pipo_jax.sampling import generator as generator_lib
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.tasks.protocol import Task

__all__ = ["ConfigError", "GenerationSpec", "TrainSpec", "VpdConfig", "spec_from_config"]


@dataclasses.dataclass(frozen=True)
class GenerationSpec:
    """What sampling a batch reads of a `TrainSpec`: the model, the task and the rollout section.
    Hashable (jit-static) and equal for every algorithm that samples alike, so that one program of
    it serves them all."""

    model: qwen3.Qwen3Config
    task: Task
    rollout: RolloutConfig

    @property
    def sampling(self) -> SamplingParams:
        """How the rollout samples: tempered behaviour log-probs, log_softmax(logits / T) over the
        full vocabulary, what the trainer recomputes (top-k / top-p only shape the sampling)."""
        r = self.rollout
        return SamplingParams(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p, max_new_tokens=r.max_new_tokens,
                              stop_token_ids=tuple(self.task.stop_token_ids), pad_id=self.task.pad_id,
                              logprobs="tempered")

    @property
    def generator(self) -> generator_lib.Generator:
        """The rollout interface's implementation (`rollout.engine`)."""
        if self.rollout.engine == "slots":
            return generator_lib.SlotEngineSampler(self.model, self.sampling, self.rollout.group_size,
                                                   self.rollout.engine_slots, self.rollout.engine_steps)
        return generator_lib.OneJitSampler(self.model, self.sampling)


@dataclasses.dataclass(frozen=True, eq=False)
class TrainSpec:
    """Everything the jitted steps need to know statically: the config's sections, validated,
    and the algorithm's registered pieces (`rl/algorithms.py`). Hashable: jit-static.

    The sections hold every key's value, the hyperparameters' too (`rl/hyper.py:HYPER_KEYS`), but
    equality and hash leave those values out (`static_key`): the learner reads them from the state
    (`TrainState.hyper`), so configs that differ only in them share one spec's programs.
    `__post_init__` checks what ties the sections together and names the key.
    """

    algorithm: algorithms.Algorithm
    model: qwen3.Qwen3Config
    task: Task  # tasks/protocol.py: the built-in arithmetic task or a dataset task
    rollout: RolloutConfig
    train: TrainConfig
    advantage: AdvantageConfig
    loss: LossConfig
    critic: CriticConfig
    dapo: DapoConfig
    sdpo: SdpoConfig
    pipo: PipoConfig
    vpd: VpdConfig | None = None  # algorithm = vpd
    model_path: str = ""
    logprob_impl: str = "auto"  # fused log-prob kernel: auto | reference | chunked | pallas

    def __post_init__(self):
        algo, r, t = self.algorithm, self.rollout, self.train
        _need(self.prompt_len + r.max_new_tokens <= self.model.max_position_embeddings, "rollout.max_new_tokens",
              f"prompt {self.prompt_len} + response {r.max_new_tokens} exceeds the model's max_position_embeddings "
              f"{self.model.max_position_embeddings}")
        _need(r.prompts_per_batch % t.mini_batch_prompts == 0, "train.mini_batch_prompts",
              f"{t.mini_batch_prompts} does not divide rollout.prompts_per_batch={r.prompts_per_batch}")
        micro = t.micro_batch_size_per_device
        _need(micro == 0 or self.mini_batch % micro == 0, "train.micro_batch_size_per_device",
              f"{micro} does not divide the mini-batch of {self.mini_batch}")
        _need(not self.dapo.dynamic_sampling or r.group_size >= 2, "dapo.dynamic_sampling",
              "filters groups by reward variance: needs G >= 2")
        _need(self.dapo.overlong_buffer <= r.max_new_tokens, "dapo.overlong_buffer",
              f"{self.dapo.overlong_buffer} must be in [0, max_new_tokens={r.max_new_tokens}]")
        _need((self.vpd is not None) == algo.vpd_settings, "vpd",
              f"the vpd section is for algorithm=vpd, not {algo.name!r}")
        hybrid = "" if self.vpd is None else f" with vpd.hybrid={self.vpd.hybrid!r}"
        no_teacher = tuple(a for a in algorithms.config_names() if not algorithms.plain_algorithm(a).teacher)
        _need(not algo.teacher or self.task.capabilities.teacher_contexts, "algorithm",
              f"{algo.config_name} needs teacher contexts (SDPO / VPD teacher prompts), which the {self.task.name} "
              f"task does not have; use one of {no_teacher}")
        _need(self.estimator is None or not self.estimator.reward_components
              or self.task.capabilities.reward_components, "advantage.estimator",
              f"{self.advantage.estimator!r} normalises each component of the reward, which the {self.task.name} "
              "task does not expose (TaskCapabilities.reward_components)")
        _need(self.advantage.estimator in algo.estimators, "advantage.estimator",
              f"{self.advantage.estimator!r} does not fit algorithm={algo.config_name!r}{hybrid} "
              f"(expected one of {algo.estimators})")
        _need(algo.loss_for(self.loss.policy) is not None, "loss.policy",
              f"{self.loss.policy!r} does not fit algorithm={algo.config_name!r}{hybrid} "
              f"(expected one of {tuple(dict(algo.policy_losses))})")
        _need(not self.loss.clip_ratio_c or self.policy.dual_clip or self.policy.distills, "loss.clip_ratio_c",
              f"loss.policy={self.loss.policy!r} has no dual clip: set it to 0")
        _need(self.pipo.attribution == algo.attribution, "pipo.attribution",
              f"{self.pipo.attribution!r} does not fit algorithm={algo.config_name!r}{hybrid} "
              f"(expected {algo.attribution!r})")
        group_estimator = self.advantage.estimator in algorithms.group_estimators()
        if group_estimator or self.pipo.attribution == "group":
            _need(r.group_size >= 2, "rollout.group_size",
                  f"G={r.group_size} with a group method (advantage.estimator={self.advantage.estimator!r}, "
                  f"pipo.attribution={self.pipo.attribution!r}) needs G >= 2")
        if self.uses_teacher:
            _need(r.group_size >= 2 or self.sdpo.use_feedback, "sdpo.use_feedback",
                  "with G = 1 there are no sibling solutions: enable feedback")
        _need(self.pipo.sdpo_pi_denominator == "all_tokens" or algorithms.ATTRIBUTIONS[self.pipo.attribution].teacher,
              "pipo.sdpo_pi_denominator", f"'signal_tokens' is for a teacher attribution (SDPO / VPD), not "
              f"pipo.attribution={self.pipo.attribution!r}")
        if self.vpd is not None:
            _need(not (self.vpd.e_step and self.sdpo.teacher == "live"), "sdpo.teacher",
                  "'live' shares the student's params, but VPD's E-step trains its own teacher copy: use 'ema'")

    @functools.cached_property
    def static_key(self) -> tuple:
        """What the spec's equality and hash compare: every field, with the sections' hyperparameter
        values reduced to their structure (`hyper.static_section`: e.g. whether the dual clip is on)."""
        return tuple(hyper.static_section(f.name, getattr(self, f.name)) for f in dataclasses.fields(self))

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and self.static_key == other.static_key

    def __hash__(self) -> int:
        return hash(self.static_key)

    @property
    def generation(self) -> GenerationSpec:
        """The part of the spec sampling reads (`rl/rollout.py:generate`)."""
        return GenerationSpec(self.model, self.task, self.rollout)

    @property
    def generator(self) -> generator_lib.Generator:
        """The rollout interface's implementation (`rollout.engine`)."""
        return self.generation.generator

    def with_section(self, section: str, **fields) -> TrainSpec:
        """A copy with `fields` of one section replaced (validated again), e.g.
        `spec.with_section("train", micro_batch_size_per_device=2)`."""
        return dataclasses.replace(self, **{section: dataclasses.replace(getattr(self, section), **fields)})

    @property
    def batch(self) -> int:
        """B = P * G sequences per training batch."""
        return self.rollout.batch

    @property
    def mini_batch(self) -> int:
        """Sequences per optimizer step: `train.mini_batch_prompts` x G."""
        return self.train.mini_batch_prompts * self.rollout.group_size

    @property
    def teacher_prompt_len(self) -> int:
        """Width of a host-built SDPO / VPD teacher prompt: the prompt, a sibling's response
        (or feedback) and 128 tokens of template, rounded up to 8."""
        return -(-(self.prompt_len + self.rollout.max_new_tokens + 128) // 8) * 8

    @property
    def prompt_len(self) -> int:
        return self.task.prompt_len

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.rollout.max_new_tokens

    @property
    def estimator(self) -> algorithms.AdvantageEstimator | None:
        """The registered advantage estimator, None for "none" (SDPO's distillation)."""
        return algorithms.ADVANTAGE_ESTIMATORS.get(self.advantage.estimator)

    @property
    def policy(self) -> algorithms.PolicyLoss:
        """The registered policy loss the base step trains with."""
        return algorithms.POLICY_LOSSES[self.algorithm.loss_for(self.loss.policy)]

    @property
    def attribution(self) -> algorithms.Attribution:
        """The registered PIPO attribution stored with each batch."""
        return algorithms.ATTRIBUTIONS[self.pipo.attribution]

    @property
    def advantage_shaping(self):
        """`fn(spec, batch) -> adv_br` applied after the estimator, or None."""
        name = self.algorithm.advantage_shaping
        return None if name is None else algorithms.ADVANTAGE_SHAPINGS[name]

    @property
    def has_critic(self) -> bool:
        return self.estimator is not None and self.estimator.critic

    @property
    def uses_teacher(self) -> bool:
        """The batch needs feedback-conditioned teacher contexts (SDPO, VPD and its hybrids)."""
        return self.algorithm.teacher

    @property
    def live_teacher(self) -> bool:
        """SDPO's teacher is the student's own params (`sdpo.teacher=live`), not a copy."""
        return self.sdpo.teacher == "live" and self.vpd is None

    @functools.cached_property
    def pipo_options(self) -> controller.PipoOptions:
        """The authors' behaviours that are on (all off = the paper): `pipo.compat`, then each of
        `pipo.authors` that is set."""
        return controller.options_of(self.pipo)

    @property
    def pi_ratio(self) -> str:
        """The PI surrogate's ratio: the base loss's (`PolicyLoss.pi_ratio`), or per token with
        `pipo.pi_ratio=token`."""
        return "token" if self.pipo.pi_ratio == "token" else self.policy.pi_ratio


def eval_benchmarks(ec: EvalConfig) -> tuple[dict[str, str], tuple[int, ...]]:
    """`config.eval.benchmarks` as {name: path} and `config.eval.ks`, the files checked."""
    out = {}
    for item in filter(None, (x.strip() for x in ec.benchmarks.split(","))):
        name, sep, path = item.partition("=")
        _need(bool(sep and name and path), "eval.benchmarks", f"{item!r} is not NAME=PATH")
        _need(name not in out, "eval.benchmarks", f"benchmark {name!r} is named twice")
        _need(os.path.exists(path), "eval.benchmarks", f"{name}: no such file {path!r}")
        out[name] = path
    return out, ec.pass_ks


def run_iterations_of(spec: TrainSpec, run: RunConfig) -> int:
    """`run.iterations`, or with `task.epochs` > 0 round(epochs * train rows / prompts_per_batch) (>= 1)."""
    if not run.task.epochs:
        return run.iterations
    return max(1, round(run.task.epochs * spec.task.train_size / spec.rollout.prompts_per_batch))


def spec_from_config(run: RunConfig, model: qwen3.Qwen3Config, task: Task) -> TrainSpec:
    """The `TrainSpec` of the typed run config `run` for a loaded `model` config and `task`; no I/O.
    Raises `ConfigError`. The spec's rollout and DAPO sections hold their "0 = default" keys resolved."""
    _need(run.rollout.max_new_tokens != 0 or task.answer_len >= 1, "rollout.max_new_tokens",
          "the task has no default response length: set it (>= 1)")
    rollout = dataclasses.replace(run.rollout, max_new_tokens=run.rollout.max_new_tokens or task.answer_len)
    dapo = dataclasses.replace(run.dapo, gen_prompts_per_batch=run.dapo.gen_prompts_per_batch
                               or rollout.prompts_per_batch)
    vpd = run.vpd if algorithms.plain_algorithm(run.algorithm).vpd_settings else None
    return TrainSpec(
        algorithm=algorithms.algorithm_variant(run.algorithm, "none" if vpd is None else vpd.hybrid),
        model=model, task=task, rollout=rollout, train=run.train, advantage=run.advantage, loss=run.loss,
        critic=run.critic, dapo=dapo, sdpo=run.sdpo, pipo=run.pipo, vpd=vpd, model_path=run.model.path,
        logprob_impl=run.model.logprob_impl)


def check_run_config(c: RunConfig, task: Task) -> None:
    """What the keys the trainer reads outside the spec (iterations, logging, checkpoints,
    evaluation, warm-up) need of the task and of each other; raises `ConfigError` naming the key.
    Each key's own constraint is its declaration's (`config/sections.py`)."""
    _need(not c.eval.benchmarks or task.capabilities.answer_benchmarks, "eval.benchmarks",
          f"math benchmarks need a math task's tokenizer, prompts and verifier; the {task.name} task has none: "
          "set task.name=math")
    _need(not c.task.epochs or task.train_size > 0, "task.epochs",
          f"counts passes over a dataset task's training rows; the {task.name} task generates its problems: "
          "use `iterations`")
    _need(c.rollout.engine != "slots" or not c.log.jit_loop, "log.jit_loop",
          "rollout.engine=slots is driven from the host: set log.jit_loop=false")
    if c.warmup.enabled:
        _need(not c.model.path, "warmup.enabled", "the supervised warm-up trains a fresh task model; "
              "disable it when loading model.path")
        _need(task.capabilities.warmup, "warmup.enabled", f"the {task.name} task has no reference responses for "
              "the supervised warm-up: set it to false")
        for name in ("target_pass_rate", "target_mixed_groups"):
            _need(getattr(c.warmup, name) is None or task.capabilities.device_reward, f"warmup.{name}",
                  f"the warm-up's sampled check scores with the task's JAX reward; the {task.name} task is scored on "
                  "the host: leave it None (warmup.target_accuracy stops on greedy accuracy)")
        _need(c.warmup.target_mixed_groups is None or c.warmup.target_mixed_groups == 0 or c.rollout.group_size >= 2,
              "warmup.target_mixed_groups", f"{c.warmup.target_mixed_groups}: a group of rollout.group_size="
              f"{c.rollout.group_size} response is never mixed; set rollout.group_size >= 2 or leave it None")
