"""The run config's sections: every run-level key declared once, as a field of its section.

Each section is a frozen, hashable (jit-static) dataclass whose fields are its config keys,
declared with `key(default, description, check, choices=)` (`config/schema.py`): the annotation is
the key's type, the default its only default (`configs/base.py:base_config` is
`schema.defaults(RunConfig)`), the description what `--check_config` prints, the constraint
checked on construction with a one-line `ConfigError("config.<section>.<key>: ...")`. Choices
that are registered names (algorithms, estimators, losses, attributions, engines, kernels) are
the learner's registries' (`choices=registered(kind)`, `config/registry.py`), checked when the
config is validated; a method's or task's own keys are its settings section, declared beside its
code and registered under `config.loss`, `config.advantage` or `config.task`. A section's `check()`
ties its own keys together; checks across sections live in `rl/spec.py:TrainSpec`, checks that
need the task in `rl/spec.py:check_run_config`. Imports no learner module; no I/O.
"""

from __future__ import annotations

import dataclasses

from pipo_jax import platforms
from pipo_jax.config.registry import registered
from pipo_jax.config.schema import ConfigError, Section, above, at_least, choice, key, need, within

__all__ = ["ConfigError", "need", "choice", "RunConfig"]


LOGPROB_IMPLS = ("auto", "reference", "chunked", "pallas")
DECODE_WEIGHTS = ("auto", "sharded", "gathered")  # rollout.decode_weights: rl/rollout.py:decode_weights
REMAT_POLICIES = ("none", "full", "dots_saveable")


def _float32_masters(value):
    if value == "float32":
        return None
    return (f"{value!r}: the trainer keeps float32 master weights and AdamW state (bf16 cannot hold AdamW's "
            "b2 = 0.999 or a 1e-6 update); set model.dtype=bfloat16 for bf16 compute")


@dataclasses.dataclass(frozen=True)
class ModelConfig(Section):
    """config.model: the policy model's shapes, weights, dtypes and kernels."""

    _section = "model"
    preset: str = key("task_tiny", "`task_tiny` (the built-in task's model, 2 layers), `task_micro` (1 layer, the "
                      "tests' micro preset) or a qwen3 preset name (needs model.path)")
    path: str = key("", "Hugging Face directory (config.json + safetensors); \"\" = random init")
    param_dtype: str = key("float32", "master weights and AdamW state; the trainer requires float32",
                           _float32_masters)
    dtype: str = key("float32", "matmul / activation dtype (bfloat16: mixed precision, cast inside the model)")
    remat: str = key("none", "rematerialisation of each layer", choices=REMAT_POLICIES)
    logprob_impl: str = key("auto", "fused log-prob kernel", choices=LOGPROB_IMPLS)
    platform: str = key("auto", "the platform the programs are built for (auto: this run's devices); it picks the "
                        "attention kernel, the log-prob kernel's block sizes and Pallas mode",
                        choices=("auto",) + platforms.PLATFORMS)
    attention_impl: str = key("auto", "attention kernel (auto: by platform)", choices=registered("attention_impl"))
    layer_loop: str = key("auto", "the layer loop: auto (unroll on cpu, scan on cuda / tpu; by model.platform, never "
                          "the host), scan (one lax.scan over the stacked layers) or unroll; the same function",
                          choices=registered("layer_loop"))
    dense_form: str = key("auto", "the dense layers: auto (flat on cpu, batched on cuda / tpu; by model.platform), "
                          "flat (2-D matmuls over the flattened tokens) or batched (einsums over [B, T, ...]); "
                          "the same function", choices=registered("dense_form"))


@dataclasses.dataclass(frozen=True)
class TaskConfig(Section):
    """config.task: the task (`run/task_config.py:make_task` builds the registered task from it): the keys
    every task reads, and one section of its own keys per registered task (`config.task.<section>.<key>`,
    declared beside the task's code and registered by `tasks/registry.py`)."""

    _section = "task"
    name: str = key("arithmetic", "the task, a name registered in tasks/registry.py:TASKS (e.g. arithmetic: the "
                    "built-in JAX-reward task; math / code: dataset tasks, host reward)", choices=registered("task"))
    heldout_fraction: float = key(0.1, "rows / problems never trained on, for the held-out accuracy",
                                  within(0, 1, open_high=True))
    epochs: float = key(0.0, "> 0 sets `iterations` to round(epochs * train rows / prompts_per_batch) (prompts "
                        "are drawn with replacement: an epoch is a budget of prompts)", at_least(0))
    split_seed: int = key(0, "seed of the train / held-out split")


@dataclasses.dataclass(frozen=True)
class RolloutConfig(Section):
    """config.rollout. Sizes in prompts / sequences / tokens. In a `TrainSpec`, `max_new_tokens`
    is resolved (the task's answer length when the config says 0)."""

    _section = "rollout"
    prompts_per_batch: int = key(16, "P prompts per iteration (the train batch, in prompts)", at_least(1))
    group_size: int = key(8, "G responses per prompt", at_least(1))
    max_new_tokens: int = key(0, "R: the longest response in tokens; 0 = the task's answer length", at_least(0))
    temperature: float = key(1.0, "sampling temperature", above(0))
    top_k: int = key(0, "top-k sampling; 0 = off", at_least(0, " (0 = off)"))
    top_p: float = key(1.0, "nucleus sampling", within(0, 1, open_low=True))
    generate_rows_per_device: int = key(
        0, "rows one device decodes per generation pass (lax.map over passes): the KV cache then holds this many "
        "rows; 0 = one pass", at_least(0, " (0 = all of a device's rows in one pass)"))
    decode_weights: str = key(
        "sharded", "the policy's weights in a generate call on a mesh: sharded (as trained: the decode loop gathers "
        "each layer's fsdp shards at every step) | gathered (gathered over fsdp once per call, in the compute dtype, "
        "still split over tensor: the whole model per fsdp group in device memory, no weight traffic per step) | "
        "auto (the target platform's choice, model.platform: gathered on tpu, sharded elsewhere; docs/scaling.md)",
        choices=DECODE_WEIGHTS)
    engine: str = key("sampler", "the rollout interface's implementation (sampling/generator.py): sampler (one jit, "
                      "inside the jitted iteration, any mesh) | slots (the slot engine, continuous batching, driven "
                      "from the host: log.jit_loop=false, one device)", choices=registered("engine"))
    engine_slots: int = key(0, "slots engine: concurrent decode slots (0 = one per row)",
                            at_least(0, " (0 = one slot per row)"))
    engine_steps: int = key(1, "slots engine: decode steps per device call (> 1: fewer host round trips; a slot "
                            "whose request ends inside a call idles for the rest of it)", at_least(1))

    def check(self):
        need(self.engine == "slots" or not self.engine_slots, "rollout.engine_slots",
             f"{self.engine_slots} slots are for rollout.engine=slots, not {self.engine!r}")
        need(self.engine == "slots" or self.engine_steps == 1, "rollout.engine_steps",
             f"{self.engine_steps} steps per call are for rollout.engine=slots, not {self.engine!r}")
        need(self.engine == "sampler" or not self.generate_rows_per_device, "rollout.generate_rows_per_device",
             "generation passes are the one-jit sampler's (rollout.engine=sampler); the slots engine bounds its "
             "memory with rollout.engine_slots")

    @property
    def batch(self) -> int:
        """B = P * G sequences per training batch."""
        return self.prompts_per_batch * self.group_size


@dataclasses.dataclass(frozen=True)
class TrainConfig(Section):
    """config.train: the optimizer and the mini-batch x epoch schedule."""

    _section = "train"
    lr: float = key(1e-6, "the base step's learning rate", above(0))
    weight_decay: float = key(0.01, "AdamW weight decay", at_least(0))
    adam_b1: float = key(0.9, "AdamW b1", within(0, 1, open_high=True))
    adam_b2: float = key(0.999, "AdamW b2", within(0, 1, open_high=True))
    grad_clip: float = key(1.0, "global gradient-norm clip", above(0))
    max_bad_steps: int = key(8, "updates with NaN / inf gradients are skipped and counted; this many in a row (base "
                             "and PI steps alike) stop the run", at_least(1))
    mini_batch_prompts: int = key(8, "prompts per optimizer step (paper: 64 of 128); divides "
                                  "rollout.prompts_per_batch", at_least(1))
    micro_batch_size_per_device: int = key(
        0, "sequences each device computes per gradient-accumulation step (verl's *_micro_batch_size_per_gpu), also "
        "the chunk of the no-gradient passes; 0 = the device's share of the mini-batch", at_least(0))
    epochs: int = key(1, "passes over the batch", at_least(1))
    shuffle: bool = key(True, "mini-batches in a random order (false: batch order)")


@dataclasses.dataclass(frozen=True)
class AdvantageConfig(Section):
    """config.advantage: the estimator (`rl/registry.py:ADVANTAGE_ESTIMATORS`) and the settings estimators share; an
    estimator's own keys are its settings section (`config.advantage.<estimator>.<key>`), registered with it."""

    _section = "advantage"
    estimator: str = key("grpo", "the advantage estimator (none: no advantages, SDPO's distillation)",
                         choices=registered("estimator"))
    std_ddof: int = key(0, "group std: 0 (population) or 1 (torch.std); also COPO's std over the batch's prompts, "
                        "RiskPO's over a bundle's scores and GDPO's over the batch", choices=(0, 1))
    norm_by_std: bool = key(True, "divide the group advantage by the group std (false: Dr. GRPO's r - mean); also "
                            "COPO's global advantage by its std, RiskPO's by the bundle scores' std and GDPO's "
                            "per-component group advantages")
    gamma: float = key(1.0, "discount of GAE and of REINFORCE++'s return", within(0, 1))
    lam: float = key(1.0, "GAE lambda", within(0, 1))


def _dual_clip(value):
    return None if value == 0 or value > 1 else f"{value} must be 0 or > 1"


@dataclasses.dataclass(frozen=True)
class LossConfig(Section):
    """config.loss: the policy loss (`rl/registry.py:POLICY_LOSSES`), clipping, aggregation, regularisers; a loss's
    own keys are its settings section (`config.loss.<loss>.<key>`), registered with it."""

    _section = "loss"
    policy: str = key("token_clip", "the policy loss (it must fit the algorithm)", choices=registered("policy"))
    clip_low: float = key(0.2, "eps_low of the ratio clip (1: no lower clip, the bound 0 a ratio never reaches)",
                          within(0, 1))
    clip_high: float = key(0.2, "eps_high of the ratio clip", at_least(0))
    clip_ratio_c: float = key(3.0, "dual clip; 0 disables", _dual_clip)
    agg_mode: str = key("seq-mean-token-mean", "how token losses become a scalar (losses/aggregation.py)",
                        choices=registered("agg_mode"))
    norm_length: int = key(0, "seq-mean-token-sum-norm's constant divisor, in tokens (Dr. GRPO's constant length): "
                           "each response's token-loss sum / this; 0 = rollout.max_new_tokens", at_least(0))
    kl_coef: float = key(0.001, "the reference KL term's weight", at_least(0))
    kl_estimator: str = key("k3", "the KL estimator", choices=registered("kl_estimator"))
    kl_in_reward: bool = key(False, "-kl_coef x loss.kl_estimator in the token rewards instead of a loss term "
                             "(PPO, RLOO, REINFORCE++)")
    entropy_coef: float = key(0.0, "entropy bonus weight", at_least(0))

    def check(self):
        need(not self.norm_length or self.agg_mode == "seq-mean-token-sum-norm", "loss.norm_length",
             f"{self.norm_length} is seq-mean-token-sum-norm's divisor, not {self.agg_mode!r}'s: set it to 0")


@dataclasses.dataclass(frozen=True)
class CriticConfig(Section):
    """config.critic: PPO's value model."""

    _section = "critic"
    lr: float = key(1e-5, "the critic's learning rate", above(0))
    cliprange_value: float = key(0.5, "value clip", above(0))


@dataclasses.dataclass(frozen=True)
class DapoConfig(Section):
    """config.dapo: dynamic sampling (refill with groups whose rewards differ) and overlong shaping.
    In a `TrainSpec`, `gen_prompts_per_batch` is resolved (P when the config says 0)."""

    _section = "dapo"
    dynamic_sampling: bool = key(False, "keep only groups whose rewards differ, refilling the batch (needs G >= 2)")
    gen_prompts_per_batch: int = key(0, "prompts per generation batch; 0 = rollout.prompts_per_batch",
                                     at_least(0, " (0 = rollout.prompts_per_batch)"))
    max_num_gen_batches: int = key(10, "generation batches one iteration may draw", at_least(1))
    overlong_buffer: int = key(0, "tokens before max_new_tokens where the overlong penalty ramps; 0 = off",
                               at_least(0))
    overlong_factor: float = key(1.0, "the overlong penalty at max_new_tokens", at_least(0))


SDPO_TEACHERS = ("ema", "live")


@dataclasses.dataclass(frozen=True)
class SdpoConfig(Section):
    """config.sdpo: the feedback-conditioned teacher (SDPO, VPD and its hybrids)."""

    _section = "sdpo"
    alpha: float = key(0.5, "JSD mixture weight", within(0, 1))
    topk: int = key(100, "JSD: the student's top-k tokens (+ tail)", at_least(1))
    teacher: str = key("ema", "ema (its own EMA copy) | live (the student's params)", choices=SDPO_TEACHERS)
    ema_rate: float = key(0.05, "the EMA teacher's rate", within(0, 1))
    success_threshold: float = key(1.0, "a sibling with reward >= this is a demonstration")
    is_clip: float = key(2.0, "importance-weight clip of the distillation loss", above(0))
    use_feedback: bool = key(True, "environment feedback when no sibling succeeded")


@dataclasses.dataclass(frozen=True)
class AuthorsConfig(Section):
    """config.pipo.authors: each place where the authors' released code (JacckMa/pipo_verl) departs from the
    paper's formulas, true / false, or None (unset: follows pipo.compat). `rl/controller.py:PipoOptions`
    holds them resolved (a test checks the two name the same behaviours)."""

    _section = "pipo.authors"
    window_twice: bool | None = key(None, "mu_t enters the window before xi is computed and again after the base "
                                    "step (so the window holds mu_t itself and each mean twice)")
    std_ddof0: bool | None = key(None, "window std with ddof 0 (np.std), not 1")
    xi_clip: bool | None = key(None, "xi = clip(mu_t - mu_his, -5, 5) / sigma_his, std floor 1e-6 (not 1e-8)")
    pi_no_lower_clip: bool | None = key(None, "token-ratio PI loss -min(nu, clip(nu)) * rhat: for rhat < 0 no lower "
                                        "clip and zero gradient once nu > 1 + eps (GSPO's PI step keeps both clips)")
    rhat_clamp: bool | None = key(None, "rhat = clamp(a * xi, -10, 10), then times lam when xi < 0")
    run_at_xi_zero: bool | None = key(None, "the PI step runs when xi == 0 exactly (c == 0: a KL-only step); with "
                                      "lam = 0 and xi < 0 it is skipped, as in paper mode")
    pi_symmetric_clip: bool | None = key(None, "token-ratio PI clip [1 - eps_low, 1 + eps_low] (DAPO: 0.2, not "
                                         "0.2 / 0.28)")
    attribution_eps_add: bool | None = key(None, "group attribution G * abar_i / (sum_j |abar_j| + 1e-6), not "
                                           "max(., 1e-6)")
    ppo_pi_no_lam: bool | None = key(None, "PPO's PI rewards use xi, not phi_lam(xi): for xi < 0 no lam scale "
                                     "(their `ppo_layback` loss ignores `layback_loss_scale`); with `rhat_clamp`, "
                                     "rhat = clamp(a * xi, -10, 10). The go / no-go still skips lam = 0, xi < 0")
    ppo_sign_attribution: bool | None = key(
        None, "PPO's PI attribution is the group attribution of the stored advantages over each prompt's "
        "`rollout.group_size` responses: a_i = G abar_i / (sum_j |abar_j| (+) 1e-6) (G = 1: about sign(abar_i)); "
        "with `ppo_adv_gate` the stored advantages are the gated ones, so after an xi < 0 iteration the sign flips")
    ppo_adv_gate: bool | None = key(None, "PPO's base advantages times clip(xi_gate, -2, 2), xi_gate from mu_t and "
                                    "the window before this iteration's push (any fill: empty -> 0, one mean -> "
                                    "sigma 1); the critic's returns are not gated")
    micro_token_mean: bool | None = key(None, "every loss aggregated over its micro-batch's counts and times "
                                        "1 / n_micro (verl's dp_actor), not over the mini-batch's global counts")


MU_SOURCES = ("filtered", "raw")
PI_OPTIMIZERS = ("shared", "separate")
PI_RATIOS = ("base", "token")
PI_DENOMINATORS = ("all_tokens", "signal_tokens")


def _window(value):
    return None if value >= 2 else f"K={value} must be >= 2 (the window std needs two means)"


def _pi_clip(value):
    return None if value > 0 else f"{value!r} must be None (the base loss's clip) or > 0"


@dataclasses.dataclass(frozen=True)
class PipoConfig(Section):
    """config.pipo: the controller (docs/math.md §2) and its PI step."""

    _section = "pipo"
    enabled: bool = key(False, "run PIPO's verification and PI step on top of the base algorithm")
    attribution: str = key("group", "the stored attribution (set by the algorithm file; it must fit the algorithm)",
                           choices=registered("attribution"))
    window: int = key(8, "K: iterations of mean reward in the window", _window)
    lam: float = key(0.1, "lambda: the PI step's scale when the improvement signal is negative", within(0, 1))
    lr: float = key(1e-6, "alpha_PI: the PI step's learning rate", above(0))
    compat: bool = key(False, "every behaviour of `pipo.authors` (README \"PIPO: the paper and the authors' code\")")
    authors: AuthorsConfig = key(AuthorsConfig, "the authors' behaviours one by one: true / false sets one; unset "
                                 "(None) follows pipo.compat")
    mu_source: str = key("filtered", "DAPO: mu_t over the filtered batch (docs/math.md, authors) | raw: every sampled group",
                         choices=MU_SOURCES)
    sdpo_pi_denominator: str = key(
        "all_tokens", "SDPO's PI step averages over all response tokens of B_{t-1} (paper Eq. 11) | signal_tokens: "
        "over the tokens of rows with a teacher signal (README \"SDPO's PI denominator\")", choices=PI_DENOMINATORS)
    attribution_norm: str = key("none", "none | mean_abs: attribution / its mean |a| over rows with a signal",
                                choices=registered("attribution_norm"))
    pi_optimizer: str = key("shared", "shared: one AdamW state for both steps (docs/math.md §2) | separate: the PI step's own",
                            choices=PI_OPTIMIZERS)
    pi_ratio: str = key("base", "base: the base loss's ratio (GSPO: its sequence ratio) | token: per-token ratio",
                        choices=PI_RATIOS)
    pi_clip_low: float | None = key(None, "the PI step's eps_low; unset = loss.clip_low", _pi_clip)
    pi_clip_high: float | None = key(None, "the PI step's eps_high; unset = loss.clip_high", _pi_clip)


VPD_REFERENCES = ("dynamic", "fixed")
VPD_HYBRIDS = ("none", "joint", "reshape")


@dataclasses.dataclass(frozen=True)
class VpdConfig(Section):
    """config.vpd (algorithm = vpd; experimental, docs/math.md §4)."""

    _section = "vpd"
    beta: float = key(0.1, "implicit reward rtilde = beta * log(q / pi_ref)", above(0))
    every: int = key(5, "F: the E-step runs on iterations with step % F == 0", at_least(1))
    lr: float = key(1e-6, "the teacher's own AdamW learning rate", above(0))
    e_step: bool = key(True, "false: the teacher is never trained (VPD reduces to SDPO)")
    reference: str = key("dynamic", "dynamic (the current student, paper default) | fixed (the initial policy)",
                         choices=VPD_REFERENCES)
    delta_mode: str = key("cumulative", "running mean of implicit rewards (losses/vpd.py:update_delta)",
                          choices=registered("vpd_delta_mode"))
    delta_ema_rate: float = key(0.1, "delta_mode=ema: its rate", within(0, 1, open_low=True))
    seq_logprob: str = key("sum", "sum (sequence log-likelihood ratio) | mean (per valid token)",
                           choices=registered("vpd_seq_logprob"))
    hybrid: str = key("none", "GRPO + SDPO ablations: none | joint | reshape", choices=VPD_HYBRIDS)
    hybrid_weight: float = key(1.0, "the hybrid's weight w", at_least(0))


@dataclasses.dataclass(frozen=True)
class WarmupConfig(Section):
    """config.warmup: the supervised warm-up of the task model (a fresh model, no model.path)."""

    _section = "warmup"
    enabled: bool = key(True, "warm the task model up on demonstrations before RL")
    steps: int = key(800, "warm-up optimizer steps", at_least(1))
    batch: int = key(64, "demonstrations per warm-up step", at_least(1))
    lr: float = key(3e-3, "the warm-up's learning rate", above(0))
    target_accuracy: float | None = key(0.25, "stop at this held-out accuracy (a partial solver, so RL has room); "
                                        "None = run all steps", within(0, 1))
    eval_every: int = key(50, "steps between held-out checks (the target's resolution: a stop overshoots by less)",
                          at_least(1))
    target_pass_rate: float | None = key(
        None, "stop at a check where the SAMPLED held-out pass@1 (share of responses with reward >= 1, drawn as the "
        "rollout draws them: rollout.temperature / top_k / top_p / max_new_tokens, warmup.check_prompts prompts x "
        "rollout.group_size) reaches this: what RL will see, unlike the greedy target_accuracy; with other targets "
        "set, all must hold; None = off; device_reward tasks", within(0, 1))
    target_mixed_groups: float | None = key(
        None, "stop only once this share of the sampled check's groups is mixed (some response with reward >= 1, some "
        "not: the groups that give GRPO a signal); with other targets set, all must hold; None = off; needs "
        "rollout.group_size >= 2", within(0, 1))
    check_prompts: int = key(64, "held-out prompts of the sampled check made at every warm-up check (its own fixed, "
                             "seed-dependent set; each sampled rollout.group_size times): pass@1 and the mixed-group "
                             "share are logged and reached by the targets above; 0 = no sampled check",
                             at_least(0, " (0 = no sampled check)"))

    def check(self):
        for name in ("target_pass_rate", "target_mixed_groups"):
            need(getattr(self, name) is None or self.check_prompts > 0, f"warmup.{name}",
                 f"{getattr(self, name)} is measured on the sampled check: set warmup.check_prompts >= 1 (it is 0)")


def _ks(value):
    try:
        tuple(int(k) for k in str(value).split(","))
    except ValueError:
        return f"{value!r} is not a comma-separated list of integers"
    return None


@dataclasses.dataclass(frozen=True)
class EvalConfig(Section):
    """config.eval: the trainer's evaluation."""

    _section = "eval"
    every: int = key(20, "iterations between evaluations; 0 = only at start and end", at_least(0))
    n: int = key(512, "held-out problems of the task (greedy accuracy), fixed across evaluations and seeds",
                 at_least(1))
    heldout_samples: int = key(4, "responses per held-out problem (the same eval.n problems) sampled as the rollout "
                               "samples (rollout.temperature / top_k / top_p / max_new_tokens) for "
                               "`heldout_pass_at_1`, the mean success (reward >= 1); its own fixed key, never the training stream's; "
                               "0 = not measured", at_least(0, " (0 = not measured)"))
    benchmarks: str = key("", "math benchmarks scored at every evaluation (pass@1 = mean over `samples`, unbiased "
                          "pass@k), as experiments/eval.py: \"NAME=PATH,NAME=PATH\" (JSONL / parquet with "
                          "task.prompt_field / answer_field); needs a math task")
    samples: int = key(4, "responses per benchmark problem", at_least(1))
    ks: str = key("1,4", "the k of pass@k, comma-separated, each in [1, samples]", _ks)
    temperature: float = key(1.0, "benchmark sampling temperature", at_least(0))
    batch_size: int = key(64, "benchmark prompts per sampling batch", at_least(1))

    def check(self):
        need(all(1 <= k <= self.samples for k in self.pass_ks), "eval.ks",
             f"{self.pass_ks}: each k must be in [1, eval.samples={self.samples}]")

    @property
    def pass_ks(self) -> tuple[int, ...]:
        return tuple(int(k) for k in str(self.ks).split(","))


@dataclasses.dataclass(frozen=True)
class LogConfig(Section):
    """config.log: logging and the jitted chunk."""

    _section = "log"
    every: int = key(5, "iterations per jitted lax.scan chunk between host logging points", at_least(1))
    jit_loop: bool = key(True, "scan the whole iteration when the reward is JAX-native")
    tensorboard: bool = key(True, "write TensorBoard events")
    wandb: bool = key(False, "log to Weights & Biases")
    wandb_project: str = key("pipo_jax", "the W&B project")
    progress: bool = key(True, "a progress bar")
    plots: bool = key(True, "plots of the metrics at the end")
    heartbeat_s: float = key(10.0, "seconds a run (with log.progress) may go without a console line: past it, "
                             "'still <phase>' says what runs (compiling which program, loading it from the "
                             "compilation cache); 0 = no such lines", at_least(0))


@dataclasses.dataclass(frozen=True)
class CheckpointConfig(Section):
    """config.checkpoint. A run killed at any point resumes from its newest checkpoint and loses at
    most `every` iterations; SIGTERM / SIGINT save one before exiting (README "Reliability")."""

    _section = "checkpoint"
    every: int = key(10, "iterations between checkpoints; 0 = only at the end (and on SIGTERM / SIGINT)",
                     at_least(0))
    warmup_every: int = key(200, "the warm-up's steps between its own checkpoints; 0 = none", at_least(0))
    keep: int = key(3, "checkpoints kept", at_least(1))
    resume: bool = key(True, "resume from the workdir's newest checkpoint (false: refuse a workdir that has one)")
    allow_config_change: bool = key(
        False, "resume with changed settings: keys that change the saved state's shapes are always refused; others "
        "(e.g. train.lr) need this (the earlier config is kept as config.<step>.json); run-control keys "
        "(iterations, log.*, eval.*, checkpoint.*, mesh.*, distributed.*) change freely")
    export_hf: bool = key(True, "write the final policy as a Hugging Face directory (hf_export/)")


@dataclasses.dataclass(frozen=True)
class MeshConfig(Section):
    """config.mesh: with more than one device (one process or many) the job runs sharded over this
    mesh (`parallel/mesh.py:mesh_from_config` checks the sizes against the devices)."""

    _section = "mesh"
    enabled: bool = key(True, "false: one device even when there are more")
    data: int = key(-1, "data-parallel ways; -1: whatever the other axes leave of the devices")
    fsdp: int = key(1, "splits batch and parameters / optimizer state (ZeRO-3)")
    tensor: int = key(1, "splits heads, MLP and vocabulary (log-probs run vocab-parallel)")
    dcn_data: int = key(1, "how many of the data ways cross hosts / slices")
    dcn_fsdp: int = key(1, "how many of the fsdp ways cross hosts / slices")
    rules: str = key("", "logical-axis rule overrides, e.g. \"embed=none;mlp=fsdp+tensor\"")


DISTRIBUTED_MODES = ("auto", "on", "off")


@dataclasses.dataclass(frozen=True)
class DistributedConfig(Section):
    """config.distributed: multi-process start-up (`parallel/distributed.py`): this config, then
    the JAX_* environment, SLURM, a TPU pod."""

    _section = "distributed"
    mode: str = key("auto", "auto: start the multi-process runtime when the config, environment, SLURM or a TPU pod "
                    "says there are several processes | on: always | off: never", choices=DISTRIBUTED_MODES)
    coordinator_address: str = key("", "host:port of process 0")
    num_processes: int = key(0, "processes in the job; 0 = from the environment")
    process_id: int = key(-1, "this process's id; -1 = from the environment")
    local_device_ids: str = key("", "this process's devices, e.g. \"0,1\"")
    port: int = key(0, "SLURM coordinator port; 0 = JAX_COORDINATOR_PORT or the job-id default")
    cpu_collectives: str = key("gloo", "CPU collectives implementation")
    initialization_timeout: int = key(300, "seconds", at_least(1))


@dataclasses.dataclass(frozen=True)
class RunConfig(Section):
    """The whole run config: `configs/base.py:base_config()` is `schema.defaults(RunConfig)`."""

    algorithm: str = key("grpo", "the registered algorithm (rl/algorithms.py:ALGORITHMS; configs/<name>.py sets "
                         "its defaults)", choices=registered("algorithm"))
    seed: int = key(0, "the run's seed (a signed 64-bit integer: `jax.random.PRNGKey`'s range)",
                    within(-(2**63), 2**63 - 1))
    iterations: int = key(60, "RL iterations (dataset tasks: task.epochs > 0 sets it)", at_least(1))
    model: ModelConfig = key(ModelConfig, "")
    task: TaskConfig = key(TaskConfig, "")
    rollout: RolloutConfig = key(RolloutConfig, "")
    train: TrainConfig = key(TrainConfig, "")
    advantage: AdvantageConfig = key(AdvantageConfig, "")
    loss: LossConfig = key(LossConfig, "")
    critic: CriticConfig = key(CriticConfig, "PPO only")
    dapo: DapoConfig = key(DapoConfig, "")
    sdpo: SdpoConfig = key(SdpoConfig, "")
    vpd: VpdConfig = key(VpdConfig, "algorithm = vpd only (experimental, docs/math.md §4)")
    pipo: PipoConfig = key(PipoConfig, "")
    warmup: WarmupConfig = key(WarmupConfig, "")
    eval: EvalConfig = key(EvalConfig, "")
    log: LogConfig = key(LogConfig, "")
    checkpoint: CheckpointConfig = key(CheckpointConfig, "")
    mesh: MeshConfig = key(MeshConfig, "")
    distributed: DistributedConfig = key(DistributedConfig, "")
