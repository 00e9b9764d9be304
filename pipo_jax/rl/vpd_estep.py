"""VPD E-step (docs/math.md §4, experimental): refine the feedback-conditioned teacher, as pure functions.

The teacher is the SDPO teacher (`TrainState.teacher_params`: the same network, its own
param copy, fed the feedback context `batch.teacher_tokens_bq`). Every `every` student
iterations the E-step trains it with the BCO-style loss of `pipo_jax.losses.vpd` on the
current batch, through the same mini-batch x epoch machinery as the student
(`steps.minibatch_updates`: `spec.mini_batch`, `spec.train.micro_batch_size_per_device`, `spec.train.epochs`,
`spec.train.shuffle`), with its own AdamW state and learning rate `VpdConfig.lr`. Gradient flows
into the teacher params only.

Reference log-probs: by default the E-step reads them from the batch `learn.prepare`
built at theta_t, so it needs no student forward: `logp_old_br` (the student at theta_t,
i.e. the *current* student when the E-step runs before the student's updates: "dynamic")
or `logp_ref_br` (the initial params: the "fixed" ablation). A caller whose student has
already moved passes its own `ref_logp_br` (the student's log-probs under its current params).

Margin delta: updated once per E-step from the implicit rewards of the whole batch under
the teacher *before* the update (one extra no-gradient teacher forward), then held fixed
for the E-step's optimizer steps.

Mini-batch counts: the BCO loss averages over the positives and the negatives of each
mini-batch; `outcome_counts` gives `minibatch_updates` those global counts, so
micro-batching never changes the loss or the gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from pipo_jax.losses import vpd as vpd_loss
from pipo_jax.rl import steps
from pipo_jax.rl.batch import TrainBatch
from pipo_jax.rl.response_logprobs import response_log_softmax, response_logprobs
from pipo_jax.config.sections import VpdConfig
from pipo_jax.rl.spec import TrainSpec
from pipo_jax.rl.state import make_teacher_optimizer, with_lr


@struct.dataclass
class EStepBatch:
    """What the E-step's mini-batches carry: teacher inputs, reference log-probs, labels (B rows)."""

    mask_br: jax.Array  # float32 [B, R]
    teacher_tokens_bq: jax.Array  # int32 [B, Q]
    teacher_mask_bq: jax.Array  # int32 [B, Q]
    ref_logp_br: jax.Array  # float32 [B, R]: log pi_ref of the response
    positive_b: jax.Array  # float32 [B]: 1 for rows labelled positive
    negative_b: jax.Array  # float32 [B]


def should_run(step, every: int) -> jax.Array:
    """Whether iteration `step` (student iterations done so far) runs an E-step: step % every == 0.

    Steps 0, F, 2F, ...: exactly F student updates separate two E-steps. Jit-compatible.
    """
    if every < 1:
        raise ValueError(f"vpd every={every} must be >= 1")
    return jnp.asarray(step) % every == 0


def _require(batch: TrainBatch, keys) -> None:
    missing = [k for k in keys if getattr(batch, k) is None]
    if missing:
        raise KeyError(f"the VPD E-step needs batch fields {missing}; they are None")


def reference_logprobs(cfg: VpdConfig, batch: TrainBatch) -> jax.Array:
    """log pi_ref `[B, R]` of the response tokens: `logp_old_br` ("dynamic") or `logp_ref_br` ("fixed")."""
    key = "logp_old_br" if cfg.reference == "dynamic" else "logp_ref_br"
    _require(batch, (key,))
    return jax.lax.stop_gradient(getattr(batch, key))


def outcome_counts(mini: EStepBatch) -> dict:
    """Global counts of an E-step mini-batch: {"num_pos", "num_neg"} labelled responses."""
    return {"num_pos": jnp.sum(mini.positive_b), "num_neg": jnp.sum(mini.negative_b)}


def labels(spec: TrainSpec, batch: TrainBatch) -> tuple[jax.Array, jax.Array]:
    """(positive_b, negative_b): rows with teacher signal (sd_mask) and a non-empty response, split by
    reward >= `spec.sdpo.success_threshold` (the same threshold that picks SDPO's demonstrations)."""
    _require(batch, ("rewards_b", "sd_mask_b", "mask_br"))
    valid = (batch.sd_mask_b > 0) & (jnp.sum(batch.mask_br, axis=-1) > 0)
    return vpd_loss.outcome_labels(batch.rewards_b, spec.sdpo.success_threshold, valid)


def e_step_batch(batch: TrainBatch, ref_logp_br, positive_b, negative_b) -> EStepBatch:
    """The E-step's batch from the student's: teacher inputs, reference log-probs, labels."""
    return EStepBatch(mask_br=batch.mask_br, teacher_tokens_bq=batch.teacher_tokens_bq,
                      teacher_mask_bq=batch.teacher_mask_bq, ref_logp_br=ref_logp_br,
                      positive_b=jnp.asarray(positive_b, jnp.float32), negative_b=jnp.asarray(negative_b, jnp.float32))


def teacher_response_logprobs(spec: TrainSpec, teacher_params, tokens_bq, mask_bq) -> jax.Array:
    """log q(y_t) `[B, R]` of the response tokens in the teacher context, differentiable in `teacher_params`."""
    q = tokens_bq.shape[1] - spec.rollout.max_new_tokens
    logp, _ = response_logprobs(spec.model, teacher_params, tokens_bq, mask_bq, q,
                                temperature=spec.rollout.temperature, impl=spec.logprob_impl)
    return logp


def e_step_loss_fn(spec: TrainSpec, cfg: VpdConfig, delta) -> steps.LossFn:
    """`loss_fn(teacher_params, micro_batch, counts)` for `minibatch_updates` on an `e_step_batch`."""

    def loss_fn(teacher_params, mb: EStepBatch, counts: dict):
        logq = teacher_response_logprobs(spec, teacher_params, mb.teacher_tokens_bq, mb.teacher_mask_bq)
        rtilde = vpd_loss.implicit_reward(logq, mb.ref_logp_br, mb.mask_br, beta=cfg.beta,
                                          seq_logprob=cfg.seq_logprob)
        return vpd_loss.bco_loss(rtilde, delta, mb.positive_b > 0, mb.negative_b > 0,
                                 num_pos=counts["num_pos"], num_neg=counts["num_neg"])

    return loss_fn


def e_step(spec: TrainSpec, cfg: VpdConfig, teacher_params, teacher_opt_state, batch: TrainBatch, ref_logp_br,
           delta_state: vpd_loss.DeltaState, rng, *, lr=None):
    """One E-step on `batch`; returns (teacher_params, teacher_opt_state, delta_state, metrics).

    `lr`: the teacher's learning rate, the trainer's `TrainState.hyper.vpd_lr` (data); None: `cfg.lr`.

    `batch` is `learn.prepare`'s SDPO batch plus "rewards_b" [B]. `ref_logp_br` [B, R]: None
    reads the reference from the batch per `cfg.reference` (the normal use); an array
    overrides the *dynamic* reference (e.g. the log-probs of a student that moved since
    `prepare`) and is refused with `reference="fixed"`.
    Metrics ("vpd/..."): the BCO loss terms, accuracy, mean implicit reward of each set and
    grad norm averaged over the optimizer steps; the margin "vpd/delta" used; the batch's
    "vpd/rtilde_mean" before the update; "vpd/num_pos" / "vpd/num_neg" labelled responses.
    """
    _require(batch, ("teacher_tokens_bq", "teacher_mask_bq", "mask_br", "sd_mask_b", "rewards_b"))
    if ref_logp_br is not None and cfg.reference == "fixed":
        raise ValueError("e_step: ref_logp_br overrides the dynamic reference, but config.vpd.reference='fixed' "
                         "reads batch.logp_ref_br; pass ref_logp_br=None")
    ref = reference_logprobs(cfg, batch) if ref_logp_br is None else jax.lax.stop_gradient(ref_logp_br)
    pos, neg = labels(spec, batch)
    e_batch = e_step_batch(batch, ref, pos, neg)

    logq_before = steps.micro_teacher_logprobs(spec, teacher_params, batch.teacher_tokens_bq,
                                               batch.teacher_mask_bq)
    rtilde_before = vpd_loss.implicit_reward(logq_before, ref, batch.mask_br, beta=cfg.beta,
                                             seq_logprob=cfg.seq_logprob)
    delta_state = vpd_loss.update_delta(delta_state, rtilde_before, pos | neg, mode=cfg.delta_mode,
                                        rate=cfg.delta_ema_rate)

    teacher_params, teacher_opt_state, m = steps.minibatch_updates(
        spec, e_step_loss_fn(spec, cfg, delta_state.delta), make_teacher_optimizer(spec, cfg), teacher_params,
        with_lr(teacher_opt_state, cfg.lr if lr is None else lr), e_batch, rng, counts_fn=outcome_counts)
    labelled = (pos | neg).astype(jnp.float32)
    metrics = {f"vpd/{k}": v for k, v in m.items()}
    metrics.update({
        "vpd/delta": delta_state.delta,
        "vpd/rtilde_mean": jnp.sum(rtilde_before * labelled) / jnp.maximum(jnp.sum(labelled), 1.0),
        "vpd/num_pos": jnp.sum(pos.astype(jnp.float32)), "vpd/num_neg": jnp.sum(neg.astype(jnp.float32)),
    })
    return teacher_params, teacher_opt_state, delta_state, metrics


def maybe_e_step(spec: TrainSpec, cfg: VpdConfig, step, teacher_params, teacher_opt_state, batch: TrainBatch,
                 ref_logp_br, delta_state: vpd_loss.DeltaState, rng, *, lr=None):
    """`e_step` on iterations where `should_run(step, cfg.every)`, else the inputs unchanged (jit-compatible).

    Adds "vpd/e_step_applied" (1.0 / 0.0); skipped iterations report zeros for the E-step
    metrics and the carried "vpd/delta". With `cfg.e_step=False` nothing is traced: the
    inputs come back as they are with no metrics (VPD reduces to SDPO).
    """
    if not cfg.e_step:
        return teacher_params, teacher_opt_state, delta_state, {}

    def run(operands):
        t, s, d = operands
        return e_step(spec, cfg, t, s, batch, ref_logp_br, d, rng, lr=lr)

    shapes = jax.eval_shape(run, (teacher_params, teacher_opt_state, delta_state))[3]

    def skip(operands):
        t, s, d = operands
        zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
        return t, s, d, dict(zeros, **{"vpd/delta": d.delta})

    applied = should_run(step, cfg.every)
    t, s, d, metrics = jax.lax.cond(applied, run, skip, (teacher_params, teacher_opt_state, delta_state))
    return t, s, d, dict(metrics, **{"vpd/e_step_applied": applied.astype(jnp.float32)})


def teacher_diagnostics(spec: TrainSpec, teacher_params, student_params, batch: TrainBatch, *,
                        chunk_rows: int | None = None) -> dict:
    """Teacher-collapse metrics on `batch`, per valid token of rows with teacher signal (mask_br * sd_mask_b).

    {"vpd/teacher_entropy", "vpd/student_entropy", "vpd/kl_teacher_student"}: exact, from the
    full `[chunk_rows, R, V]` log-distributions of the teacher (teacher context) and the
    student (plain prompt), computed `chunk_rows` sequences at a time (default: the
    update's micro-batches, `steps.map_micro_batches`' layout); no gradient.
    """
    _require(batch, ("tokens_bl", "mask_bl", "mask_br", "teacher_tokens_bq", "teacher_mask_bq", "sd_mask_b"))
    b = batch.mask_br.shape[0]
    if chunk_rows is None:
        n, shards = steps.micro_split_count(spec, b)
    elif chunk_rows < 1 or b % chunk_rows:
        raise ValueError(f"teacher_diagnostics chunk_rows={chunk_rows} does not divide the batch of {b}")
    else:
        n, shards = b // chunk_rows, 1
    q = batch.teacher_tokens_bq.shape[1] - spec.rollout.max_new_tokens
    keys = ("tokens_bl", "mask_bl", "mask_br", "teacher_tokens_bq", "teacher_mask_bq", "sd_mask_b")
    chunks = {k: steps.split_micro(getattr(batch, k), n, shards) for k in keys}
    teacher, student = jax.lax.stop_gradient(teacher_params), jax.lax.stop_gradient(student_params)

    def one(mb):
        t = response_log_softmax(spec.model, teacher, mb["teacher_tokens_bq"], mb["teacher_mask_bq"], q,
                                 temperature=spec.rollout.temperature)
        s = response_log_softmax(spec.model, student, mb["tokens_bl"], mb["mask_bl"], spec.prompt_len,
                                 temperature=spec.rollout.temperature)
        return vpd_loss.teacher_collapse_sums(t, s, mb["mask_br"] * mb["sd_mask_b"][:, None])

    sums = jax.tree.map(jnp.sum, jax.lax.map(one, chunks))
    count = jnp.maximum(sums.pop("num_tokens"), 1.0)
    return {f"vpd/{k}": v / count for k, v in sums.items()}
