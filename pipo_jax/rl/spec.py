"""`TrainSpec`: the validated, hashable (jit-static) view of an ml-collections run config.

Pure: no file is read here and no task module is imported (`tests/test_layers.py` checks that
importing this module loads neither the math verifier, the code sandbox nor the warm-up).
`rl/setup.py:train_spec(config)` loads what the config points at (the model's `config.json`,
the task) and then validates: `spec_from_config(config, model, task)` builds the
self-validating sections of `rl/sections.py` and the `TrainSpec` that ties them together
and resolves the algorithm's registered pieces (`rl/algorithms.py`).
Every error is a `ConfigError` naming the key (unknown algorithm, K < 2, lam outside
[0, 1], G = 1 with a group method, a mini-batch that does not divide the batch, a
missing model path, ...).
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections

from pipo_jax.models import qwen3
from pipo_jax.rl import algorithms
from pipo_jax.sampling import generator as generator_lib
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.rl.sections import (AdvantageConfig, ConfigError, CriticConfig, DapoConfig, LossConfig, PipoConfig,
                                  RolloutConfig, SdpoConfig, TrainConfig, VpdConfig, choice as _choice,
                                  need as _need)
from pipo_jax.tasks.protocol import Task

ALGORITHM_CHOICES = algorithms.config_names()  # config.algorithm
ESTIMATOR_CHOICES = tuple(algorithms.ADVANTAGE_ESTIMATORS) + ("none",)
POLICY_CHOICES = tuple(dict.fromkeys(name for a in algorithms.ALGORITHMS.values() for name, _ in a.policy_losses))
LOGPROB_IMPLS = ("auto", "reference", "chunked", "pallas")
__all__ = ["ConfigError", "TrainSpec", "VpdConfig", "spec_from_config"]


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """Everything the jitted steps need to know statically: the config's sections, validated,
    and the algorithm's registered pieces (`rl/algorithms.py`). Hashable: jit-static.

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
        algo, r = self.algorithm, self.rollout
        _choice(self.logprob_impl, "model.logprob_impl", LOGPROB_IMPLS)
        _need(self.prompt_len + r.response_len <= self.model.max_position_embeddings, "rollout.max_new_tokens",
              f"prompt {self.prompt_len} + response {r.response_len} exceeds the model's max_position_embeddings "
              f"{self.model.max_position_embeddings}")
        _need(r.batch % self.train.mini_batch == 0, "train.mini_batch_prompts",
              f"a mini-batch of {self.train.mini_batch} sequences does not divide the batch of {r.batch}")
        _need(self.dapo.overlong_buffer <= r.response_len, "dapo.overlong_buffer",
              f"{self.dapo.overlong_buffer} must be in [0, max_new_tokens={r.response_len}]")
        _need((self.vpd is not None) == algo.vpd_settings, "vpd",
              f"the vpd section is for algorithm=vpd, not {algo.name!r}")
        hybrid = "" if self.vpd is None else f" with vpd.hybrid={self.vpd.hybrid!r}"
        no_teacher = tuple(a for a in ALGORITHM_CHOICES if not algorithms.plain_algorithm(a).teacher)
        _need(not algo.teacher or self.task.capabilities.teacher_contexts, "algorithm",
              f"{algo.config_name} needs teacher contexts (SDPO / VPD teacher prompts), which the {self.task.name} "
              f"task does not have; use one of {no_teacher}")
        _choice(self.advantage.estimator, "advantage.estimator", ESTIMATOR_CHOICES)
        _need(self.advantage.estimator in algo.estimators, "advantage.estimator",
              f"{self.advantage.estimator!r} does not fit algorithm={algo.config_name!r}{hybrid} "
              f"(expected one of {algo.estimators})")
        _choice(self.loss.policy, "loss.policy", POLICY_CHOICES)
        _need(algo.loss_for(self.loss.policy) is not None, "loss.policy",
              f"{self.loss.policy!r} does not fit algorithm={algo.config_name!r}{hybrid} "
              f"(expected one of {tuple(dict(algo.policy_losses))})")
        _need(not self.loss.clip_ratio_c or self.policy.dual_clip or self.policy.distills, "loss.clip_ratio_c",
              f"loss.policy={self.loss.policy!r} has no dual clip: set it to 0")
        _choice(self.pipo.attribution, "pipo.attribution", tuple(algorithms.ATTRIBUTIONS))
        _need(self.pipo.attribution == algo.attribution, "pipo.attribution",
              f"{self.pipo.attribution!r} does not fit algorithm={algo.config_name!r}{hybrid} "
              f"(expected {algo.attribution!r})")
        group_estimator = self.advantage.estimator in algorithms.GROUP_ESTIMATORS
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

    @property
    def sampling(self) -> SamplingParams:
        """How the rollout samples: tempered behaviour log-probs, log_softmax(logits / T) over the
        full vocabulary, what the trainer recomputes (top-k / top-p only shape the sampling)."""
        r = self.rollout
        return SamplingParams(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p, max_new_tokens=r.response_len,
                              stop_token_ids=tuple(self.task.stop_token_ids), pad_id=self.task.pad_id,
                              logprobs="tempered")

    @property
    def generator(self) -> generator_lib.Generator:
        """The rollout interface's implementation (`rollout.engine`)."""
        if self.rollout.engine == "slots":
            return generator_lib.SlotEngineSampler(self.model, self.sampling, self.rollout.group_size,
                                                   self.rollout.engine_slots)
        return generator_lib.OneJitSampler(self.model, self.sampling)

    def with_section(self, section: str, **fields) -> TrainSpec:
        """A copy with `fields` of one section replaced (validated again), e.g.
        `spec.with_section("train", micro_batch_per_device=2)`."""
        return dataclasses.replace(self, **{section: dataclasses.replace(getattr(self, section), **fields)})

    @property
    def batch(self) -> int:
        """B = P * G sequences per training batch."""
        return self.rollout.batch

    @property
    def teacher_prompt_len(self) -> int:
        """Width of a host-built SDPO / VPD teacher prompt: the prompt, a sibling's response
        (or feedback) and 128 tokens of template, rounded up to 8."""
        return -(-(self.prompt_len + self.rollout.response_len + 128) // 8) * 8

    @property
    def prompt_len(self) -> int:
        return self.task.prompt_len

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.rollout.response_len

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

    @property
    def pi_ratio(self) -> str:
        """The PI surrogate's ratio: the base loss's (`PolicyLoss.pi_ratio`), or per token with
        `pipo.pi_ratio=token`."""
        return "token" if self.pipo.pi_ratio == "token" else self.policy.pi_ratio


def eval_benchmarks(ec: ml_collections.ConfigDict) -> tuple[dict[str, str], tuple[int, ...]]:
    """`config.eval.benchmarks` as {name: path} and `config.eval.ks`, validated."""
    out = {}
    for item in filter(None, (x.strip() for x in ec.benchmarks.split(","))):
        name, sep, path = item.partition("=")
        _need(bool(sep and name and path), "eval.benchmarks", f"{item!r} is not NAME=PATH")
        _need(name not in out, "eval.benchmarks", f"benchmark {name!r} is named twice")
        _need(os.path.exists(path), "eval.benchmarks", f"{name}: no such file {path!r}")
        out[name] = path
    try:
        ks = tuple(int(k) for k in str(ec.ks).split(","))
    except ValueError:
        raise ConfigError(f"config.eval.ks: {ec.ks!r} is not a comma-separated list of integers") from None
    _need(ec.samples >= 1, "eval.samples", f"{ec.samples} must be >= 1")
    _need(all(1 <= k <= ec.samples for k in ks), "eval.ks", f"{ks}: each k must be in [1, eval.samples={ec.samples}]")
    _need(ec.temperature >= 0, "eval.temperature", f"{ec.temperature} must be >= 0")
    _need(ec.batch_size >= 1, "eval.batch_size", f"{ec.batch_size} must be >= 1")
    return out, ks


def run_iterations_of(spec: TrainSpec, c: ml_collections.ConfigDict) -> int:
    """`config.iterations`, or with `task.epochs` > 0 round(epochs * train rows / prompts_per_batch) (>= 1)."""
    if not c.task.epochs:
        return int(c.iterations)
    return max(1, round(c.task.epochs * spec.task.train_size / spec.rollout.prompts_per_batch))


def spec_from_config(c: ml_collections.ConfigDict, model: qwen3.Qwen3Config, task: Task) -> TrainSpec:
    """The `TrainSpec` of `c` for a loaded `model` config and `task`; no I/O. Raises `ConfigError`."""
    _choice(c.algorithm, "algorithm", ALGORITHM_CHOICES)
    _need(c.model.param_dtype == "float32", "model.param_dtype",
          f"{c.model.param_dtype!r}: the trainer keeps float32 master weights and AdamW state (bf16 cannot hold "
          "AdamW's b2 = 0.999 or a 1e-6 update); set model.dtype=bfloat16 for bf16 compute")
    vpd = VpdConfig.from_config(c.vpd) if algorithms.plain_algorithm(c.algorithm).vpd_settings else None
    rollout = RolloutConfig.from_config(c.rollout, task.answer_len)
    return TrainSpec(
        algorithm=algorithms.algorithm_variant(c.algorithm, "none" if vpd is None else vpd.hybrid),
        model=model, task=task, rollout=rollout, train=TrainConfig.from_config(c.train, rollout),
        advantage=AdvantageConfig.from_config(c.advantage), loss=LossConfig.from_config(c.loss),
        critic=CriticConfig.from_config(c.critic), dapo=DapoConfig.from_config(c.dapo, rollout),
        sdpo=SdpoConfig.from_config(c.sdpo), pipo=PipoConfig.from_config(c.pipo), vpd=vpd, model_path=c.model.path,
        logprob_impl=c.model.logprob_impl)


def check_run_config(c: ml_collections.ConfigDict, task: Task) -> None:
    """The keys the trainer reads outside the spec (iterations, logging, checkpoints, evaluation,
    warm-up); raises `ConfigError` naming the key."""
    _need(not c.eval.benchmarks or task.capabilities.answer_benchmarks, "eval.benchmarks",
          f"math benchmarks need a math task's tokenizer, prompts and verifier; the {task.name} task has none: "
          "set task.name=math")
    _need(c.iterations >= 1, "iterations", f"{c.iterations} must be >= 1")
    _need(c.task.epochs >= 0, "task.epochs", f"{c.task.epochs} must be >= 0")
    _need(not c.task.epochs or task.train_size > 0, "task.epochs",
          f"counts passes over a dataset task's training rows; the {task.name} task generates its problems: "
          "use `iterations`")
    _need(c.log.every >= 1, "log.every", f"{c.log.every} must be >= 1")
    _need(c.rollout.engine != "slots" or not c.log.jit_loop, "log.jit_loop",
          "rollout.engine=slots is driven from the host: set log.jit_loop=false")
    _need(c.checkpoint.every >= 0, "checkpoint.every", f"{c.checkpoint.every} must be >= 0")
    _need(c.checkpoint.keep >= 1, "checkpoint.keep", f"{c.checkpoint.keep} must be >= 1")
    _need(c.checkpoint.warmup_every >= 0, "checkpoint.warmup_every", f"{c.checkpoint.warmup_every} must be >= 0")
    _need(c.eval.every >= 0, "eval.every", f"{c.eval.every} must be >= 0")
    _need(c.eval.n >= 1, "eval.n", f"{c.eval.n} must be >= 1")
    if c.warmup.enabled:
        _need(not c.model.path, "warmup.enabled", "the supervised warm-up trains a fresh task model; "
              "disable it when loading model.path")
        _need(task.capabilities.warmup, "warmup.enabled", f"the {task.name} task has no reference responses for "
              "the supervised warm-up: set it to false")
        _need(c.warmup.steps >= 1, "warmup.steps", f"{c.warmup.steps} must be >= 1")
        _need(c.warmup.lr > 0, "warmup.lr", f"{c.warmup.lr} must be > 0")
        _need(c.warmup.eval_every >= 1, "warmup.eval_every", f"{c.warmup.eval_every} must be >= 1")
        for key in ("mistake_rate", "context_fraction"):
            _need(0.0 <= c.warmup[key] <= 1.0, f"warmup.{key}", f"{c.warmup[key]} must be in [0, 1]")
            _need(task.capabilities.warmup_shaping or c.warmup[key] == 0, f"warmup.{key}",
                  f"{c.warmup[key]}: the built-in task's; the {task.name} task warms up on its reference "
                  "responses only (set it to 0)")
