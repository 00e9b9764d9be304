"""Clipped policy-gradient surrogates (docs/math.md §1), minimised.

Inputs: `logp_br`, `logp_old_br` [B, R] log-probs of the sampled tokens under the current and
the behaviour policy, `adv_br` [B, R] advantages (or PI rewards), `mask_br` [B, R].

The clipped losses take the clip's bounds, not eps: `ratio_low` = 1 - eps_low and `ratio_high` =
1 + eps_high (`ratio_bounds`: folded in float64 on the host, then rounded once to float32 where they are
data, `rl/hyper.py`), so a bound is the float32 nearest to 1 - eps_low / 1 + eps_high whether it is a
Python constant of the program or a traced float32 value. eps_low = 1 (`ratio_low` = 0) is no lower
clip: r = exp(clip(log r, -20, 20)) >= exp(-20) > 0 never falls below it (Clip-Cov's released scripts).

Token clip (PPO/GRPO/DAPO), with r = exp(clip(logp - logp_old, -20, 20)):
    L = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)); for A < 0 and clip_ratio_c > 0 (dual
    clip) L = min(L, -A c). clip_ratio_c = 0 disables dual clip.
GSPO: log s_i = sum_t m (logp - logp_old) / max(|y_i|, 1); token form
    log s_it = min(logp - sg(logp) + sg(log s_i), 10), then the token clip without dual clip.
    With A constant over a sequence this has the value and gradient of the sequence form
    max(-A s_i, -A clip(s_i)) under `seq-mean-token-mean` aggregation.
CISPO (MiniMax-M1, arXiv 2506.13585): L = -sg(clip(r, 1 - eps_low, 1 + eps_high)) A logp: the
    importance weight is clipped and detached instead of the update, so every token keeps
    the gradient -w A d logp (no token is dropped by the clip); no dual clip.
`lower_clip_negative_adv=False` is the authors' PIPO loss (`rl/controller.PipoOptions.pi_no_lower_clip`):
    L = -A min(r, clip(r, 1 - eps_low, 1 + eps_high)) on every token, so for A < 0 there is no
    lower clip and the gradient is zero once r > 1 + eps_high (for A >= 0 it is the token clip).

The policy losses share one signature (`rl/algorithms.py` registers them as `POLICY_LOSSES`):
    loss_fn(logp_br, logp_old_br, adv_br, mask_br, *, agg: Aggregation, **loss_specific)
        -> (loss scalar, metrics dict)
Metrics are token means normalised by the same global `agg.num_tokens` as the loss, so, like the
loss, they add up across micro-batches: "pg_clipfrac" (tokens where the clip is active),
"pg_clipfrac_lower" (dual clip active), "ppo_kl" (mean of logp_old - logp), "pg_loss"
(CISPO: "pg_clipfrac" counts tokens whose weight is clipped).
"""

from __future__ import annotations

import functools
import inspect
import numbers

import jax
import jax.numpy as jnp

from pipo_jax.losses.aggregation import Aggregation, aggregate, token_mean
from pipo_jax.losses.masking import as_mask


def ratio_bounds(eps_low: float, eps_high: float) -> tuple[float, float]:
    """The ratio clip's bounds (1 - eps_low, 1 + eps_high) as Python floats (float64: each rounded once
    where it becomes float32)."""
    return 1.0 - float(eps_low), 1.0 + float(eps_high)


def check_clip_config(ratio_low, ratio_high, clip_ratio_c) -> None:
    """Raise a ValueError naming the field when a clip setting is out of range (Python numbers only)."""
    if isinstance(ratio_low, numbers.Real) and not 0.0 <= ratio_low <= 1.0:
        raise ValueError(f"clip ratio_low={ratio_low} (1 - eps_low) must be in [0, 1]")
    if isinstance(ratio_high, numbers.Real) and ratio_high < 1.0:
        raise ValueError(f"clip ratio_high={ratio_high} (1 + eps_high) must be >= 1")
    if isinstance(clip_ratio_c, numbers.Real) and clip_ratio_c != 0.0 and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c={clip_ratio_c} must be 0 (dual clip off) or > 1")


def dual_clip(clip_ratio_c):
    """The dual clip's c, or None where it is off (None, or a Python 0). A number > 1 or an array (a
    traced hyperparameter, `rl/hyper.py`) is on: whether it is on is structure, c itself may be data."""
    if clip_ratio_c is None or (isinstance(clip_ratio_c, numbers.Real) and clip_ratio_c == 0.0):
        return None
    return clip_ratio_c


def jit_clip(static_argnames: tuple[str, ...] = ()):
    """`jax.jit` of a clipped loss whose clip settings (`ratio_low`, `ratio_high`, `clip_ratio_c` where it has one)
    are traced: Python numbers or float32 arrays (hyperparameters as data, `rl/hyper.py`). Python numbers are
    checked first (`check_clip_config`: a ValueError naming the field); a Python 0 `clip_ratio_c` becomes None
    before the jit (`dual_clip`), so a dual clip that is off stays structure."""

    def wrap(fn):
        params = inspect.signature(fn).parameters
        default = {name: params[name].default for name in ("ratio_low", "ratio_high", "clip_ratio_c") if name in params}
        jitted = jax.jit(fn, static_argnames=static_argnames)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            clip = {name: kwargs.get(name, value) for name, value in default.items()}
            check_clip_config(clip.get("ratio_low"), clip.get("ratio_high"), clip.get("clip_ratio_c", 0.0))
            if "clip_ratio_c" in clip:
                kwargs["clip_ratio_c"] = dual_clip(clip["clip_ratio_c"])
            return jitted(*args, **kwargs)

        return call

    return wrap


def token_log_ratio(logp_br, logp_old_br):
    """clip(logp - logp_old, -20, 20), [B, R]."""
    return jnp.clip(logp_br - logp_old_br, -20.0, 20.0)


def sequence_log_ratio(logp_br, logp_old_br, mask_br):
    """GSPO log s_i = sum_t m (logp - logp_old) / max(|y_i|, 1), [B]."""
    m = as_mask(mask_br)
    diff_br = jnp.where(m > 0, logp_br - logp_old_br, 0.0)
    return jnp.sum(diff_br, axis=-1) / jnp.maximum(jnp.sum(m, axis=-1), 1.0)


def gspo_token_log_ratio(logp_br, logp_old_br, mask_br):
    """GSPO token form: value log s_i on every token, gradient d logp_t; clamped <= 10. [B, R]."""
    log_s_b = sequence_log_ratio(logp_br, logp_old_br, mask_br)
    log_s_br = logp_br - jax.lax.stop_gradient(logp_br) + jax.lax.stop_gradient(log_s_b)[:, None]
    return jnp.minimum(log_s_br, 10.0)


def clipped_surrogate(
    log_ratio_br,
    adv_br,
    *,
    ratio_low: float,
    ratio_high: float,
    clip_ratio_c: float = 0.0,
    lower_clip_negative_adv: bool = True,
):
    """Per-token clipped surrogate from a log ratio. Returns (loss_br, clipped_br, dual_clipped_br).

    `ratio_low`, `ratio_high` (the bounds 1 - eps_low, 1 + eps_high), `clip_ratio_c`: Python numbers
    (constants of the program) or float32 arrays (hyperparameters as data, `rl/hyper.py`); `clip_ratio_c`
    0 or None: no dual clip (`dual_clip`)."""
    check_clip_config(ratio_low, ratio_high, clip_ratio_c)
    ratio_br = jnp.exp(log_ratio_br)
    clipped_ratio_br = jnp.clip(ratio_br, ratio_low, ratio_high)
    unclipped_loss_br = -adv_br * ratio_br
    clipped_loss_br = -adv_br * clipped_ratio_br
    loss_br = jnp.maximum(unclipped_loss_br, clipped_loss_br)
    clipped_br = clipped_loss_br > unclipped_loss_br
    if not lower_clip_negative_adv:  # -A min(r, clip(r)): pipo_verl core_algos.py grpo_layback
        loss_br = -adv_br * jnp.minimum(ratio_br, clipped_ratio_br)
        clipped_br = clipped_ratio_br < ratio_br
    c = dual_clip(clip_ratio_c)
    if c is None:
        return loss_br, clipped_br, jnp.zeros_like(clipped_br)
    dual_loss_br = -adv_br * c
    dual_clipped_br = (adv_br < 0) & (loss_br > dual_loss_br)
    loss_br = jnp.where(adv_br < 0, jnp.minimum(loss_br, dual_loss_br), loss_br)
    return loss_br, clipped_br, dual_clipped_br


def finish_clipped(loss_br, clipped_br, dual_br, logp_br, logp_old_br, mask_br, agg: Aggregation):
    """(loss, metrics) of a clipped per-token loss [B, R]: aggregated with `agg`; "pg_loss", the clip
    fractions ("pg_clipfrac", "pg_clipfrac_lower": dual clip) and "ppo_kl" as token means over `agg.num_tokens`."""
    loss = aggregate(loss_br, mask_br, agg)
    num_tokens = agg.num_tokens
    metrics = {
        "pg_loss": loss,
        "pg_clipfrac": token_mean(clipped_br.astype(jnp.float32), mask_br, num_tokens),
        "pg_clipfrac_lower": token_mean(dual_br.astype(jnp.float32), mask_br, num_tokens),
        "ppo_kl": token_mean(jax.lax.stop_gradient(logp_old_br - logp_br), mask_br, num_tokens),
    }
    return loss, metrics


@jit_clip(static_argnames=("lower_clip_negative_adv",))
def token_clip_loss(
    logp_br,
    logp_old_br,
    adv_br,
    mask_br,
    *,
    agg: Aggregation,
    ratio_low: float = 1 - 0.2,
    ratio_high: float = 1 + 0.2,
    clip_ratio_c: float = 3.0,
    lower_clip_negative_adv: bool = True,
):
    """PPO/GRPO/DAPO token-ratio clipped loss with asymmetric eps and dual clip. (loss, metrics)."""
    loss_br, clipped_br, dual_br = clipped_surrogate(
        token_log_ratio(logp_br, logp_old_br),
        adv_br,
        ratio_low=ratio_low,
        ratio_high=ratio_high,
        clip_ratio_c=clip_ratio_c,
        lower_clip_negative_adv=lower_clip_negative_adv,
    )
    return finish_clipped(loss_br, clipped_br, dual_br, logp_br, logp_old_br, mask_br, agg)


@jit_clip(static_argnames=("lower_clip_negative_adv",))
def gspo_loss(
    logp_br,
    logp_old_br,
    adv_br,
    mask_br,
    *,
    agg: Aggregation = Aggregation("seq-mean-token-mean"),
    ratio_low: float = 1 - 3e-4,
    ratio_high: float = 1 + 4e-4,
    lower_clip_negative_adv: bool = True,
):
    """GSPO sequence-ratio clipped loss in the stop-gradient token form, no dual clip. (loss, metrics)."""
    loss_br, clipped_br, dual_br = clipped_surrogate(
        gspo_token_log_ratio(logp_br, logp_old_br, mask_br),
        adv_br,
        ratio_low=ratio_low,
        ratio_high=ratio_high,
        clip_ratio_c=0.0,
        lower_clip_negative_adv=lower_clip_negative_adv,
    )
    return finish_clipped(loss_br, clipped_br, dual_br, logp_br, logp_old_br, mask_br, agg)


@jit_clip()
def cispo_loss(
    logp_br,
    logp_old_br,
    adv_br,
    mask_br,
    *,
    agg: Aggregation = Aggregation("token-mean"),
    ratio_low: float = 1 - 0.2,
    ratio_high: float = 1 + 0.28,
):
    """CISPO: -sg(clip(r, ratio_low, ratio_high)) A logp per token, aggregated. (loss, metrics)."""
    check_clip_config(ratio_low, ratio_high, 0.0)
    ratio_br = jnp.exp(token_log_ratio(logp_br, logp_old_br))
    weight_br = jax.lax.stop_gradient(jnp.clip(ratio_br, ratio_low, ratio_high))
    loss_br = -weight_br * adv_br * logp_br
    clipped_br = (ratio_br < ratio_low) | (ratio_br > ratio_high)
    return finish_clipped(loss_br, clipped_br, jnp.zeros_like(clipped_br), logp_br, logp_old_br, mask_br, agg)
