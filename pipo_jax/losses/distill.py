"""Self-distillation (SDPO, arXiv 2601.20802; docs/math.md §1 "SDPO") losses and attribution.

The teacher is the same network run on the teacher context (prompt + demonstration /
feedback + instruction, then the student's response) under `stop_gradient`, with EMA or live
params. Shapes: `*_br` [B, R] per response token; `*_brv` [B, R, V] per vocabulary entry;
`*_brn` [B, R, N] over a distillation support of N entries (top-k + tail bucket).

- `student_topk_with_tail(student_logp_brv, teacher_logp_brv, k)`: both distributions on the
  student's top-k tokens plus a tail bucket log(1 - sum_k p) (or renormalised top-k).
- `generalized_jsd(student_logp_brn, teacher_logp_brn, alpha)` -> [B, R]: alpha=0 forward
  KL(T||S), alpha=1 reverse KL(S||T), else (1-a) KL(S||M) + a KL(T||M), M = (1-a) S + a T.
- `reverse_kl_token_loss(logp_br, logp_teacher_br)` = sg(logp_S - logp_T) * logp_S.
- `importance_weight(logp_br, logp_old_br, is_clip)` = sg(min(exp(logp - logp_old), is_clip)).
- `token_attribution(logp_teacher_br, logp_student_br, mask_br, sd_mask_b)` = logp_T - logp_S (paper Eq. 4)
  where sd_mask = 1, else 0: SDPO's local attribution for PIPO.
- `select_demonstrations(rewards_b, group_size)`: the first *other* successful response of each group.
- `ema_update(teacher_params, student_params, rate)`: the EMA teacher.

The SDPO losses (registered as `rl/algorithms.py:POLICY_LOSSES["sdpo_token"]`, `["sdpo_jsd"]`) share the policy-loss
signature `fn(logp_br, logp_old_br, adv_br, mask_br, *, agg=Aggregation("token-mean"), ...)`; the
SDPO loss replaces the policy-gradient loss, so `adv_br` is not read (pass None). Extra keyword
inputs: `logp_teacher_br` (token form) or `student_distill_logp_brn`/`teacher_distill_logp_brn`
(JSD form), and `sd_mask_b` [B] (0 = no teacher signal for that sample). With micro-batching,
pass `agg` with the counts of mask * sd_mask over the whole mini-batch.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pipo_jax.losses.aggregation import Aggregation, aggregate, token_mean
from pipo_jax.losses.masking import as_mask

_TAIL_LOG_MASS_MAX = -1e-7  # keeps log(1 - sum p) finite when the top-k hold all the mass


@functools.partial(jax.jit, static_argnames=("k", "add_tail"))
def student_topk_with_tail(student_logp_brv, teacher_logp_brv, k: int | None, *, add_tail: bool = True):
    """Distillation support from the student's top-k tokens. Returns (student_brn, teacher_brn).

    Both are gathered at the *student's* top-k indices (selection is not differentiated). With
    `add_tail`, N = k + 1 and the last entry is the tail bucket log(1 - sum_k p); otherwise
    N = k and the top-k log-probs are renormalised. `k=None` uses the full vocabulary as is.
    """
    vocab = student_logp_brv.shape[-1]
    if k is None:
        return student_logp_brv, teacher_logp_brv
    if not 1 <= k <= vocab:
        raise ValueError(f"distill_topk={k} must be in [1, vocab_size={vocab}] (or None for the full vocabulary)")
    _, idx_btk = jax.lax.top_k(jax.lax.stop_gradient(student_logp_brv), k)
    s_btk = jnp.take_along_axis(student_logp_brv, idx_btk, axis=-1)
    t_btk = jnp.take_along_axis(teacher_logp_brv, idx_btk, axis=-1)

    def with_tail(logp_btk):
        log_mass = jnp.minimum(jax.nn.logsumexp(logp_btk, axis=-1, keepdims=True), _TAIL_LOG_MASS_MAX)
        return jnp.concatenate([logp_btk, jnp.log(-jnp.expm1(log_mass))], axis=-1)

    def renormalised(logp_btk):
        return logp_btk - jax.nn.logsumexp(logp_btk, axis=-1, keepdims=True)

    finish = with_tail if add_tail else renormalised
    return finish(s_btk), finish(t_btk)


def _kl(logp_p, logp_q):
    """KL(P || Q) over the last axis from log-probs; entries with P = 0 contribute 0."""
    p = jnp.exp(logp_p)
    return jnp.sum(jnp.where(p > 0, p * (logp_p - logp_q), 0.0), axis=-1)


@functools.partial(jax.jit, static_argnames=("alpha",))
def generalized_jsd(student_logp_brn, teacher_logp_brn, alpha: float = 0.5):
    """Per-token generalised JSD [B, R]; the teacher is under stop_gradient. `alpha` is static."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"sdpo alpha={alpha} must be in [0, 1]")
    s, t = student_logp_brn, jax.lax.stop_gradient(teacher_logp_brn)
    if alpha == 0.0:
        return _kl(t, s)
    if alpha == 1.0:
        return _kl(s, t)
    mix = jax.nn.logsumexp(jnp.stack([s + jnp.log1p(-alpha), t + jnp.log(alpha)]), axis=0)
    return (1.0 - alpha) * _kl(s, mix) + alpha * _kl(t, mix)


def reverse_kl_token_loss(logp_br, logp_teacher_br):
    """Token-level reverse-KL form sg(logp_S - logp_T) * logp_S, [B, R] (gradient through logp_S only)."""
    return jax.lax.stop_gradient(logp_br - logp_teacher_br) * logp_br


def importance_weight(logp_br, logp_old_br, is_clip: float | None = 2.0):
    """sg(min(exp(clip(logp - logp_old, -20, 20)), is_clip)), [B, R]; `is_clip=None` leaves it unclipped."""
    w = jnp.exp(jnp.clip(logp_br - logp_old_br, -20.0, 20.0))
    if is_clip is not None:
        w = jnp.minimum(w, is_clip)
    return jax.lax.stop_gradient(w)


def _sd_mask(mask_br, sd_mask_b):
    m = as_mask(mask_br)
    return m if sd_mask_b is None else m * as_mask(sd_mask_b)[:, None]


def _sdpo_finish(per_token_br, logp_br, logp_old_br, logp_teacher_br, mask_br, sd_mask_b, is_clip, agg):
    m = _sd_mask(mask_br, sd_mask_b)
    weighted_br = per_token_br * importance_weight(logp_br, logp_old_br, is_clip)
    loss = aggregate(weighted_br, m, agg)
    metrics = {"sdpo_loss": loss}
    if logp_teacher_br is not None:
        diff_br = jax.lax.stop_gradient(logp_teacher_br - logp_br)
        metrics["sdpo_teacher_minus_student_logp"] = token_mean(diff_br, m, agg.num_tokens)
    return loss, metrics


@functools.partial(jax.jit, static_argnames=("is_clip",))
def sdpo_token_loss(
    logp_br,
    logp_old_br,
    adv_br,
    mask_br,
    *,
    logp_teacher_br,
    is_clip: float | None = 2.0,
    sd_mask_b=None,
    agg: Aggregation = Aggregation("token-mean"),
):
    """SDPO token-level reverse-KL loss, IS-weighted, aggregated over mask * sd_mask. (loss, metrics)."""
    del adv_br  # the teacher log-probs are the target
    per_token_br = reverse_kl_token_loss(logp_br, jax.lax.stop_gradient(logp_teacher_br))
    return _sdpo_finish(per_token_br, logp_br, logp_old_br, logp_teacher_br, mask_br, sd_mask_b, is_clip, agg)


@functools.partial(jax.jit, static_argnames=("alpha", "is_clip"))
def sdpo_jsd_loss(
    logp_br,
    logp_old_br,
    adv_br,
    mask_br,
    *,
    student_distill_logp_brn,
    teacher_distill_logp_brn,
    alpha: float = 0.5,
    is_clip: float | None = 2.0,
    sd_mask_b=None,
    logp_teacher_br=None,
    agg: Aggregation = Aggregation("token-mean"),
):
    """SDPO generalised-JSD loss over a distillation support (see `student_topk_with_tail`). (loss, metrics).

    `logp_teacher_br` (optional) only feeds the teacher-minus-student metric.
    """
    del adv_br
    per_token_br = generalized_jsd(student_distill_logp_brn, teacher_distill_logp_brn, alpha)
    return _sdpo_finish(per_token_br, logp_br, logp_old_br, logp_teacher_br, mask_br, sd_mask_b, is_clip, agg)


def token_attribution(logp_teacher_br, logp_student_br, mask_br, sd_mask_b=None):
    """SDPO attribution a_t = logp_T(y_t) - logp_S(y_t) on valid tokens (paper Eq. 4), [B, R].

    Eq. 4 defines it only where the teacher has a signal: rows with `sd_mask_b` [B] = 0 get 0.
    """
    m = _sd_mask(mask_br, sd_mask_b)
    return jnp.where(m > 0, logp_teacher_br - logp_student_br, 0.0)


@functools.partial(jax.jit, static_argnames=("group_size", "success_threshold"))
def select_demonstrations(rewards_b, group_size: int, *, success_threshold: float = 1.0):
    """For each response, the first *other* response of its group with reward >= threshold.

    Returns (demo_row_b int32 [B], global row index or -1, has_demo_b bool [B]). A sample with
    neither a demonstration nor environment feedback gets sd_mask = 0 (decided by the caller).
    """
    rewards_b = jnp.asarray(rewards_b, jnp.float32)
    if group_size < 1 or rewards_b.shape[0] % group_size:
        raise ValueError(f"group_size={group_size} does not divide the batch of {rewards_b.shape[0]} responses")
    solved_pg = rewards_b.reshape(-1, group_size) >= success_threshold
    other_gg = ~jnp.eye(group_size, dtype=bool)
    candidates_pgg = solved_pg[:, None, :] & other_gg[None]  # [p, i, j]: j is a demo for i
    has_pg = jnp.any(candidates_pgg, axis=-1)
    first_pg = jnp.argmax(candidates_pgg, axis=-1)
    row_pg = first_pg + group_size * jnp.arange(solved_pg.shape[0])[:, None]
    return jnp.where(has_pg, row_pg, -1).reshape(-1).astype(jnp.int32), has_pg.reshape(-1)


@functools.partial(jax.jit, static_argnames=("rate",))
def ema_update(teacher_params, student_params, rate: float = 0.05):
    """teacher <- (1 - rate) * teacher + rate * student, leaf-wise, keeping each teacher dtype."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"sdpo ema rate={rate} must be in [0, 1]")
    return jax.tree.map(
        lambda t, s: ((1.0 - rate) * t.astype(jnp.float32) + rate * s.astype(jnp.float32)).astype(t.dtype),
        teacher_params,
        student_params,
    )
