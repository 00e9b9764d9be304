"""`TrainSpec`: the validated, hashable (jit-static) view of an ml-collections run config.

`train_spec(config)` loads what the config points at (the model's `config.json`, a
dataset task) and then validates: `spec_from_config(config, model, task)` builds the
self-validating sections of `rl/sections.py` and the `TrainSpec` that ties them together
and resolves the algorithm's registered pieces (`rl/algorithms.py`); it does no I/O.
Every error is a `ConfigError` naming the key (unknown algorithm, K < 2, lam outside
[0, 1], G = 1 with a group method, a mini-batch that does not divide the batch, a
missing model path, ...).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import ml_collections

from pipo_jax import platforms
from pipo_jax.models import attention, hf, qwen3
from pipo_jax.rl import algorithms, warmup
from pipo_jax.sampling import generator as generator_lib
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.rl.sections import (AdvantageConfig, ConfigError, CriticConfig, DapoConfig, LossConfig, PipoConfig,
                                  RolloutConfig, SdpoConfig, TrainConfig, VpdConfig, choice as _choice,
                                  need as _need)
from pipo_jax.rl.task_config import make_task
from pipo_jax.tasks.protocol import Task

ALGORITHMS = tuple(dict.fromkeys(key.split("+")[0] for key in algorithms.ALGORITHMS))  # config.algorithm
ESTIMATOR_CHOICES = tuple(algorithms.ADVANTAGE_ESTIMATORS) + ("none",)
POLICY_CHOICES = tuple(dict.fromkeys(name for a in algorithms.ALGORITHMS.values() for name, _ in a.policy_losses))
LOGPROB_IMPLS = ("auto", "reference", "chunked", "pallas")
__all__ = ["ConfigError", "TrainSpec", "VpdConfig", "train_spec", "spec_from_config"]


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
        _need((self.vpd is not None) == algo.name.startswith("vpd"), "vpd",
              f"the vpd section is for algorithm=vpd, not {algo.name!r}")
        hybrid = "" if self.vpd is None else f" with vpd.hybrid={self.vpd.hybrid!r}"
        _choice(self.advantage.estimator, "advantage.estimator", ESTIMATOR_CHOICES)
        _need(self.advantage.estimator in algo.estimators, "advantage.estimator",
              f"{self.advantage.estimator!r} does not fit algorithm={algo.name.split('+')[0]!r}{hybrid} "
              f"(expected one of {algo.estimators})")
        _choice(self.loss.policy, "loss.policy", POLICY_CHOICES)
        _need(algo.loss_for(self.loss.policy) is not None, "loss.policy",
              f"{self.loss.policy!r} does not fit algorithm={algo.name.split('+')[0]!r}{hybrid} "
              f"(expected one of {tuple(dict(algo.policy_losses))})")
        _need(not self.loss.clip_ratio_c or self.policy.dual_clip or self.policy.distills, "loss.clip_ratio_c",
              f"loss.policy={self.loss.policy!r} has no dual clip: set it to 0")
        _choice(self.pipo.attribution, "pipo.attribution", tuple(algorithms.ATTRIBUTIONS))
        _need(self.pipo.attribution == algo.attribution, "pipo.attribution",
              f"{self.pipo.attribution!r} does not fit algorithm={algo.name.split('+')[0]!r}{hybrid} "
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


def make_model_config(mc: ml_collections.ConfigDict, task: Task | None = None) -> qwen3.Qwen3Config:
    """The model's shapes: the built-in task model (its vocabulary wide enough for `task`'s
    token ids), a preset, or the HF directory's config.json."""
    _choice(mc.platform, "model.platform", ("auto", *platforms.PLATFORMS))
    _choice(mc.attention_impl, "model.attention_impl", attention.IMPLS)
    _choice(mc.layer_loop, "model.layer_loop", qwen3.LAYER_LOOPS)
    platform = platforms.of_devices(jax.devices()) if mc.platform == "auto" else mc.platform
    overrides = dict(param_dtype=mc.param_dtype, dtype=mc.dtype, remat=mc.remat, platform=platform,
                     attention_impl=mc.attention_impl, layer_loop=mc.layer_loop)
    try:
        if mc.path:
            _need(os.path.isdir(mc.path), "model.path", f"{mc.path!r} is not a directory")
            with open(os.path.join(mc.path, "config.json")) as f:
                return hf.config_from_hf(json.load(f), os.path.join(mc.path, "config.json"), **overrides)
        if mc.preset == "task_tiny":
            if task is None:
                return warmup.task_model_config(**overrides)
            return warmup.task_model_config(task.token_id_bound, **overrides)
        _need(False, "model.path", f"model.preset={mc.preset!r} needs the Hugging Face weights: set "
              f"--config.model.path=/path/to/{mc.preset} (no weights are downloaded at run time)")
    except (ValueError, FileNotFoundError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"config.model: {e}") from e


def run_iterations_of(spec: TrainSpec, c: ml_collections.ConfigDict) -> int:
    """`config.iterations`, or with `task.epochs` > 0 round(epochs * train rows / prompts_per_batch) (>= 1)."""
    if not c.task.epochs:
        return int(c.iterations)
    return max(1, round(c.task.epochs * spec.task.train_size / spec.rollout.prompts_per_batch))


def spec_from_config(c: ml_collections.ConfigDict, model: qwen3.Qwen3Config, task: Task) -> TrainSpec:
    """The `TrainSpec` of `c` for a loaded `model` config and `task`; no I/O. Raises `ConfigError`."""
    _choice(c.algorithm, "algorithm", ALGORITHMS)
    _need(c.model.param_dtype == "float32", "model.param_dtype",
          f"{c.model.param_dtype!r}: the trainer keeps float32 master weights and AdamW state (bf16 cannot hold "
          "AdamW's b2 = 0.999 or a 1e-6 update); set model.dtype=bfloat16 for bf16 compute")
    vpd = VpdConfig.from_config(c.vpd) if c.algorithm == "vpd" else None
    rollout = RolloutConfig.from_config(c.rollout, task.answer_len)
    return TrainSpec(
        algorithm=algorithms.ALGORITHMS[algorithms.algorithm_key(c.algorithm, "none" if vpd is None else vpd.hybrid)],
        model=model, task=task, rollout=rollout, train=TrainConfig.from_config(c.train, rollout),
        advantage=AdvantageConfig.from_config(c.advantage), loss=LossConfig.from_config(c.loss),
        critic=CriticConfig.from_config(c.critic), dapo=DapoConfig.from_config(c.dapo, rollout),
        sdpo=SdpoConfig.from_config(c.sdpo), pipo=PipoConfig.from_config(c.pipo), vpd=vpd, model_path=c.model.path,
        logprob_impl=c.model.logprob_impl)


def check_run_config(c: ml_collections.ConfigDict, task: Task) -> None:
    """The keys the trainer reads outside the spec (iterations, logging, checkpoints, evaluation,
    warm-up); raises `ConfigError` naming the key."""
    _need(not c.eval.benchmarks or task.name == "math", "eval.benchmarks",
          "math benchmarks need a math task's tokenizer and prompts: set task.name=math")
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
        _need(c.warmup.steps >= 1, "warmup.steps", f"{c.warmup.steps} must be >= 1")
        _need(c.warmup.lr > 0, "warmup.lr", f"{c.warmup.lr} must be > 0")
        _need(c.warmup.eval_every >= 1, "warmup.eval_every", f"{c.warmup.eval_every} must be >= 1")
        for key in ("mistake_rate", "context_fraction"):
            _need(0.0 <= c.warmup[key] <= 1.0, f"warmup.{key}", f"{c.warmup[key]} must be in [0, 1]")
            _need(task.name == "arithmetic" or c.warmup[key] == 0, f"warmup.{key}",
                  f"{c.warmup[key]}: the built-in task's; the {task.name} task warms up on its reference "
                  "responses only (set it to 0)")


def train_spec(c: ml_collections.ConfigDict) -> TrainSpec:
    """Loads the model config and the task `c` points at, validates `c` and returns its `TrainSpec`;
    raises `ConfigError` naming the key."""
    _choice(c.algorithm, "algorithm", ALGORITHMS)
    model = make_model_config(c.model)  # its errors first: a paper preset without model.path says so
    task = make_task(c)
    if not c.model.path and c.model.preset == "task_tiny":
        model = make_model_config(c.model, task)  # the task model's vocabulary covers the task's tokens
    _need(task.token_id_bound <= model.vocab_size, "task.tokenizer_path" if task.tokenizer is not None else "task",
          f"token ids up to {task.token_id_bound - 1} do not fit the model's vocab_size {model.vocab_size}")
    check_run_config(c, task)
    if c.eval.benchmarks:
        eval_benchmarks(c.eval)  # raises naming the key
    return spec_from_config(c, model, task)
