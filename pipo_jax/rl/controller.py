"""The PIPO controller (docs/math.md §2; paper Sec. 4, Eqs. 8-10) as pure functions of a fixed-shape pytree.

State (`PipoState`, a flax struct so it rides through jit / lax.scan / orbax):
    mu_window_k  f32 [K]  batch mean rewards of previous iterations, most recent LAST
                          (a shift register); the valid entries are mu_window_k[K - count:]
    count        i32 []   number of valid entries, saturating at K
    has_prev     bool []  whether `prev` holds a real batch
    prev         the stored batch B_{t-1}: a pytree of fixed shapes with `attr_br` and `mask_br`
                 [B, R] fields (the learner's `rl/batch.py:TrainBatch` cut to `STORED_FIELDS`
                 by `batch.stored`: tokens / masks, behaviour and reference log-probs, a_{t-1})

Per iteration t (`rl/learn.py` drives it):
    xi, c, mu_his, sigma_his = improvement_signal(mu_t, state.mu_window_k, state.count, lam=, ddof=)
    if pi_step_ready(state, c, xi):   # window full, has_prev, c != 0
        rhat_br = pi_rewards(state.prev.attr_br, c, state.prev.mask_br)      # losses/pipo.py
        loss = pi_surrogate_loss(logp_br, state.prev.logp_old_br, rhat_br, ...)  # losses/pipo.py
    ... base step on B_t ...
    state = push(state, mu_t, B_t with its attributions a_t, laid out like `state.prev`)

Formulas (paper default):
    mu_his = mean(window); sigma_his = std(window, ddof=1); sigma < 1e-8 -> 1.0
    xi = (mu_t - mu_his) / sigma_his;  c = phi_lam(xi) = xi if xi >= 0 else lam * xi

`PipoOptions` names each place where the authors' released code (JacckMa/pipo_verl) departs
from these formulas; every one is off by default and can be switched on alone.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from pipo_jax.losses.pipo import pi_rewards

SIGMA_FLOOR = 1e-8


class PipoOptions(NamedTuple):
    """The authors' code's behaviours (JacckMa/pipo_verl), each a switch; all False = the paper.
    Each is described once, by its config key (`config/sections.py:AuthorsConfig`, `pipo.authors.<name>`).
    """

    window_twice: bool = False
    std_ddof0: bool = False
    xi_clip: bool = False
    pi_no_lower_clip: bool = False
    rhat_clamp: bool = False
    run_at_xi_zero: bool = False
    pi_symmetric_clip: bool = False
    attribution_eps_add: bool = False
    ppo_pi_no_lam: bool = False
    ppo_sign_attribution: bool = False
    ppo_adv_gate: bool = False
    micro_token_mean: bool = False

    @property
    def ddof(self) -> int:
        return 0 if self.std_ddof0 else 1


AUTHORS_BEHAVIOURS = PipoOptions._fields
XI_DIFF_CLIP = 5.0  # authors: np.clip(mu_t - rho, -5, 5)
AUTHORS_SIGMA_FLOOR = 1e-6  # authors: compute_layback_coefficients(epsilon=1e-6)
PPO_GATE_CLIP = 2.0  # authors: ppo_gate_min / ppo_gate_max = -2 / 2 (layback_utils.py:234-239)


def pipo_options(compat: bool = False, **behaviours: bool | None) -> PipoOptions:
    """The behaviours named true / false as named; the others (unnamed or None) on with
    `compat=True` (every behaviour of the authors' code), off without (the paper)."""
    unknown = sorted(set(behaviours) - set(AUTHORS_BEHAVIOURS))
    if unknown:
        raise ValueError(f"unknown PIPO behaviour {unknown[0]!r}; expected one of {AUTHORS_BEHAVIOURS}")
    return PipoOptions(**{k: bool(compat) if behaviours.get(k) is None else bool(behaviours[k])
                          for k in AUTHORS_BEHAVIOURS})


def options_of(pipo: Any) -> PipoOptions:
    """The behaviours of a `config.pipo` section (`config/sections.py:PipoConfig`): `compat`, then each of
    `pipo.authors` that is set."""
    return pipo_options(pipo.compat, **{name: getattr(pipo.authors, name) for name in AUTHORS_BEHAVIOURS})


@struct.dataclass
class PipoState:
    """Controller state; see the module docstring for the field layout."""

    mu_window_k: jax.Array
    count: jax.Array
    has_prev: jax.Array
    prev: Any  # the stored batch (see the module docstring)

    @property
    def window_size(self) -> int:
        return self.mu_window_k.shape[-1]


STORED_READS = ("attr_br", "mask_br")  # the fields of the stored batch the controller reads


def init_pipo_state(window_size: int, batch_template: Any) -> PipoState:
    """Empty state: zero window, count 0, has_prev False, `prev` zeros shaped like `batch_template`
    (a pytree with `attr_br` and `mask_br` fields; leaves arrays or `jax.ShapeDtypeStruct`s)."""
    if int(window_size) < 1:
        raise ValueError(f"pipo window_size K={window_size} must be >= 1")
    missing = [f for f in STORED_READS if getattr(batch_template, f, None) is None]
    if missing:
        raise TypeError(f"batch_template ({type(batch_template).__name__}) lacks the stored field(s) {missing}")
    prev = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), batch_template)
    return PipoState(
        mu_window_k=jnp.zeros((int(window_size),), jnp.float32),
        count=jnp.zeros((), jnp.int32),
        has_prev=jnp.zeros((), bool),
        prev=prev,
    )


def _path_name(path) -> str:
    return "".join(str(p) for p in path) or "<root>"


def _conform(batch: Any, template: Any) -> Any:
    """Check `batch` has the template's type, fields and shapes (clear error naming the field); cast dtypes."""
    if type(batch) is not type(template):
        raise TypeError(f"push(batch=...) must be a {type(template).__name__} like the stored one, "
                        f"got {type(batch).__name__}")
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
def push(state: PipoState, mu, batch: Any) -> PipoState:
    """Append mu_t to the window (dropping the oldest), store B_t, set has_prev. Pure."""
    window_k = jnp.concatenate([state.mu_window_k[1:], jnp.asarray(mu, jnp.float32).reshape(1)])
    return PipoState(
        mu_window_k=window_k,
        count=jnp.minimum(state.count + 1, state.window_size).astype(jnp.int32),
        has_prev=jnp.ones((), bool),
        prev=_conform(batch, state.prev),
    )


@jax.jit
def push_mean(state: PipoState, mu) -> PipoState:
    """Append mu_t to the window only (the authors' first push of each iteration, `window_twice`)."""
    window_k = jnp.concatenate([state.mu_window_k[1:], jnp.asarray(mu, jnp.float32).reshape(1)])
    return state.replace(mu_window_k=window_k,
                         count=jnp.minimum(state.count + 1, state.window_size).astype(jnp.int32))


def window_statistics(window_k, count, *, ddof: int):
    """(mu_his, sigma_raw) over the valid (last `count`) entries; std with `ddof`, no fallback.

    Computed on deviations from the newest entry (shifted data), so a window whose valid
    entries are all equal has mu_his equal to them and sigma_raw = 0 exactly, whatever
    their float32 rounding (a plain mean of K copies of 0.4 is off by an ulp, and its
    "std" of ~3e-8 passes a 1e-8 floor: xi ~ 1e6). With count <= ddof the std is 0 (and
    the fallback of `improvement_signal` applies).
    """
    window_k = jnp.asarray(window_k, jnp.float32)
    k = window_k.shape[-1]
    count = jnp.asarray(count)
    valid_k = jnp.arange(k) >= k - count[..., None]
    n = jnp.maximum(count, 1).astype(jnp.float32)
    dev_k = jnp.where(valid_k, window_k - window_k[..., -1:], 0.0)
    mean_dev = jnp.sum(dev_k, axis=-1) / n
    sq = jnp.where(valid_k, jnp.square(dev_k - mean_dev[..., None]), 0.0)
    dof = jnp.maximum(count - ddof, 1).astype(jnp.float32)
    mu_his = jnp.where(count > 0, window_k[..., -1] + mean_dev, 0.0)  # the newest entry is valid when count >= 1
    return mu_his, jnp.sqrt(jnp.sum(sq, axis=-1) / dof)


def rectify(xi, lam: float):
    """phi_lam(xi) = xi if xi >= 0 else lam * xi."""
    return jnp.where(xi >= 0, xi, lam * xi)


@functools.partial(jax.jit, static_argnames=("ddof", "xi_clip"))
def improvement_signal(mu_t, window_k, count, *, lam: float = 0.1, ddof: int = 1, xi_clip: bool = False):
    """Standardised improvement feedback (paper Eqs. 8-10). Returns (xi, c, mu_his, sigma_his).

    `window_k` [K] holds previous means, most recent last, valid entries the last `count`.
    sigma_his is the std actually divided by: std(window, ddof), or 1.0 when that is < 1e-8.
    Until the window holds K means (count < K) there is no signal: xi = c = 0 (mu_his and
    sigma_his are still the statistics of the valid entries, for logging). `xi_clip` (authors'
    code): xi = clip(mu_t - mu_his, -5, 5) / sigma_his with the 1.0 fallback below 1e-6.
    """
    if ddof not in (0, 1):
        raise ValueError(f"pipo ddof={ddof!r} must be 1 (paper) or 0 (authors' code)")
    window_k = jnp.asarray(window_k, jnp.float32)
    mu_his, sigma_raw = window_statistics(window_k, count, ddof=ddof)
    sigma_his = jnp.where(sigma_raw < (AUTHORS_SIGMA_FLOOR if xi_clip else SIGMA_FLOOR), 1.0, sigma_raw)
    ready = jnp.asarray(count) >= window_k.shape[-1]
    diff = jnp.asarray(mu_t, jnp.float32) - mu_his
    if xi_clip:
        diff = jnp.clip(diff, -XI_DIFF_CLIP, XI_DIFF_CLIP)
    xi = jnp.where(ready, diff / sigma_his, 0.0)
    return xi, rectify(xi, lam), mu_his, sigma_his


def window_full(state: PipoState):
    """The window holds K previous means and a previous batch is stored. bool []."""
    return (state.count >= state.window_size) & state.has_prev


def pi_step_ready(state: PipoState, c, xi=None, *, run_at_xi_zero: bool = False):
    """Whether the PI (verification) step runs: window full, has_prev, and c != 0.

    `run_at_xi_zero` (authors' code) also runs it when xi == 0 exactly (needs `xi`).
    """
    nonzero = c != 0
    if run_at_xi_zero:
        if xi is None:
            raise ValueError("pi_step_ready(run_at_xi_zero=True) needs xi")
        nonzero = nonzero | (xi == 0)
    return window_full(state) & nonzero


def ppo_gate(mu_t, window_k, count, *, ddof: int = 1, xi_clip: bool = False):
    """The authors' PPO gate phi = clip(xi_gate, -2, 2) (`compute_ppo_layback_coefficients`,
    layback_utils.py:204-253), xi_gate from mu_t and the window as it stands (no fill needed).

    Over the last `count` entries: mu_his = their mean (mu_t itself when count == 0, so xi = 0
    and the gate is 0); sigma = their std with `ddof` (1.0 when count < 2 or below the floor:
    1e-8, with `xi_clip` 1e-6); with `xi_clip` the difference is clipped to [-5, 5] first.
    Their code: np.std (ddof 0), the 1e-6 floor and the clip, i.e. `std_ddof0` and `xi_clip`
    on. Returns (gate, xi_gate).
    """
    window_k = jnp.asarray(window_k, jnp.float32)
    count = jnp.asarray(count)
    mu_his, sigma_raw = window_statistics(window_k, count, ddof=ddof)
    mu_t = jnp.asarray(mu_t, jnp.float32)
    mu_his = jnp.where(count > 0, mu_his, mu_t)
    floor = AUTHORS_SIGMA_FLOOR if xi_clip else SIGMA_FLOOR
    sigma = jnp.where((count < 2) | (sigma_raw < floor), 1.0, sigma_raw)
    diff = mu_t - mu_his
    if xi_clip:
        diff = jnp.clip(diff, -XI_DIFF_CLIP, XI_DIFF_CLIP)
    xi = diff / sigma
    return jnp.clip(xi, -PPO_GATE_CLIP, PPO_GATE_CLIP), xi


@functools.partial(jax.jit, static_argnames=("options", "ppo"))
def pi_verification(state: PipoState, mu_t, *, lam: float = 0.1, options: PipoOptions = PipoOptions(),
                    ppo: bool = False):
    """Step 3 of docs/math.md §2 in one call: the signal, the go/no-go and the PI rewards for `state.prev`.

    Returns (rhat_br, metrics) with metrics {"mu_t", "mu_his", "sigma_his", "xi", "c",
    "pi_step_applied"}; rhat_br is zero when the step does not apply. With
    `options.window_twice` the caller has already pushed mu_t (`push_mean`). `ppo`: the base
    algorithm is PPO (the authors' `ppo_layback` path), where `options.ppo_pi_no_lam` applies.
    """
    xi, c, mu_his, sigma_his = improvement_signal(
        mu_t, state.mu_window_k, state.count, lam=lam, ddof=options.ddof, xi_clip=options.xi_clip
    )
    apply = pi_step_ready(state, c, xi, run_at_xi_zero=options.run_at_xi_zero)
    rhat_br = pi_rewards(state.prev.attr_br, c, state.prev.mask_br, xi=xi, lam=lam, clamp=options.rhat_clamp,
                         no_lam=ppo and options.ppo_pi_no_lam)
    rhat_br = jnp.where(apply, rhat_br, 0.0)
    metrics = {
        "mu_t": jnp.asarray(mu_t, jnp.float32),
        "mu_his": mu_his,
        "sigma_his": sigma_his,
        "xi": xi,
        "c": c,
        "pi_step_applied": apply,
    }
    return rhat_br, metrics
