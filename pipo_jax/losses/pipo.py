"""The PI step's math (paper Eqs. 7 and 11): attributions a_t of a batch and the PI loss on
the stored batch B_{t-1}. The controller that decides when it runs and with which coefficient
(the window of mean rewards, xi, c = phi_lam(xi), the stored batch) is `pipo_jax/rl/controller.py`.

    group attribution a_i = G * abar_i / max(sum_j |abar_j|, 1e-6), abar_i = token mean of A_i
    PPO attribution = its GAE advantages; SDPO = `distill.token_attribution`
    rhat = a_{t-1} * c;  PI loss = clipped surrogate with rhat as the advantage and the ratio
    to the stored behaviour log-probs (token ratio, or GSPO's sequence ratio).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pipo_jax.config.registry import register_names
from pipo_jax.losses.aggregation import Aggregation
from pipo_jax.losses.masking import as_mask, masked_mean
from pipo_jax.losses.policy import dual_clip, gspo_loss, jit_clip, token_clip_loss

ATTRIBUTION_DENOM_FLOOR = 1e-6
RHAT_CLAMP = 10.0  # authors: torch.clamp(coefficients, -10, 10)
ATTRIBUTION_NORMS = ("none", "mean_abs")
register_names("attribution_norm", *ATTRIBUTION_NORMS)  # `config/registry.py`: the schema's choices


@functools.partial(jax.jit, static_argnames=("group_size", "additive_eps"))
def group_attribution(adv_br, mask_br, group_size: int, additive_eps: bool = False):
    """Group-normalised attribution a_i = G * abar_i / max(sum_j |abar_j|, 1e-6), on valid tokens. [B, R].

    abar_i is the token mean of A_i over row i's valid tokens (0 for an empty row); groups are
    `group_size` contiguous rows. sum_i |a_i| = G within every group with a nonzero signal.
    `additive_eps` (authors' code): divide by sum_j |abar_j| + 1e-6 instead.
    """
    m = as_mask(mask_br)
    if group_size < 1 or m.shape[0] % group_size:
        raise ValueError(f"group_size={group_size} does not divide the batch of {m.shape[0]} responses")
    abar_pg = masked_mean(adv_br, m, axis=-1).reshape(-1, group_size)
    abs_sum_p1 = jnp.sum(jnp.abs(abar_pg), axis=-1, keepdims=True)
    if additive_eps:
        denom_p1 = abs_sum_p1 + ATTRIBUTION_DENOM_FLOOR
    else:
        denom_p1 = jnp.maximum(abs_sum_p1, ATTRIBUTION_DENOM_FLOOR)
    a_b = (group_size * abar_pg / denom_p1).reshape(-1)
    return a_b[:, None] * m


def gae_attribution(adv_br, mask_br):
    """PPO's attribution: its (whitened) GAE advantages on valid tokens. [B, R]."""
    return jnp.where(as_mask(mask_br) > 0, adv_br, 0.0)


def pi_rewards(attr_br, c, mask_br, *, xi=None, lam: float | None = None, clamp: bool = False,
               no_lam: bool = False):
    """PI rewards rhat = a_{t-1} * c on the stored batch's valid tokens. [B, R].

    `clamp` (authors' code): rhat = clamp(a * xi, -10, 10) * (lam if xi < 0 else 1) (needs xi, lam).
    `no_lam` (authors' PPO, `ppo_pi_no_lam`): xi in place of c = phi_lam(xi), and with `clamp`
    no lam factor: rhat = a * xi, or clamp(a * xi, -10, 10) (needs xi).
    """
    valid = as_mask(mask_br) > 0
    if no_lam and xi is None:
        raise ValueError("pi_rewards(no_lam=True) needs xi")
    if not clamp:
        return jnp.where(valid, attr_br * (xi if no_lam else c), 0.0)
    if xi is None or (lam is None and not no_lam):
        raise ValueError("pi_rewards(clamp=True) needs xi and lam")
    rhat = jnp.clip(attr_br * xi, -RHAT_CLAMP, RHAT_CLAMP)
    if not no_lam:
        rhat = rhat * jnp.where(xi >= 0, 1.0, lam)
    return jnp.where(valid, rhat, 0.0)


def normalise_attribution(attr_br, mask_br):
    """`pipo.attribution_norm=mean_abs`: a / mean |a| over the valid tokens of the rows that
    carry a signal (any nonzero a; SDPO: the rows with a teacher context), floor 1e-6. [B, R].

    Puts an unbounded attribution (SDPO's log-ratio logp_T - logp_S) on the scale of the
    group attribution (mean |a| = 1 over the responses of a group with a signal), so the PI
    step's gradient per unit of c is comparable across algorithms; signs and the ratios
    between tokens are kept.
    """
    m = as_mask(mask_br)
    attr_br = jnp.where(m > 0, attr_br, 0.0)
    rows_b = jnp.any(attr_br != 0, axis=-1)
    w = m * rows_b[:, None]
    mean_abs = jnp.sum(jnp.abs(attr_br) * w) / jnp.maximum(jnp.sum(w), 1.0)
    return attr_br / jnp.maximum(mean_abs, ATTRIBUTION_DENOM_FLOOR)


def signal_rows(attr_br, mask_br):
    """f32 [B]: 1 where the row carries a PI signal (a nonzero attribution on a valid token).
    For SDPO these are the rows with a teacher context (`sd_mask`), up to a row whose teacher
    and student log-probs agree exactly on every token (whose rhat is 0 either way)."""
    return jnp.any((as_mask(mask_br) > 0) & (attr_br != 0), axis=-1).astype(jnp.float32)


@jit_clip(static_argnames=("ratio", "no_lower_clip"))
def pi_surrogate_loss(
    logp_br,
    logp_old_br,
    rhat_br,
    mask_br,
    *,
    ratio: str = "token",
    ratio_low: float = 1 - 0.2,
    ratio_high: float = 1 + 0.2,
    clip_ratio_c: float = 0.0,
    no_lower_clip: bool = False,
    agg: Aggregation,
):
    """PI surrogate (paper Eq. 11) on B_{t-1}: -min(nu rhat, clip(nu) rhat), aggregated. (loss, metrics).

    `ratio="token"`: nu = exp(logp - logp_old) per token (PPO/GRPO/DAPO/SDPO);
    `ratio="sequence"`: GSPO's sequence ratio in token form. `logp_old_br` are the stored
    behaviour log-probs of B_{t-1}. Eq. 11 has no dual clip (`clip_ratio_c=0`); pass the base
    value to mirror a dual-clipped base loss. `ratio_low`, `ratio_high`: the clip's bounds
    1 - eps_low, 1 + eps_high (the authors' symmetric clip is `ratio_high` 1 + eps_low,
    `rl/hyper.py:pi_ratio_bounds`). Authors' code, token ratio only (their GSPO PI loss keeps both
    clips): `no_lower_clip` gives -min(nu, clip(nu)) * rhat.
    """
    token = ratio == "token"
    common = {
        "ratio_low": ratio_low,
        "ratio_high": ratio_high,
        "lower_clip_negative_adv": not (no_lower_clip and token),
        "agg": agg,
    }
    if ratio == "token":
        return token_clip_loss(logp_br, logp_old_br, rhat_br, mask_br, clip_ratio_c=clip_ratio_c, **common)
    if ratio == "sequence":
        if dual_clip(clip_ratio_c) is not None:
            raise ValueError("pi clip_ratio_c must be 0 with ratio='sequence' (GSPO has no dual clip)")
        return gspo_loss(logp_br, logp_old_br, rhat_br, mask_br, **common)
    raise ValueError(f"pi ratio={ratio!r} must be 'token' or 'sequence'")
