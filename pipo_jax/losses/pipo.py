"""The PIPO controller (SPEC 2; paper Sec. 4, Eqs. 7-11) as pure functions of a fixed-shape pytree.

State (`PipoState`, a flax struct so it rides through jit / lax.scan / orbax):
    mu_window_k  f32 [K]  batch mean rewards of previous iterations, most recent LAST
                          (a shift register); the valid entries are mu_window_k[K - count:]
    count        i32 []   number of valid entries, saturating at K
    has_prev     bool []  whether `prev` holds a real batch
    prev         StoredBatch  the previous batch B_{t-1} (fixed shapes, see `StoredBatch`)

Per iteration t (the trainer drives it):
    xi, c, mu_his, sigma_his = improvement_signal(mu_t, state.mu_window_k, state.count, lam=, ddof=)
    if pi_step_ready(state, c, compat=):   # window full, has_prev, c != 0 (compat: run anyway)
        rhat_bt = pi_rewards(state.prev.attr_bt, c, state.prev.mask_bt)
        loss = pi_surrogate_loss(logp_bt, state.prev.logp_old_bt, rhat_bt, state.prev.mask_bt, ...)
    ... base step on B_t ...
    state = push(state, mu_t, StoredBatch(B_t with its attributions a_t))

Formulas (paper default; `compat=True` gives the authors' code, see `pipo_options`):
    mu_his = mean(window); sigma_his = std(window, ddof=1) (compat: ddof=0); sigma < 1e-8 -> 1.0
    xi = (mu_t - mu_his) / sigma_his;  c = phi_lam(xi) = xi if xi >= 0 else lam * xi
    group attribution a_i = G * abar_i / max(sum_j |abar_j|, 1e-6), abar_i = token mean of A_i
    PPO attribution = its GAE advantages; SDPO = `distill.token_attribution`
    rhat = a_{t-1} * c;  PI loss = clipped surrogate with rhat as the advantage and the ratio
    to the stored behaviour log-probs (token ratio, or GSPO's sequence ratio).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from pipo_jax.losses.masking import as_mask, masked_mean
from pipo_jax.losses.policy import gspo_loss, token_clip_loss

SIGMA_FLOOR = 1e-8
ATTRIBUTION_DENOM_FLOOR = 1e-6


class PipoOptions(NamedTuple):
    """Behaviour switched by `compat` (paper default vs. the authors' pipo_verl code)."""

    ddof: int  # window std: 1 (paper Eq. 8) / 0 (compat)
    run_when_c_zero: bool  # c == 0 exactly: skip the PI step (paper) / run it anyway (compat)
    lower_clip_negative_adv: bool  # PI surrogate keeps the lower clip for rhat < 0 (paper) / not (compat)


def pipo_options(compat: bool = False) -> PipoOptions:
    """The three `compat` switches of SPEC 2."""
    if compat:
        return PipoOptions(ddof=0, run_when_c_zero=True, lower_clip_negative_adv=False)
    return PipoOptions(ddof=1, run_when_c_zero=False, lower_clip_negative_adv=True)


@struct.dataclass
class StoredBatch:
    """The previous batch B_{t-1} kept for verification. All leaves have fixed shapes.

    tokens_bt          int [B, L]   prompt + response tokens as fed to the model
    attention_mask_bt  [B, L]       1 = real token (prompt or response)
    mask_bt            [B, T]       response mask aligned with the log-probs below
    logp_old_bt        f32 [B, T]   behaviour log-probs (theta_{t-1}, before its updates)
    logp_ref_bt        f32 [B, T]   reference-policy log-probs (for the KL term)
    attr_bt            f32 [B, T]   local attributions a_{t-1} (`ATTRIBUTIONS` in the registry)
    extras             dict         anything else the PI step needs, e.g. SDPO teacher inputs
                                    ("teacher_tokens_bt", "sd_mask_b"), positions, values
    """

    tokens_bt: Any
    attention_mask_bt: Any
    mask_bt: Any
    logp_old_bt: Any
    logp_ref_bt: Any
    attr_bt: Any
    extras: dict = struct.field(default_factory=dict)


@struct.dataclass
class PipoState:
    """Controller state; see the module docstring for the field layout."""

    mu_window_k: jax.Array
    count: jax.Array
    has_prev: jax.Array
    prev: StoredBatch

    @property
    def window_size(self) -> int:
        return self.mu_window_k.shape[-1]


def init_pipo_state(window_size: int, batch_template: StoredBatch) -> PipoState:
    """Empty state: zero window, count 0, has_prev False, `prev` zeros shaped like `batch_template`.

    `batch_template` leaves may be arrays or `jax.ShapeDtypeStruct`s.
    """
    if int(window_size) < 1:
        raise ValueError(f"pipo window_size K={window_size} must be >= 1")
    if not isinstance(batch_template, StoredBatch):
        raise TypeError(f"batch_template must be a StoredBatch, got {type(batch_template).__name__}")
    prev = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), batch_template)
    return PipoState(
        mu_window_k=jnp.zeros((int(window_size),), jnp.float32),
        count=jnp.zeros((), jnp.int32),
        has_prev=jnp.zeros((), bool),
        prev=prev,
    )


def _path_name(path) -> str:
    return "".join(str(p) for p in path) or "<root>"


def _conform(batch: StoredBatch, template: StoredBatch) -> StoredBatch:
    """Check `batch` has the template's fields and shapes (clear error naming the field); cast dtypes."""
    if not isinstance(batch, StoredBatch):
        raise TypeError(f"push(batch=...) must be a StoredBatch, got {type(batch).__name__}")
    t_leaves, t_def = jax.tree_util.tree_flatten_with_path(template)
    b_leaves, b_def = jax.tree_util.tree_flatten_with_path(batch)
    if t_def != b_def:
        t_names = sorted(_path_name(p) for p, _ in t_leaves)
        b_names = sorted(_path_name(p) for p, _ in b_leaves)
        raise ValueError(f"stored batch fields {b_names} differ from the PipoState template {t_names}")
    out = []
    for (path, t), (_, b) in zip(t_leaves, b_leaves):
        if tuple(jnp.shape(b)) != tuple(t.shape):
            raise ValueError(
                f"stored batch field {_path_name(path)} has shape {tuple(jnp.shape(b))}, "
                f"the PipoState template has {tuple(t.shape)} (pad batches to fixed shapes)"
            )
        out.append(jnp.asarray(b).astype(t.dtype))
    return jax.tree_util.tree_unflatten(t_def, out)


@jax.jit
def push(state: PipoState, mu, batch: StoredBatch) -> PipoState:
    """Append mu_t to the window (dropping the oldest), store B_t, set has_prev. Pure."""
    window_k = jnp.concatenate([state.mu_window_k[1:], jnp.asarray(mu, jnp.float32).reshape(1)])
    return PipoState(
        mu_window_k=window_k,
        count=jnp.minimum(state.count + 1, state.window_size).astype(jnp.int32),
        has_prev=jnp.ones((), bool),
        prev=_conform(batch, state.prev),
    )


def window_statistics(window_k, count, *, ddof: int):
    """(mu_his, sigma_raw) over the valid (last `count`) entries; std with `ddof`, no fallback.

    With count <= ddof the std is 0 (and the fallback of `improvement_signal` applies).
    """
    window_k = jnp.asarray(window_k, jnp.float32)
    k = window_k.shape[-1]
    count = jnp.asarray(count)
    valid_k = jnp.arange(k) >= k - count[..., None]
    n = jnp.maximum(count, 1).astype(jnp.float32)
    mu_his = jnp.sum(jnp.where(valid_k, window_k, 0.0), axis=-1) / n
    sq = jnp.where(valid_k, jnp.square(window_k - mu_his[..., None]), 0.0)
    dof = jnp.maximum(count - ddof, 1).astype(jnp.float32)
    return mu_his, jnp.sqrt(jnp.sum(sq, axis=-1) / dof)


def rectify(xi, lam: float):
    """phi_lam(xi) = xi if xi >= 0 else lam * xi."""
    return jnp.where(xi >= 0, xi, lam * xi)


@functools.partial(jax.jit, static_argnames=("lam", "ddof"))
def improvement_signal(mu_t, window_k, count, *, lam: float = 0.1, ddof: int = 1):
    """Standardised improvement feedback (paper Eqs. 8-10). Returns (xi, c, mu_his, sigma_his).

    `window_k` [K] holds previous means, most recent last, valid entries the last `count`.
    sigma_his is the std actually divided by: std(window, ddof), or 1.0 when that is < 1e-8.
    Until the window holds K means (count < K) there is no signal: xi = c = 0 (mu_his and
    sigma_his are still the statistics of the valid entries, for logging).
    """
    if ddof not in (0, 1):
        raise ValueError(f"pipo ddof={ddof!r} must be 1 (paper) or 0 (compat)")
    window_k = jnp.asarray(window_k, jnp.float32)
    mu_his, sigma_raw = window_statistics(window_k, count, ddof=ddof)
    sigma_his = jnp.where(sigma_raw < SIGMA_FLOOR, 1.0, sigma_raw)
    ready = jnp.asarray(count) >= window_k.shape[-1]
    xi = jnp.where(ready, (jnp.asarray(mu_t, jnp.float32) - mu_his) / sigma_his, 0.0)
    return xi, rectify(xi, lam), mu_his, sigma_his


def window_full(state: PipoState):
    """The window holds K previous means and a previous batch is stored. bool []."""
    return (state.count >= state.window_size) & state.has_prev


def pi_step_ready(state: PipoState, c, *, compat: bool = False):
    """Whether the PI (verification) step runs: window full, has_prev, and c != 0 unless compat."""
    nonzero = jnp.ones((), bool) if pipo_options(compat).run_when_c_zero else (c != 0)
    return window_full(state) & nonzero


@functools.partial(jax.jit, static_argnames=("group_size",))
def group_attribution(adv_bt, mask_bt, group_size: int):
    """Group-normalised attribution a_i = G * abar_i / max(sum_j |abar_j|, 1e-6), on valid tokens. [B, T].

    abar_i is the token mean of A_i over row i's valid tokens (0 for an empty row); groups are
    `group_size` contiguous rows. sum_i |a_i| = G within every group with a nonzero signal.
    """
    m = as_mask(mask_bt)
    if group_size < 1 or m.shape[0] % group_size:
        raise ValueError(f"group_size={group_size} does not divide the batch of {m.shape[0]} responses")
    abar_pg = masked_mean(adv_bt, m, axis=-1).reshape(-1, group_size)
    denom_p1 = jnp.maximum(jnp.sum(jnp.abs(abar_pg), axis=-1, keepdims=True), ATTRIBUTION_DENOM_FLOOR)
    a_b = (group_size * abar_pg / denom_p1).reshape(-1)
    return a_b[:, None] * m


def gae_attribution(adv_bt, mask_bt):
    """PPO's attribution: its (whitened) GAE advantages on valid tokens. [B, T]."""
    return jnp.where(as_mask(mask_bt) > 0, adv_bt, 0.0)


def pi_rewards(attr_bt, c, mask_bt):
    """PI rewards rhat = a_{t-1} * c on the stored batch's valid tokens. [B, T]."""
    return jnp.where(as_mask(mask_bt) > 0, attr_bt * c, 0.0)


@functools.partial(
    jax.jit,
    static_argnames=("ratio", "eps_low", "eps_high", "clip_ratio_c", "compat", "loss_agg_mode", "norm_length"),
)
def pi_surrogate_loss(
    logp_bt,
    logp_old_bt,
    rhat_bt,
    mask_bt,
    *,
    ratio: str = "token",
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio_c: float = 0.0,
    compat: bool = False,
    loss_agg_mode: str,
    num_tokens=None,
    num_seqs=None,
    norm_length=None,
):
    """PI surrogate (paper Eq. 11) on B_{t-1}: -min(nu rhat, clip(nu) rhat), aggregated. (loss, metrics).

    `ratio="token"`: nu = exp(logp - logp_old) per token (PPO/GRPO/DAPO/SDPO);
    `ratio="sequence"`: GSPO's sequence ratio in token form. `logp_old_bt` are the stored
    behaviour log-probs of B_{t-1}. Eq. 11 has no dual clip (`clip_ratio_c=0`); pass the base
    value to mirror a dual-clipped base loss. `compat` drops the lower clip for rhat < 0.
    """
    lower = pipo_options(compat).lower_clip_negative_adv
    common = {
        "eps_low": eps_low,
        "eps_high": eps_high,
        "lower_clip_negative_adv": lower,
        "loss_agg_mode": loss_agg_mode,
        "num_tokens": num_tokens,
        "num_seqs": num_seqs,
        "norm_length": norm_length,
    }
    if ratio == "token":
        return token_clip_loss(logp_bt, logp_old_bt, rhat_bt, mask_bt, clip_ratio_c=clip_ratio_c, **common)
    if ratio == "sequence":
        if clip_ratio_c:
            raise ValueError("pi clip_ratio_c must be 0 with ratio='sequence' (GSPO has no dual clip)")
        return gspo_loss(logp_bt, logp_old_bt, rhat_bt, mask_bt, **common)
    raise ValueError(f"pi ratio={ratio!r} must be 'token' or 'sequence'")


@functools.partial(jax.jit, static_argnames=("lam", "compat"))
def pi_verification(state: PipoState, mu_t, *, lam: float = 0.1, compat: bool = False):
    """Step 3 of SPEC 2 in one call: the signal, the go/no-go and the PI rewards for `state.prev`.

    Returns (rhat_bt, metrics) with metrics {"mu_t", "mu_his", "sigma_his", "xi", "c",
    "pi_step_applied"}; rhat_bt is zero when the step does not apply.
    """
    xi, c, mu_his, sigma_his = improvement_signal(
        mu_t, state.mu_window_k, state.count, lam=lam, ddof=pipo_options(compat).ddof
    )
    apply = pi_step_ready(state, c, compat=compat)
    rhat_bt = jnp.where(apply, pi_rewards(state.prev.attr_bt, c, state.prev.mask_bt), 0.0)
    metrics = {
        "mu_t": jnp.asarray(mu_t, jnp.float32),
        "mu_his": mu_his,
        "sigma_his": sigma_his,
        "xi": xi,
        "c": c,
        "pi_step_applied": apply,
    }
    return rhat_bt, metrics
