"""VPD (variational policy distillation, arXiv 2605.15113; docs/math.md §4) loss math. Experimental.

Only summaries of the paper are public; this module is our reading of it (docs/math.md §4), with
the choices below exposed as switches. Shapes: `*_b` [B] per response, `*_br` [B, R] per
response token, `*_brv` [B, R, V] log-distributions over the vocabulary. Log-probs are in
nats. The teacher q is the same network run on the feedback context (prompt + sibling
solution / environment feedback + instruction, then the student's response).

E-step (teacher refinement, BCO-style with the *current student* as dynamic reference):

    rtilde_i = beta * sum_t m_it (log q(y_it) - sg(log pi_ref(y_it)))        ("sum", default)
             = beta * mean_t over valid tokens of the same difference       ("mean")
    L_E = - mean_{i in Y+} log sigmoid(rtilde_i - delta)
          - mean_{i in Y-} log sigmoid(-(rtilde_i - delta))

    pi_ref is the student at theta_t ("dynamic", default) or the initial policy ("fixed"
    ablation); Y+ = {reward >= success threshold}, Y- = the other valid responses. An empty
    Y+ or Y- contributes 0 (never NaN). `delta` is a running mean of implicit rewards
    (`update_delta`), held under stop_gradient.

Teacher-collapse diagnostics (exact, from full log-distributions): teacher entropy and
KL(teacher || student) per valid token.

GRPO + SDPO hybrids from the paper's ablations (appendix B):
    joint:   L = L_clip(A_GRPO) + w * L_SDPO                           (`joint_hybrid_loss`)
    reshape: A'_it = A_GRPO_i + w * sg(log q(y_it) - log pi_old(y_it)),
             L = L_clip(A')      (`reshaped_advantages`; the learner's `vpd_reshape` advantage shaping)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from pipo_jax.config.registry import register_names
from pipo_jax.losses import distill
from pipo_jax.losses.aggregation import Aggregation
from pipo_jax.losses.masking import as_mask
from pipo_jax.losses.policy import jit_clip, token_clip_loss

SEQ_LOGPROB_MODES = ("sum", "mean")
register_names("vpd_seq_logprob", *SEQ_LOGPROB_MODES)  # `config/registry.py`: the schema's choices
DELTA_MODES = ("cumulative", "ema", "batch")
register_names("vpd_delta_mode", *DELTA_MODES)  # `config/registry.py`: the schema's choices
DISTILL_FORMS = ("token", "jsd")


def _check_choice(value, name: str, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {choices}")


# ----------------------------------------------------------------------------- implicit reward


def sequence_log_ratio(logp_teacher_br, logp_ref_br, mask_br, *, seq_logprob: str = "sum"):
    """log q(y) - log pi_ref(y) per response, [B]; the reference is under stop_gradient.

    "sum": over valid tokens (the sequence log-likelihood ratio, default); "mean": the same
    divided by max(|y_i|, 1). Padding entries are ignored whatever they hold.
    """
    _check_choice(seq_logprob, "seq_logprob", SEQ_LOGPROB_MODES)
    m = as_mask(mask_br)
    diff_br = jnp.where(m > 0, logp_teacher_br - jax.lax.stop_gradient(logp_ref_br), 0.0)
    total_b = jnp.sum(diff_br, axis=-1)
    if seq_logprob == "sum":
        return total_b
    return total_b / jnp.maximum(jnp.sum(m, axis=-1), 1.0)


def implicit_reward(logp_teacher_br, logp_ref_br, mask_br, *, beta: float, seq_logprob: str = "sum"):
    """rtilde_i = beta * (log q(y_i) - log pi_ref(y_i)), [B] (see `sequence_log_ratio`)."""
    return beta * sequence_log_ratio(logp_teacher_br, logp_ref_br, mask_br, seq_logprob=seq_logprob)


def outcome_labels(rewards_b, success_threshold: float, valid_b=None):
    """(positive_b, negative_b) bool [B]: valid responses with reward >= threshold, and the other valid ones."""
    rewards_b = jnp.asarray(rewards_b, jnp.float32)
    valid = jnp.ones(rewards_b.shape, bool) if valid_b is None else as_mask(valid_b) > 0
    positive = rewards_b >= success_threshold
    return positive & valid, (~positive) & valid


# ----------------------------------------------------------------------------- E-step loss


def bco_loss(rtilde_b, delta, positive_b, negative_b, *, num_pos=None, num_neg=None):
    """BCO-style E-step loss (docs/math.md §4). Returns (loss scalar, metrics).

        L_E = - sum_{i in Y+} log sigmoid(rtilde_i - delta) / max(num_pos, 1)
              - sum_{i in Y-} log sigmoid(delta - rtilde_i) / max(num_neg, 1)

    `num_pos` / `num_neg` default to the counts of `positive_b` / `negative_b`; pass the
    counts of the whole mini-batch when `rtilde_b` is one micro-batch, so the pieces' losses
    and metrics add up to the mini-batch's. An empty set contributes exactly 0. Rows in
    neither set (no teacher signal) are ignored. `delta` carries no gradient.
    Metrics (all additive over micro-batches): "e_loss", "e_loss_pos", "e_loss_neg",
    "rtilde_pos" / "rtilde_neg" (mean implicit reward of each set), "e_accuracy" (fraction of
    labelled responses on the right side of delta).
    """
    pos = as_mask(positive_b)
    neg = as_mask(negative_b)
    count_pos = jnp.sum(pos) if num_pos is None else jnp.asarray(num_pos, jnp.float32)
    count_neg = jnp.sum(neg) if num_neg is None else jnp.asarray(num_neg, jnp.float32)
    n_pos, n_neg = jnp.maximum(count_pos, 1.0), jnp.maximum(count_neg, 1.0)
    z_b = rtilde_b - jax.lax.stop_gradient(delta)
    # where, not *, so a huge |z| in an unlabelled row cannot turn 0 * inf into NaN
    loss_pos = jnp.sum(jnp.where(pos > 0, -jax.nn.log_sigmoid(z_b), 0.0)) / n_pos
    loss_neg = jnp.sum(jnp.where(neg > 0, -jax.nn.log_sigmoid(-z_b), 0.0)) / n_neg
    loss = loss_pos + loss_neg
    r = jax.lax.stop_gradient(rtilde_b)
    correct = jnp.where(pos > 0, z_b > 0, False) | jnp.where(neg > 0, z_b < 0, False)
    n_all = jnp.maximum(count_pos + count_neg, 1.0)
    metrics = {
        "e_loss": loss, "e_loss_pos": loss_pos, "e_loss_neg": loss_neg,
        "rtilde_pos": jnp.sum(jnp.where(pos > 0, r, 0.0)) / n_pos,
        "rtilde_neg": jnp.sum(jnp.where(neg > 0, r, 0.0)) / n_neg,
        "e_accuracy": jnp.sum(correct.astype(jnp.float32)) / n_all,
    }
    return loss, metrics


# ----------------------------------------------------------------------------- margin delta


@struct.dataclass
class DeltaState:
    """The running margin: `delta` float32 [] and `count` int32 [] (updates that saw a labelled response)."""

    delta: jax.Array
    count: jax.Array


def init_delta_state() -> DeltaState:
    return DeltaState(delta=jnp.zeros((), jnp.float32), count=jnp.zeros((), jnp.int32))


@functools.partial(jax.jit, static_argnames=("mode", "rate"))
def update_delta(state: DeltaState, rtilde_b, valid_b=None, *, mode: str = "cumulative", rate: float = 0.1):
    """New margin state from this batch's implicit rewards (no gradient). Let m = mean of `rtilde_b` over `valid_b`.

    - "cumulative" (default, as BCO's running mean): delta_k = delta_{k-1} + (m - delta_{k-1}) / k,
      i.e. the plain mean of the per-update batch means m_1..m_k.
    - "ema": delta_k = (1 - rate) delta_{k-1} + rate m, and delta_1 = m (no bias toward the initial 0).
    - "batch": delta_k = m (no memory).
    A batch with no valid response leaves the state unchanged.
    """
    _check_choice(mode, "delta_mode", DELTA_MODES)
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"delta_ema_rate={rate} must be in (0, 1]")
    r = jax.lax.stop_gradient(jnp.asarray(rtilde_b, jnp.float32))
    v = jnp.ones(r.shape, jnp.float32) if valid_b is None else as_mask(valid_b)
    n = jnp.sum(v)
    m = jnp.sum(jnp.where(v > 0, r, 0.0)) / jnp.maximum(n, 1.0)
    k = state.count + 1
    if mode == "cumulative":
        new = state.delta + (m - state.delta) / k.astype(jnp.float32)
    elif mode == "ema":
        new = jnp.where(state.count == 0, m, (1.0 - rate) * state.delta + rate * m)
    else:
        new = m
    has = n > 0
    return DeltaState(delta=jnp.where(has, new, state.delta), count=jnp.where(has, k, state.count))


# ----------------------------------------------------------------------------- collapse diagnostics


def token_entropy(logp_brv):
    """H = -sum_v p_v log p_v per token, [B, R] (zero-probability entries contribute 0)."""
    p = jnp.exp(logp_brv)
    return -jnp.sum(jnp.where(p > 0, p * logp_brv, 0.0), axis=-1)


def token_kl(logp_p_brv, logp_q_brv):
    """KL(P || Q) = sum_v p_v (log p_v - log q_v) per token, [B, R]."""
    p = jnp.exp(logp_p_brv)
    return jnp.sum(jnp.where(p > 0, p * (logp_p_brv - logp_q_brv), 0.0), axis=-1)


def teacher_collapse_sums(teacher_logp_brv, student_logp_brv, mask_br):
    """Sums over valid tokens of teacher entropy, student entropy and KL(teacher || student), and the token count.

    Sums (not means) so that chunks of a batch add up; `teacher_collapse_metrics` divides.
    The distributions are the full vocabulary ones (exact, no top-k truncation).
    """
    m = as_mask(mask_br)
    tot = lambda x: jnp.sum(jnp.where(m > 0, x, 0.0))
    return {"teacher_entropy": tot(token_entropy(teacher_logp_brv)),
            "student_entropy": tot(token_entropy(student_logp_brv)),
            "kl_teacher_student": tot(token_kl(teacher_logp_brv, student_logp_brv)),
            "num_tokens": jnp.sum(m)}


def teacher_collapse_metrics(teacher_logp_brv, student_logp_brv, mask_br):
    """Per-valid-token means {"teacher_entropy", "student_entropy", "kl_teacher_student"} (nats).

    A collapsing teacher shows entropy -> 0 while its KL to the student grows.
    """
    sums = teacher_collapse_sums(teacher_logp_brv, student_logp_brv, mask_br)
    n = jnp.maximum(sums.pop("num_tokens"), 1.0)
    return {k: v / n for k, v in sums.items()}


# ----------------------------------------------------------------------------- GRPO + SDPO hybrids


def reshaped_advantages(adv_br, logp_teacher_br, logp_student_br, mask_br, *, weight: float, sd_mask_b=None):
    """A'_it = A_it + w * sg(log q(y_it) - log pi(y_it)) on valid tokens with teacher signal, else A_it; 0 at padding.

    `logp_student_br` is the behaviour policy's log-probs (theta_t), so A' is fixed across
    epochs like any advantage. Rows with `sd_mask_b` = 0 keep the plain advantage.
    """
    m = as_mask(mask_br)
    signal = m if sd_mask_b is None else m * as_mask(sd_mask_b)[:, None]
    attr_br = jax.lax.stop_gradient(distill.token_attribution(logp_teacher_br, logp_student_br, signal))
    return jnp.where(m > 0, adv_br + weight * attr_br, 0.0)


@jit_clip(static_argnames=("weight", "distill_form", "distill_agg_mode", "alpha", "is_clip"))
def joint_hybrid_loss(logp_br, logp_old_br, adv_br, mask_br, *, weight: float, distill_form: str = "token",
                      logp_teacher_br=None, student_distill_logp_brn=None, teacher_distill_logp_brn=None,
                      alpha: float = 0.5, is_clip: float | None = 2.0, sd_mask_b=None,
                      agg: Aggregation = Aggregation("seq-mean-token-mean"), distill_agg_mode: str = "token-mean",
                      ratio_low: float = 1 - 0.2, ratio_high: float = 1 + 0.2, clip_ratio_c: float = 3.0):
    """Joint-loss hybrid: L = L_clip(A_GRPO) + w * L_SDPO. (loss, metrics).

    L_clip is the token clip loss aggregated by `agg`; L_SDPO is SDPO's
    IS-weighted distillation loss aggregated with `distill_agg_mode` over mask * sd_mask:
    `distill_form="token"`: sg(logp_S - logp_T) * logp_S (needs `logp_teacher_br`);
    `"jsd"`: generalised JSD with `alpha` on a support (needs `*_distill_logp_brn`).
    Both terms use `agg`'s global counts. Metrics: both terms' metrics plus "joint_loss".
    """
    _check_choice(distill_form, "distill_form", DISTILL_FORMS)
    pg, pg_metrics = token_clip_loss(logp_br, logp_old_br, adv_br, mask_br, agg=agg, ratio_low=ratio_low,
                                     ratio_high=ratio_high, clip_ratio_c=clip_ratio_c)
    common = {"is_clip": is_clip, "sd_mask_b": sd_mask_b, "agg": agg.replace(mode=distill_agg_mode)}
    if distill_form == "token":
        if logp_teacher_br is None:
            raise ValueError("joint_hybrid_loss(distill_form='token') needs logp_teacher_br")
        sd, sd_metrics = distill.sdpo_token_loss(logp_br, logp_old_br, None, mask_br, logp_teacher_br=logp_teacher_br,
                                                 **common)
    else:
        if student_distill_logp_brn is None or teacher_distill_logp_brn is None:
            raise ValueError("joint_hybrid_loss(distill_form='jsd') needs student_distill_logp_brn and "
                             "teacher_distill_logp_brn")
        sd, sd_metrics = distill.sdpo_jsd_loss(logp_br, logp_old_br, None, mask_br,
                                               student_distill_logp_brn=student_distill_logp_brn,
                                               teacher_distill_logp_brn=teacher_distill_logp_brn, alpha=alpha,
                                               logp_teacher_br=logp_teacher_br, **common)
    loss = pg + weight * sd
    return loss, dict(pg_metrics, **sd_metrics, joint_loss=loss)
