"""The run config's sections as frozen, self-validating, hashable (jit-static) records.

Each section checks its own values in `__post_init__` and raises `ConfigError` naming the
key as `config.<section>.<field>`; `from_config(section, ...)` reads its ml-collections
section (keys it does not use are left to the other readers). Nothing here does I/O:
what depends on files (the model's shapes, a dataset) is loaded first and passed in.
Checks that tie two sections together (a loss that fits the algorithm, a mini-batch that
divides the batch) live in `rl/spec.py:TrainSpec`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from pipo_jax.losses import vpd as vpd_loss
from pipo_jax.losses.aggregation import AGG_MODES
from pipo_jax.losses.kl import KL_ESTIMATORS
from pipo_jax.losses.pipo import ATTRIBUTION_NORMS, AUTHORS_BEHAVIOURS, PipoOptions, pipo_options
from pipo_jax.sampling.generator import ENGINES


class ConfigError(ValueError):
    """An invalid run config; the message names the key."""


def need(cond: bool, key: str, message: str) -> None:
    """Raises `ConfigError("config.<key>: <message>")` unless `cond`."""
    if not cond:
        raise ConfigError(f"config.{key}: {message}")


def choice(value, key: str, choices) -> None:
    need(value in choices, key, f"{value!r} is not one of {tuple(choices)}")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """config.rollout. Sizes in prompts / sequences / tokens."""

    prompts_per_batch: int = 16  # P prompts per training batch
    group_size: int = 8  # G responses per prompt
    response_len: int = 1  # R: max new tokens (`max_new_tokens`, or the task's answer length when 0)
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    generate_rows_per_device: int = 0  # rows one device decodes per generation pass; 0 = all at once
    engine: str = "sampler"  # the rollout interface's implementation (sampling/generator.py): sampler | slots
    engine_slots: int = 0  # slots engine: concurrent decode slots (0 = one per row)

    def __post_init__(self):
        key = "rollout."
        choice(self.engine, key + "engine", ENGINES)
        need(_is_int(self.engine_slots) and self.engine_slots >= 0, key + "engine_slots",
             f"{self.engine_slots} must be >= 0 (0 = one slot per row)")
        need(self.engine == "slots" or not self.engine_slots, key + "engine_slots",
             f"{self.engine_slots} slots are for rollout.engine=slots, not {self.engine!r}")
        need(self.engine == "sampler" or not self.generate_rows_per_device, key + "generate_rows_per_device",
             "generation passes are the one-jit sampler's (rollout.engine=sampler); the slots engine bounds its "
             "memory with rollout.engine_slots")
        need(_is_int(self.prompts_per_batch) and self.prompts_per_batch >= 1, key + "prompts_per_batch",
             f"{self.prompts_per_batch} must be >= 1")
        need(_is_int(self.group_size) and self.group_size >= 1, key + "group_size", f"{self.group_size} must be >= 1")
        need(_is_int(self.response_len) and self.response_len >= 1, key + "max_new_tokens",
             f"{self.response_len} must be >= 1")
        need(_is_number(self.temperature) and self.temperature > 0, key + "temperature",
             f"{self.temperature} must be > 0")
        need(_is_int(self.top_k) and self.top_k >= 0, key + "top_k", f"{self.top_k} must be >= 0 (0 = off)")
        need(_is_number(self.top_p) and 0 < self.top_p <= 1, key + "top_p", f"{self.top_p} must be in (0, 1]")
        need(_is_int(self.generate_rows_per_device) and self.generate_rows_per_device >= 0,
             key + "generate_rows_per_device",
             f"{self.generate_rows_per_device} must be >= 0 (0 = all of a device's rows in one pass)")

    @property
    def batch(self) -> int:
        """B = P * G sequences per training batch."""
        return self.prompts_per_batch * self.group_size

    @classmethod
    def from_config(cls, r: Mapping, default_response_len: int) -> RolloutConfig:
        """`default_response_len`: the task's answer length, used when `max_new_tokens` is 0."""
        need(r["max_new_tokens"] >= 0, "rollout.max_new_tokens", f"{r['max_new_tokens']} must be >= 0")
        response_len = r["max_new_tokens"] or default_response_len
        need(response_len >= 1, "rollout.max_new_tokens", "the task has no default response length: set it (>= 1)")
        return cls(prompts_per_batch=r["prompts_per_batch"], group_size=r["group_size"], response_len=response_len,
                   temperature=float(r["temperature"]), top_k=r["top_k"], top_p=float(r["top_p"]),
                   generate_rows_per_device=r["generate_rows_per_device"], engine=r["engine"],
                   engine_slots=r["engine_slots"])


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """config.train: the optimizer and the mini-batch x epoch schedule (sizes in sequences)."""

    mini_batch: int  # sequences per optimizer step (`mini_batch_prompts` x G)
    micro_batch_per_device: int = 0  # sequences per device per accumulation step; 0 = its mini-batch share
    epochs: int = 1
    shuffle: bool = True
    lr: float = 1e-6
    weight_decay: float = 0.01
    adam_b1: float = 0.9
    adam_b2: float = 0.999
    grad_clip: float = 1.0
    max_bad_steps: int = 8  # updates with non-finite gradients in a row before the run stops

    def __post_init__(self):
        key = "train."
        need(_is_int(self.mini_batch) and self.mini_batch >= 1, key + "mini_batch_prompts",
             f"a mini-batch of {self.mini_batch} sequences must be >= 1")
        micro = self.micro_batch_per_device
        need(_is_int(micro) and micro >= 0 and (micro == 0 or self.mini_batch % micro == 0),
             key + "micro_batch_size_per_device", f"{micro} does not divide the mini-batch of {self.mini_batch}")
        need(_is_int(self.epochs) and self.epochs >= 1, key + "epochs", f"{self.epochs} must be >= 1")
        need(isinstance(self.shuffle, bool), key + "shuffle", f"{self.shuffle!r} must be True or False")
        need(_is_number(self.lr) and self.lr > 0, key + "lr", f"{self.lr} must be > 0")
        need(_is_number(self.weight_decay) and self.weight_decay >= 0, key + "weight_decay",
             f"{self.weight_decay} must be >= 0")
        for name in ("adam_b1", "adam_b2"):
            value = getattr(self, name)
            need(_is_number(value) and 0 <= value < 1, key + name, f"{value} must be in [0, 1)")
        need(_is_number(self.grad_clip) and self.grad_clip > 0, key + "grad_clip", f"{self.grad_clip} must be > 0")
        need(_is_int(self.max_bad_steps) and self.max_bad_steps >= 1, key + "max_bad_steps",
             f"{self.max_bad_steps} must be >= 1")

    @classmethod
    def from_config(cls, t: Mapping, rollout: RolloutConfig) -> TrainConfig:
        need("micro_batch_size" not in t, "train.micro_batch_size",
             "the global micro-batch is gone: set train.micro_batch_size_per_device (sequences per device)")
        mini_prompts = t["mini_batch_prompts"]
        need(mini_prompts >= 1 and rollout.prompts_per_batch % mini_prompts == 0, "train.mini_batch_prompts",
             f"{mini_prompts} does not divide rollout.prompts_per_batch={rollout.prompts_per_batch}")
        return cls(mini_batch=mini_prompts * rollout.group_size, micro_batch_per_device=t["micro_batch_size_per_device"],
                   epochs=t["epochs"], shuffle=bool(t["shuffle"]), lr=float(t["lr"]),
                   weight_decay=float(t["weight_decay"]), adam_b1=float(t["adam_b1"]), adam_b2=float(t["adam_b2"]),
                   grad_clip=float(t["grad_clip"]), max_bad_steps=t["max_bad_steps"])


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    """config.advantage: the estimator's name (`rl/algorithms.py:ADVANTAGE_ESTIMATORS`, or "none")
    and its settings."""

    estimator: str = "grpo"
    std_ddof: int = 0  # group std: 0 (population) or 1 (torch.std)
    norm_by_std: bool = True  # False: Dr. GRPO's mean-only baseline
    gamma: float = 1.0  # GAE discount
    lam: float = 1.0  # GAE lambda

    def __post_init__(self):
        choice(self.std_ddof, "advantage.std_ddof", (0, 1))
        need(_is_number(self.gamma) and 0 <= self.gamma <= 1, "advantage.gamma", f"{self.gamma} must be in [0, 1]")
        need(_is_number(self.lam) and 0 <= self.lam <= 1, "advantage.lam", f"{self.lam} must be in [0, 1]")

    @classmethod
    def from_config(cls, a: Mapping) -> AdvantageConfig:
        return cls(estimator=a["estimator"], std_ddof=a["std_ddof"], norm_by_std=bool(a["norm_by_std"]),
                   gamma=float(a["gamma"]), lam=float(a["lam"]))


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """config.loss: the policy loss's name (`rl/algorithms.py:POLICY_LOSSES`), clipping,
    aggregation and the regularisers."""

    policy: str = "token_clip"
    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_ratio_c: float = 3.0  # dual clip; 0 = off
    agg_mode: str = "seq-mean-token-mean"
    kl_coef: float = 0.001
    kl_estimator: str = "k3"
    kl_in_reward: bool = False  # the KL as a k1 penalty in the token rewards instead of a loss term
    entropy_coef: float = 0.0

    def __post_init__(self):
        key = "loss."
        choice(self.agg_mode, key + "agg_mode", AGG_MODES)
        choice(self.kl_estimator, key + "kl_estimator", tuple(KL_ESTIMATORS))
        need(_is_number(self.clip_low) and 0 <= self.clip_low < 1, key + "clip_low",
             f"{self.clip_low} must be in [0, 1)")
        need(_is_number(self.clip_high) and self.clip_high >= 0, key + "clip_high", f"{self.clip_high} must be >= 0")
        need(_is_number(self.clip_ratio_c) and (self.clip_ratio_c == 0 or self.clip_ratio_c > 1), key + "clip_ratio_c",
             f"{self.clip_ratio_c} must be 0 or > 1")
        need(_is_number(self.kl_coef) and self.kl_coef >= 0, key + "kl_coef", f"{self.kl_coef} must be >= 0")
        need(_is_number(self.entropy_coef) and self.entropy_coef >= 0, key + "entropy_coef",
             f"{self.entropy_coef} must be >= 0")

    @classmethod
    def from_config(cls, lo: Mapping) -> LossConfig:
        return cls(policy=lo["policy"], clip_low=float(lo["clip_low"]), clip_high=float(lo["clip_high"]),
                   clip_ratio_c=float(lo["clip_ratio_c"]), agg_mode=lo["agg_mode"], kl_coef=float(lo["kl_coef"]),
                   kl_estimator=lo["kl_estimator"], kl_in_reward=bool(lo["kl_in_reward"]),
                   entropy_coef=float(lo["entropy_coef"]))


@dataclasses.dataclass(frozen=True)
class CriticConfig:
    """config.critic: PPO's value model."""

    lr: float = 1e-5
    cliprange_value: float = 0.5

    def __post_init__(self):
        need(_is_number(self.lr) and self.lr > 0, "critic.lr", f"{self.lr} must be > 0")
        need(_is_number(self.cliprange_value) and self.cliprange_value > 0, "critic.cliprange_value",
             f"{self.cliprange_value} must be > 0")

    @classmethod
    def from_config(cls, c: Mapping) -> CriticConfig:
        return cls(lr=float(c["lr"]), cliprange_value=float(c["cliprange_value"]))


@dataclasses.dataclass(frozen=True)
class DapoConfig:
    """config.dapo: dynamic sampling (refill with groups whose rewards differ) and overlong shaping."""

    dynamic_sampling: bool = False
    gen_prompts_per_batch: int = 1  # prompts per generation batch (`gen_prompts_per_batch`, or P when 0)
    max_num_gen_batches: int = 10
    overlong_buffer: int = 0  # tokens; 0 = overlong shaping off
    overlong_factor: float = 1.0

    def __post_init__(self):
        need(_is_int(self.gen_prompts_per_batch) and self.gen_prompts_per_batch >= 1, "dapo.gen_prompts_per_batch",
             f"{self.gen_prompts_per_batch} must be >= 0 (0 = rollout.prompts_per_batch)")
        need(_is_int(self.max_num_gen_batches) and self.max_num_gen_batches >= 1, "dapo.max_num_gen_batches",
             f"{self.max_num_gen_batches} must be >= 1")
        need(_is_int(self.overlong_buffer) and self.overlong_buffer >= 0, "dapo.overlong_buffer",
             f"{self.overlong_buffer} must be >= 0")
        need(_is_number(self.overlong_factor) and self.overlong_factor >= 0, "dapo.overlong_factor",
             f"{self.overlong_factor} must be >= 0")

    @classmethod
    def from_config(cls, d: Mapping, rollout: RolloutConfig) -> DapoConfig:
        if d["dynamic_sampling"]:
            need(rollout.group_size >= 2, "dapo.dynamic_sampling", "filters groups by reward variance: needs G >= 2")
        need(d["overlong_buffer"] <= rollout.response_len, "dapo.overlong_buffer",
             f"{d['overlong_buffer']} must be in [0, max_new_tokens={rollout.response_len}]")
        return cls(dynamic_sampling=bool(d["dynamic_sampling"]),
                   gen_prompts_per_batch=d["gen_prompts_per_batch"] or rollout.prompts_per_batch,
                   max_num_gen_batches=d["max_num_gen_batches"], overlong_buffer=d["overlong_buffer"],
                   overlong_factor=float(d["overlong_factor"]))


SDPO_TEACHERS = ("ema", "live")


@dataclasses.dataclass(frozen=True)
class SdpoConfig:
    """config.sdpo: the feedback-conditioned teacher (SDPO, VPD and its hybrids)."""

    alpha: float = 0.5  # JSD mixture weight
    topk: int = 100  # JSD: the student's top-k tokens (+ tail)
    teacher: str = "ema"  # ema (its own EMA copy) | live (the student's params)
    ema_rate: float = 0.05
    success_threshold: float = 1.0  # a sibling with reward >= this is a demonstration
    is_clip: float = 2.0  # importance-weight clip of the distillation loss
    use_feedback: bool = True  # environment feedback when no sibling succeeded

    def __post_init__(self):
        choice(self.teacher, "sdpo.teacher", SDPO_TEACHERS)
        need(_is_number(self.alpha) and 0 <= self.alpha <= 1, "sdpo.alpha", f"{self.alpha} must be in [0, 1]")
        need(_is_number(self.ema_rate) and 0 <= self.ema_rate <= 1, "sdpo.ema_rate",
             f"{self.ema_rate} must be in [0, 1]")
        need(_is_int(self.topk) and self.topk >= 1, "sdpo.topk", f"{self.topk} must be >= 1")
        need(_is_number(self.success_threshold), "sdpo.success_threshold",
             f"{self.success_threshold!r} must be a finite number")
        need(_is_number(self.is_clip) and self.is_clip > 0, "sdpo.is_clip", f"{self.is_clip} must be > 0")

    @classmethod
    def from_config(cls, s: Mapping) -> SdpoConfig:
        return cls(alpha=float(s["alpha"]), topk=s["topk"], teacher=s["teacher"], ema_rate=float(s["ema_rate"]),
                   success_threshold=float(s["success_threshold"]), is_clip=float(s["is_clip"]),
                   use_feedback=bool(s["use_feedback"]))


MU_SOURCES = ("filtered", "raw")
PI_OPTIMIZERS = ("shared", "separate")
PI_RATIOS = ("base", "token")
PI_DENOMINATORS = ("all_tokens", "signal_tokens")


def _optional_float(value):
    return None if value is None else (float(value) if _is_number(value) else value)


@dataclasses.dataclass(frozen=True)
class PipoConfig:
    """config.pipo: the controller (SPEC 1) and its PI step."""

    enabled: bool = False
    window: int = 8  # K
    lam: float = 0.1
    lr: float = 1e-6  # alpha_PI
    options: PipoOptions = PipoOptions()  # the authors' code's behaviours that are on (all off = paper)
    mu_source: str = "filtered"  # DAPO: mu_t over the trained batch | "raw": every sampled group
    attribution: str = "group"  # `rl/algorithms.py:ATTRIBUTIONS` name
    # Settings beside the paper's recipe (README "Why PIPO lowers SDPO and GSPO here"); the
    # defaults are the paper's.
    attribution_norm: str = "none"  # none | mean_abs: a / mean |a| over the rows with a signal
    pi_optimizer: str = "shared"  # shared (SPEC 2: one AdamW state) | separate (the PI step's own)
    pi_ratio: str = "base"  # base: the base loss's ratio (GSPO: sequence) | token
    pi_clip_low: float | None = None  # the PI step's eps_low; None = loss.clip_ratio_low
    pi_clip_high: float | None = None  # the PI step's eps_high; None = loss.clip_ratio_high
    sdpo_pi_denominator: str = "all_tokens"  # all_tokens (Eq. 11: 1/N over B_{t-1}) | signal_tokens

    def __post_init__(self):
        need(_is_int(self.window) and self.window >= 2, "pipo.window",
             f"K={self.window} must be >= 2 (the window std needs two means)")
        need(_is_number(self.lam) and 0 <= self.lam <= 1, "pipo.lam", f"{self.lam} must be in [0, 1]")
        need(_is_number(self.lr) and self.lr > 0, "pipo.lr", f"{self.lr} must be > 0")
        choice(self.mu_source, "pipo.mu_source", MU_SOURCES)
        choice(self.attribution_norm, "pipo.attribution_norm", ATTRIBUTION_NORMS)
        choice(self.pi_optimizer, "pipo.pi_optimizer", PI_OPTIMIZERS)
        choice(self.pi_ratio, "pipo.pi_ratio", PI_RATIOS)
        choice(self.sdpo_pi_denominator, "pipo.sdpo_pi_denominator", PI_DENOMINATORS)
        for key in ("pi_clip_low", "pi_clip_high"):
            value = getattr(self, key)
            need(value is None or (_is_number(value) and 0 < value), f"pipo.{key}",
                 f"{value!r} must be None (the base loss's clip) or > 0")

    @classmethod
    def from_config(cls, p: Mapping) -> PipoConfig:
        authors = dict(p["authors"].items()) if "authors" in p else {}
        for name in authors:
            need(name in AUTHORS_BEHAVIOURS, f"pipo.authors.{name}",
                 f"unknown behaviour; expected one of {AUTHORS_BEHAVIOURS}")
        return cls(enabled=bool(p["enabled"]), window=p["window"], lam=float(p["lam"]), lr=float(p["lr"]),
                   options=pipo_options(bool(p["compat"]), **authors), mu_source=p["mu_source"],
                   attribution=p["attribution"], attribution_norm=p.get("attribution_norm", "none"),
                   pi_optimizer=p.get("pi_optimizer", "shared"), pi_ratio=p.get("pi_ratio", "base"),
                   pi_clip_low=_optional_float(p.get("pi_clip_low")),
                   pi_clip_high=_optional_float(p.get("pi_clip_high")),
                   sdpo_pi_denominator=p.get("sdpo_pi_denominator", "all_tokens"))


VPD_REFERENCES = ("dynamic", "fixed")
VPD_HYBRIDS = ("none", "joint", "reshape")


@dataclasses.dataclass(frozen=True)
class VpdConfig:
    """config.vpd (algorithm = vpd).

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
        def number(field):
            value = getattr(self, field)
            need(_is_number(value), f"vpd.{field}", f"{value!r} must be a finite number")
            return value

        need(number("beta") > 0, "vpd.beta", f"{self.beta} must be > 0")
        need(_is_int(self.every) and self.every >= 1, "vpd.every", f"{self.every!r} must be an integer >= 1")
        need(number("lr") > 0, "vpd.lr", f"{self.lr} must be > 0")
        need(isinstance(self.e_step, bool), "vpd.e_step", f"{self.e_step!r} must be True or False")
        choice(self.reference, "vpd.reference", VPD_REFERENCES)
        choice(self.delta_mode, "vpd.delta_mode", vpd_loss.DELTA_MODES)
        need(0 < number("delta_ema_rate") <= 1, "vpd.delta_ema_rate", f"{self.delta_ema_rate} must be in (0, 1]")
        choice(self.seq_logprob, "vpd.seq_logprob", vpd_loss.SEQ_LOGPROB_MODES)
        choice(self.hybrid, "vpd.hybrid", VPD_HYBRIDS)
        need(number("hybrid_weight") >= 0, "vpd.hybrid_weight", f"{self.hybrid_weight} must be >= 0")

    @classmethod
    def from_config(cls, section: Mapping) -> VpdConfig:
        """From a `config.vpd` section (or dict); missing keys keep their defaults."""
        items = dict(section.items())
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(items) - fields)
        need(not unknown, f"vpd.{unknown[0] if unknown else ''}", f"unknown key; valid keys are {sorted(fields)}")
        return cls(**items)
