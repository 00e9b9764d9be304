"""`TrainSpec`: the validated, hashable (jit-static) view of an ml-collections run config.

`train_spec(config)` checks every setting at start-up and raises `ConfigError` naming
the key (unknown algorithm, K < 2, lam outside [0, 1], G = 1 with a group method, a
mini-batch that does not divide the batch, a missing model path, ...).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping

import jax
import ml_collections

from pipo_jax import platforms
from pipo_jax.losses import registry
from pipo_jax.losses import vpd as vpd_loss
from pipo_jax.losses.pipo import AUTHORS_BEHAVIOURS, PipoOptions, pipo_options
from pipo_jax.losses.aggregation import AGG_MODES
from pipo_jax.models import attention, hf, qwen3
from pipo_jax.rl import warmup
from pipo_jax.data import tokenizer as tok_lib
from pipo_jax.data.prompts import DEFAULT_INSTRUCTION, PromptConfig
from pipo_jax.data.sources import DataError, SourceConfig, load_examples
from pipo_jax.tasks import arithmetic, code, dataset
from pipo_jax.tasks.dataset import DatasetTask

ALGORITHMS = ("ppo", "grpo", "gspo", "dapo", "sdpo", "vpd")
GROUP_ESTIMATORS = ("grpo", "group_relative")
TASKS = ("arithmetic",) + dataset.KINDS


class ConfigError(ValueError):
    """An invalid run config; the message names the key."""


VPD_REFERENCES = ("dynamic", "fixed")
VPD_HYBRIDS = ("none", "joint", "reshape")


@dataclasses.dataclass(frozen=True)
class VpdConfig:
    """VPD settings (hashable: jit-static). Errors name the field as `config.vpd.<field>`.

    beta: implicit-reward scale in rtilde = beta * log(q / pi_ref).
    every: F, run the E-step on iterations with step % F == 0 (step = student iterations done).
    lr: the teacher's AdamW learning rate (its own optimizer state; written into it at every E-step).
    e_step: False turns VPD into SDPO (the teacher is never trained).
    reference: "dynamic" (the student at theta_t, paper default) or "fixed" (initial params).
    delta_mode / delta_ema_rate: running mean of implicit rewards, see `losses.vpd.update_delta`.
    seq_logprob: "sum" (sequence log-likelihood ratio) or "mean" (per valid token).
    hybrid / hybrid_weight: GRPO + SDPO ablation ("none", "joint", "reshape") and its w.
    """

    beta: float = 0.1
    every: int = 5
    lr: float = 1e-6
    e_step: bool = True
    reference: str = "dynamic"
    delta_mode: str = "cumulative"
    delta_ema_rate: float = 0.1
    seq_logprob: str = "sum"
    hybrid: str = "none"
    hybrid_weight: float = 1.0

    def __post_init__(self):
        def need(cond, field, message):
            if not cond:
                raise ConfigError(f"config.vpd.{field}: {message}")

        def number(field):
            value = getattr(self, field)
            need(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), field,
                 f"{value!r} must be a finite number")
            return value

        def choice(field, choices):
            value = getattr(self, field)
            need(value in choices, field, f"{value!r} is not one of {choices}")

        need(number("beta") > 0, "beta", f"{self.beta} must be > 0")
        need(isinstance(self.every, int) and not isinstance(self.every, bool) and self.every >= 1, "every",
             f"{self.every!r} must be an integer >= 1")
        need(number("lr") > 0, "lr", f"{self.lr} must be > 0")
        need(isinstance(self.e_step, bool), "e_step", f"{self.e_step!r} must be True or False")
        choice("reference", VPD_REFERENCES)
        choice("delta_mode", vpd_loss.DELTA_MODES)
        need(0 < number("delta_ema_rate") <= 1, "delta_ema_rate", f"{self.delta_ema_rate} must be in (0, 1]")
        choice("seq_logprob", vpd_loss.SEQ_LOGPROB_MODES)
        choice("hybrid", VPD_HYBRIDS)
        need(number("hybrid_weight") >= 0, "hybrid_weight", f"{self.hybrid_weight} must be >= 0")

    @classmethod
    def from_config(cls, section: Mapping) -> VpdConfig:
        """From a `config.vpd` ml-collections section (or dict); missing keys keep their defaults."""
        items = dict(section.items())
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(items) - fields)
        if unknown:
            raise ConfigError(f"config.vpd.{unknown[0]}: unknown key; valid keys are {sorted(fields)}")
        return cls(**items)


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """Everything the jitted steps need to know statically. Sizes are in sequences unless named."""

    algorithm: str
    model: qwen3.Qwen3Config
    model_path: str
    logprob_impl: str
    task: arithmetic.ArithmeticTask | DatasetTask
    prompts_per_batch: int  # P, prompts per training batch
    group_size: int  # G
    response_len: int  # R, max new tokens
    temperature: float
    top_k: int
    top_p: float
    lr: float
    weight_decay: float
    adam_b1: float
    adam_b2: float
    grad_clip: float
    mini_batch: int  # sequences per optimizer step
    micro_batch_per_device: int  # sequences per device per gradient-accumulation step; 0 = its mini-batch share
    epochs: int
    shuffle: bool
    estimator: str
    std_ddof: int
    norm_by_std: bool
    gamma: float
    gae_lam: float
    policy_loss: str
    clip_low: float
    clip_high: float
    clip_ratio_c: float
    agg_mode: str
    kl_coef: float
    kl_estimator: str
    kl_in_reward: bool
    entropy_coef: float
    critic_lr: float
    cliprange_value: float
    dynamic_sampling: bool
    gen_prompts: int
    max_num_gen_batches: int
    overlong_buffer: int
    overlong_factor: float
    sdpo_alpha: float
    sdpo_topk: int
    sdpo_teacher: str
    sdpo_ema_rate: float
    sdpo_success_threshold: float
    sdpo_is_clip: float
    sdpo_use_feedback: bool
    pipo: bool
    pipo_window: int
    pipo_lam: float
    pipo_lr: float
    pipo_options: PipoOptions  # the authors' code's behaviours that are on (all off = paper)
    pipo_mu_source: str  # DAPO: "filtered" (mu_t over the trained batch) | "raw" (every sampled group)
    attribution: str
    vpd: VpdConfig | None = None  # when algorithm == "vpd"
    max_bad_steps: int = 8  # optimizer updates with non-finite gradients in a row before the run stops
    generate_rows_per_device: int = 0  # rows one device decodes per generation pass; 0 = all its rows at once

    @property
    def batch(self) -> int:
        """B = P * G sequences per training batch."""
        return self.prompts_per_batch * self.group_size

    @property
    def is_dataset_task(self) -> bool:
        """Prompts from a dataset, rewards verified on the host (`pipo_jax.tasks.dataset`)."""
        return isinstance(self.task, DatasetTask)

    @property
    def teacher_prompt_len(self) -> int:
        """Width of a dataset task's SDPO teacher prompt: the prompt, a sibling's response
        (or feedback) and 128 tokens of template, rounded up to 8."""
        return -(-(self.prompt_len + self.response_len + 128) // 8) * 8

    @property
    def prompt_len(self) -> int:
        return self.task.prompt_len

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    @property
    def has_critic(self) -> bool:
        return self.estimator == "gae"

    @property
    def is_sdpo(self) -> bool:
        """The policy loss is SDPO's distillation (SDPO, and VPD's M-step)."""
        return self.policy_loss.startswith("sdpo")

    @property
    def uses_teacher(self) -> bool:
        """The batch needs feedback-conditioned teacher contexts (SDPO, VPD and its hybrids)."""
        return self.is_sdpo or self.vpd is not None

    @property
    def vpd_hybrid(self) -> str:
        return "none" if self.vpd is None else self.vpd.hybrid

    @property
    def pi_ratio(self) -> str:
        return "sequence" if self.policy_loss == "gspo" else "token"


def _need(cond: bool, key: str, message: str):
    if not cond:
        raise ConfigError(f"config.{key}: {message}")


def _choice(value, key: str, choices):
    _need(value in choices, key, f"{value!r} is not one of {tuple(choices)}")


def make_task(c: ml_collections.ConfigDict) -> arithmetic.ArithmeticTask | DatasetTask:
    """The built-in arithmetic task, or a dataset task (math / code) loaded from `task.path`."""
    tc = c.task
    _choice(tc.name, "task.name", TASKS)
    if tc.name in dataset.KINDS:
        return make_dataset_task(c)
    try:
        return arithmetic.ArithmeticTask(
            min_digits=tc.min_digits, max_digits=tc.max_digits, ops=tuple(tc.ops), answer_format=tc.answer_format,
            reward_mode=tc.reward_mode, feedback_style=tc.feedback_style, heldout_fraction=tc.heldout_fraction,
            split_seed=tc.split_seed,
        )
    except ValueError as e:
        raise ConfigError(f"config.task: {e}") from e


def prompt_config(tc: ml_collections.ConfigDict) -> PromptConfig:
    """The dataset task's `PromptConfig` from `config.task`."""
    _choice(tc.enable_thinking, "task.enable_thinking", ("template", "true", "false"))
    instruction = tc.instruction
    if instruction == "auto":
        instruction = DEFAULT_INSTRUCTION if tc.name == "math" else dataset.CODE_INSTRUCTION
    thinking = None if tc.enable_thinking == "template" else tc.enable_thinking == "true"
    try:
        return PromptConfig(style=tc.prompt_style, instruction=instruction, enable_thinking=thinking,
                            max_prompt_tokens=tc.max_prompt_tokens, overlong=tc.overlong)
    except ValueError as e:
        raise ConfigError(f"config.task: {e}") from e


def dataset_task_settings_missing(c: ml_collections.ConfigDict) -> list[str]:
    """What a dataset task (math / code) needs and `c` lacks, one `--config...` hint each."""
    tc, out = c.task, []
    if not c.model.path:
        out.append("--config.model.path=/path/to/hf_model (a Hugging Face model and its tokenizer)")
    if not tc.path:
        out.append("--config.task.path=FILE (a JSONL / parquet file or tfds name)")
    if c.log.jit_loop:
        out.append("--config.log.jit_loop=false (the reward is computed on the host)")
    if c.rollout.max_new_tokens < 1:
        out.append("--config.rollout.max_new_tokens=N (the response budget; there is no task default)")
    if c.warmup.enabled:
        out.append("--config.warmup.enabled=false (the warm-up trains the built-in task's model)")
    return out


def make_dataset_task(c: ml_collections.ConfigDict) -> DatasetTask:
    """Loads `config.task.path` with the tokenizer of `task.tokenizer_path` (default `model.path`)."""
    tc = c.task
    missing = dataset_task_settings_missing(c)
    if missing:  # every one at once, not one per start
        raise ConfigError(f"config: task.name={tc.name!r} needs " + "; ".join(missing))
    if tc.name == "code":
        try:
            code.check_confinement(code.SandboxConfig(allow_unconfined=bool(tc.sandbox_allow_unconfined)))
        except code.SandboxUnavailable as e:
            raise ConfigError(f"config.task.sandbox_allow_unconfined: {e}") from e
    tok_path = tc.tokenizer_path or c.model.path
    prompts = prompt_config(tc)
    try:
        tokenizer = tok_lib.load_tokenizer(tok_path)
        source = SourceConfig(tc.path, format=tc.format, prompt_field=tc.prompt_field,
                              answer_field=tc.answer_field if tc.name == "math" else None,
                              extra_fields=(tc.tests_field,) if tc.name == "code" else (),
                              split=tc.tfds_split, limit=tc.limit or None)
        examples = load_examples(source)
        return dataset.load_dataset_task(
            tc.name, examples, tokenizer, prompts, stop_token_ids=tok_lib.stop_token_ids(tokenizer, tok_path),
            pad_id=tok_lib.pad_token_id(tokenizer), heldout_fraction=tc.heldout_fraction,
            split_seed=tc.split_seed, tests_field=tc.tests_field)
    except (DataError, FileNotFoundError, ValueError) as e:
        raise ConfigError(f"config.task (path={tc.path!r}, tokenizer={tok_path!r}): {e}") from e


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


def make_model_config(mc: ml_collections.ConfigDict) -> qwen3.Qwen3Config:
    """The model's shapes: the built-in task model, a preset, or the HF directory's config.json."""
    _choice(mc.platform, "model.platform", ("auto", *platforms.PLATFORMS))
    _choice(mc.attention_impl, "model.attention_impl", attention.IMPLS)
    platform = platforms.of_devices(jax.devices()) if mc.platform == "auto" else mc.platform
    overrides = dict(param_dtype=mc.param_dtype, dtype=mc.dtype, remat=mc.remat, platform=platform,
                     attention_impl=mc.attention_impl)
    try:
        if mc.path:
            _need(os.path.isdir(mc.path), "model.path", f"{mc.path!r} is not a directory")
            with open(os.path.join(mc.path, "config.json")) as f:
                return hf.config_from_hf(json.load(f), os.path.join(mc.path, "config.json"), **overrides)
        if mc.preset == "task_tiny":
            return warmup.task_model_config(**overrides)
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
    return max(1, round(c.task.epochs * len(spec.task.train_rows_np) / spec.prompts_per_batch))


def train_spec(c: ml_collections.ConfigDict) -> TrainSpec:
    """Validates `c` and returns its `TrainSpec`; raises `ConfigError` naming the key."""
    _choice(c.algorithm, "algorithm", ALGORITHMS)
    model = make_model_config(c.model)
    task = make_task(c)
    if isinstance(task, DatasetTask):
        vocab = int(max(task.prompt_tokens_np.max(), max(task.stop_token_ids), task.pad_id)) + 1
        _need(vocab <= model.vocab_size, "task.tokenizer_path",
              f"token ids up to {vocab - 1} do not fit the model's vocab_size {model.vocab_size}")
    _need(not c.eval.benchmarks or isinstance(task, DatasetTask) and task.kind == "math", "eval.benchmarks",
          "math benchmarks need a math task's tokenizer and prompts: set task.name=math")
    _need(c.model.param_dtype == "float32", "model.param_dtype",
          f"{c.model.param_dtype!r}: the trainer keeps float32 master weights and AdamW state (bf16 cannot hold "
          "AdamW's b2 = 0.999 or a 1e-6 update); set model.dtype=bfloat16 for bf16 compute")
    _choice(c.model.logprob_impl, "model.logprob_impl", ("auto", "reference", "chunked", "pallas"))

    r = c.rollout
    _need(r.prompts_per_batch >= 1, "rollout.prompts_per_batch", f"{r.prompts_per_batch} must be >= 1")
    _need(r.group_size >= 1, "rollout.group_size", f"{r.group_size} must be >= 1")
    _need(r.max_new_tokens >= 0, "rollout.max_new_tokens", f"{r.max_new_tokens} must be >= 0")
    response_len = r.max_new_tokens or task.answer_len
    _need(response_len >= 1, "rollout.max_new_tokens", f"task.name={c.task.name!r} has no default response "
          "length: set it (>= 1)")
    _need(r.temperature > 0, "rollout.temperature", f"{r.temperature} must be > 0")
    _need(r.top_k >= 0, "rollout.top_k", f"{r.top_k} must be >= 0 (0 = off)")
    _need(0 < r.top_p <= 1, "rollout.top_p", f"{r.top_p} must be in (0, 1]")
    _need(r.generate_rows_per_device >= 0, "rollout.generate_rows_per_device",
          f"{r.generate_rows_per_device} must be >= 0 (0 = all of a device's rows in one pass)")
    _need(task.prompt_len + response_len <= model.max_position_embeddings, "rollout.max_new_tokens",
          f"prompt {task.prompt_len} + response {response_len} exceeds the model's max_position_embeddings "
          f"{model.max_position_embeddings}")

    a = c.advantage
    _choice(a.estimator, "advantage.estimator", tuple(registry.ADVANTAGE_ESTIMATORS) + ("none",))
    if a.estimator in GROUP_ESTIMATORS or c.pipo.attribution == "group":
        _need(r.group_size >= 2, "rollout.group_size",
              f"G={r.group_size} with a group method (advantage.estimator={a.estimator!r}, "
              f"pipo.attribution={c.pipo.attribution!r}) needs G >= 2")
    _choice(a.std_ddof, "advantage.std_ddof", (0, 1))

    t = c.train
    _need(t.mini_batch_prompts >= 1 and r.prompts_per_batch % t.mini_batch_prompts == 0, "train.mini_batch_prompts",
          f"{t.mini_batch_prompts} does not divide rollout.prompts_per_batch={r.prompts_per_batch}")
    mini = t.mini_batch_prompts * r.group_size
    _need("micro_batch_size" not in t, "train.micro_batch_size",
          "the global micro-batch is gone: set train.micro_batch_size_per_device (sequences per device)")
    micro = t.micro_batch_size_per_device
    _need(micro >= 0 and (micro == 0 or mini % micro == 0), "train.micro_batch_size_per_device",
          f"{micro} does not divide the mini-batch of {mini}")
    _need(t.epochs >= 1, "train.epochs", f"{t.epochs} must be >= 1")
    _need(t.lr > 0, "train.lr", f"{t.lr} must be > 0")
    _need(t.weight_decay >= 0, "train.weight_decay", f"{t.weight_decay} must be >= 0")
    _need(c.critic.lr > 0, "critic.lr", f"{c.critic.lr} must be > 0")
    _need(t.grad_clip > 0, "train.grad_clip", f"{t.grad_clip} must be > 0")
    _need(t.max_bad_steps >= 1, "train.max_bad_steps", f"{t.max_bad_steps} must be >= 1")

    lo = c.loss
    _choice(lo.policy, "loss.policy", tuple(registry.POLICY_LOSSES))
    _choice(lo.agg_mode, "loss.agg_mode", AGG_MODES)
    _choice(lo.kl_estimator, "loss.kl_estimator", tuple(registry.KL_ESTIMATORS))
    _need(0 <= lo.clip_low < 1, "loss.clip_low", f"{lo.clip_low} must be in [0, 1)")
    _need(lo.clip_high >= 0, "loss.clip_high", f"{lo.clip_high} must be >= 0")
    _need(lo.clip_ratio_c == 0 or lo.clip_ratio_c > 1, "loss.clip_ratio_c", f"{lo.clip_ratio_c} must be 0 or > 1")
    _need(not (lo.policy == "gspo" and lo.clip_ratio_c), "loss.clip_ratio_c", "GSPO has no dual clip: set it to 0")
    _need(lo.kl_coef >= 0, "loss.kl_coef", f"{lo.kl_coef} must be >= 0")
    is_sdpo = lo.policy.startswith("sdpo")
    vpd = None
    if c.algorithm == "vpd":
        vpd = VpdConfig.from_config(c.vpd)
    hybrid = "none" if vpd is None else vpd.hybrid
    distills = c.algorithm == "sdpo" or (c.algorithm == "vpd" and hybrid == "none")
    _need(is_sdpo == distills, "loss.policy",
          f"{lo.policy!r} does not fit algorithm={c.algorithm!r}" + (f" with vpd.hybrid={hybrid!r}" if vpd else "")
          + " (sdpo_* losses are SDPO's and VPD's M-step; the GRPO+SDPO hybrids use token_clip)")
    _need((a.estimator == "gae") == (c.algorithm == "ppo"), "advantage.estimator",
          f"{a.estimator!r} does not fit algorithm={c.algorithm!r} (PPO uses 'gae' with its critic)")
    _need(not is_sdpo or a.estimator == "none", "advantage.estimator", "SDPO uses no advantage estimator: 'none'")
    _need(is_sdpo or a.estimator != "none", "advantage.estimator", f"algorithm={c.algorithm!r} needs an estimator")
    if vpd is not None:
        _need(not (vpd.e_step and c.sdpo.teacher == "live"), "sdpo.teacher",
              "'live' shares the student's params, but VPD's E-step trains its own teacher copy: use 'ema'")

    d = c.dapo
    gen_prompts = d.gen_prompts_per_batch or r.prompts_per_batch
    if d.dynamic_sampling:
        _need(r.group_size >= 2, "dapo.dynamic_sampling", "filters groups by reward variance: needs G >= 2")
        _need(d.max_num_gen_batches >= 1, "dapo.max_num_gen_batches", f"{d.max_num_gen_batches} must be >= 1")
    _need(d.overlong_buffer >= 0 and d.overlong_buffer <= response_len, "dapo.overlong_buffer",
          f"{d.overlong_buffer} must be in [0, max_new_tokens={response_len}]")

    s = c.sdpo
    _choice(s.teacher, "sdpo.teacher", ("ema", "live"))
    _need(0 <= s.alpha <= 1, "sdpo.alpha", f"{s.alpha} must be in [0, 1]")
    _need(0 <= s.ema_rate <= 1, "sdpo.ema_rate", f"{s.ema_rate} must be in [0, 1]")
    _need(1 <= s.topk, "sdpo.topk", f"{s.topk} must be >= 1")
    if is_sdpo or vpd is not None:
        _need(r.group_size >= 2 or s.use_feedback, "sdpo.use_feedback",
              "with G = 1 there are no sibling solutions: enable feedback")

    p = c.pipo
    _need(p.window >= 2, "pipo.window", f"K={p.window} must be >= 2 (the window std needs two means)")
    _need(0 <= p.lam <= 1, "pipo.lam", f"{p.lam} must be in [0, 1]")
    _need(p.lr > 0, "pipo.lr", f"{p.lr} must be > 0")
    _choice(p.mu_source, "pipo.mu_source", ("filtered", "raw"))
    authors = dict(p.authors.items()) if "authors" in p else {}
    for name in authors:
        _need(name in AUTHORS_BEHAVIOURS, f"pipo.authors.{name}",
              f"unknown behaviour; expected one of {AUTHORS_BEHAVIOURS}")
    options = pipo_options(bool(p.compat), **authors)
    _choice(p.attribution, "pipo.attribution", tuple(registry.ATTRIBUTIONS))
    expected_attr = {"ppo": "gae", "sdpo": "sdpo_token"}.get(c.algorithm, "group")
    if c.algorithm == "vpd":
        expected_attr = "sdpo_token" if hybrid == "none" else "group"
    _need(p.attribution == expected_attr, "pipo.attribution",
          f"{p.attribution!r} does not fit algorithm={c.algorithm!r} (expected {expected_attr!r})")

    _need(c.iterations >= 1, "iterations", f"{c.iterations} must be >= 1")
    _need(c.task.epochs >= 0, "task.epochs", f"{c.task.epochs} must be >= 0")
    _need(not c.task.epochs or isinstance(task, DatasetTask), "task.epochs",
          "counts passes over a dataset task's training rows; the built-in task uses `iterations`")
    _need(c.log.every >= 1, "log.every", f"{c.log.every} must be >= 1")
    _need(c.checkpoint.every >= 0, "checkpoint.every", f"{c.checkpoint.every} must be >= 0")
    _need(c.checkpoint.keep >= 1, "checkpoint.keep", f"{c.checkpoint.keep} must be >= 1")
    _need(c.eval.every >= 0, "eval.every", f"{c.eval.every} must be >= 0")
    _need(c.eval.n >= 1, "eval.n", f"{c.eval.n} must be >= 1")
    if c.eval.benchmarks:
        eval_benchmarks(c.eval)  # raises naming the key
    if c.warmup.enabled:
        _need(not c.model.path, "warmup.enabled", "the supervised warm-up trains a fresh task model; "
              "disable it when loading model.path")
        _need(c.warmup.steps >= 1, "warmup.steps", f"{c.warmup.steps} must be >= 1")
        _need(c.warmup.lr > 0, "warmup.lr", f"{c.warmup.lr} must be > 0")
        for key in ("mistake_rate", "context_fraction"):
            _need(0.0 <= c.warmup[key] <= 1.0, f"warmup.{key}", f"{c.warmup[key]} must be in [0, 1]")

    return TrainSpec(
        algorithm=c.algorithm, model=model, model_path=c.model.path, logprob_impl=c.model.logprob_impl, task=task,
        prompts_per_batch=r.prompts_per_batch, group_size=r.group_size, response_len=response_len,
        temperature=float(r.temperature), top_k=int(r.top_k), top_p=float(r.top_p),
        lr=float(t.lr), weight_decay=float(t.weight_decay), adam_b1=float(t.adam_b1), adam_b2=float(t.adam_b2),
        grad_clip=float(t.grad_clip), mini_batch=mini, micro_batch_per_device=micro, epochs=int(t.epochs),
        shuffle=bool(t.shuffle), estimator=a.estimator, std_ddof=int(a.std_ddof), norm_by_std=bool(a.norm_by_std),
        gamma=float(a.gamma), gae_lam=float(a.lam), policy_loss=lo.policy, clip_low=float(lo.clip_low),
        clip_high=float(lo.clip_high), clip_ratio_c=float(lo.clip_ratio_c), agg_mode=lo.agg_mode,
        kl_coef=float(lo.kl_coef), kl_estimator=lo.kl_estimator, kl_in_reward=bool(lo.kl_in_reward),
        entropy_coef=float(lo.entropy_coef), critic_lr=float(c.critic.lr),
        cliprange_value=float(c.critic.cliprange_value), dynamic_sampling=bool(d.dynamic_sampling),
        gen_prompts=int(gen_prompts), max_num_gen_batches=int(d.max_num_gen_batches),
        overlong_buffer=int(d.overlong_buffer), overlong_factor=float(d.overlong_factor),
        sdpo_alpha=float(s.alpha), sdpo_topk=int(s.topk), sdpo_teacher=s.teacher, sdpo_ema_rate=float(s.ema_rate),
        sdpo_success_threshold=float(s.success_threshold), sdpo_is_clip=float(s.is_clip),
        sdpo_use_feedback=bool(s.use_feedback), pipo=bool(p.enabled), pipo_window=int(p.window),
        pipo_lam=float(p.lam), pipo_lr=float(p.lr), pipo_options=options, pipo_mu_source=p.mu_source,
        attribution=p.attribution,
        vpd=vpd, max_bad_steps=int(t.max_bad_steps), generate_rows_per_device=int(r.generate_rows_per_device),
    )
