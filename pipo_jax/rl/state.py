"""`TrainState`: everything a run carries between iterations, as one pytree.

Policy params and AdamW state, the frozen reference params, the PPO critic (params +
its optimizer state), the SDPO EMA teacher, the PIPO controller state, the advantage
estimator's carried state (BNPO), the RNG key, the iteration counter and the hyperparameters the
learner reads as data (`rl/hyper.py:Hyperparameters`: learning rates, PIPO's lam, clip ranges, KL
and entropy weights). Checkpoints save exactly this tree, so a resumed run continues bit-exactly
(a restore sets `hyper` from the run's config: `run/placement.py:Placement.restore`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from pipo_jax.losses import vpd as vpd_loss
from pipo_jax.rl import controller
from pipo_jax.rl.batch import TrainBatch, stored_template
from pipo_jax.rl.hyper import Hyperparameters, hyperparameters_of
from pipo_jax.config.sections import VpdConfig
from pipo_jax.rl.spec import TrainSpec


@struct.dataclass
class TrainState:
    step: jax.Array  # int32 [], iterations done
    params: Any
    opt_state: Any
    ref_params: Any
    critic: Any  # None, or {"params": {"backbone", "value_head"}, "opt_state"} (PPO)
    teacher_params: Any  # None, or the SDPO / VPD teacher
    pipo: controller.PipoState
    rng: jax.Array
    teacher_opt_state: Any = None  # VPD: the E-step's AdamW state
    vpd_delta: Any = None  # VPD: running mean of implicit rewards (losses.vpd.DeltaState)
    pi_opt_state: Any = None  # `pipo.pi_optimizer=separate`: the PI step's own AdamW state
    # The advantage estimator's state across iterations (`algorithms.CarriedState`; BNPO's pool of success
    # rates, `losses/bnpo.py:BnpoState`), replicated; None for an estimator without one.
    estimator_state: Any = None
    # The hyperparameters the learner reads as data, not from the spec (`rl/hyper.py`), replicated.
    hyper: Hyperparameters | None = None


def skip_nonfinite(inner: optax.GradientTransformation, applies=None) -> optax.GradientTransformation:
    """`inner` whose update is skipped (zero updates, inner state unchanged) when the gradients
    hold a NaN / inf, counted in `optax.ApplyIfFiniteState` (the state and counts of
    `optax.apply_if_finite` with no limit on skips in a row), and, when `applies` (a traced
    bool) is false, skipped without counting.

    The skip is one elementwise select that XLA fuses into the update (`apply_if_finite`'s
    `lax.cond` copies the optimizer state instead), and the `applies` gate lets PIPO's PI
    step share that select rather than sit in a `lax.cond` of its own.
    """

    def init(params):
        return optax.ApplyIfFiniteState(notfinite_count=jnp.zeros([], jnp.int32), last_finite=jnp.array(True),
                                        total_notfinite=jnp.zeros([], jnp.int32), inner_state=inner.init(params))

    def update(grads, state, params=None):
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
        gate = jnp.array(True) if applies is None else jnp.asarray(applies, bool)
        ok = finite & gate
        updates, inner_state = inner.update(grads, state.inner_state, params)
        keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
        bad = gate & ~finite
        return jax.tree.map(lambda u: jnp.where(ok, u, jnp.zeros_like(u)), updates), optax.ApplyIfFiniteState(
            notfinite_count=jnp.where(gate, jnp.where(finite, 0, state.notfinite_count + 1), state.notfinite_count),
            last_finite=jnp.where(gate, finite, state.last_finite),
            total_notfinite=state.total_notfinite + bad.astype(jnp.int32),
            inner_state=jax.tree.map(keep, inner_state, state.inner_state))

    return optax.GradientTransformation(init, update)


def make_optimizer(lr: float, spec: TrainSpec, applies=None) -> optax.GradientTransformation:
    """Global-norm clipping then AdamW whose learning rate lives in the state (see `with_lr`),
    inside `skip_nonfinite`: an update whose gradients hold a NaN / inf is skipped (params
    and inner state unchanged) and counted (`nonfinite_counts`); `applies=False` (traced)
    skips without counting.

    The PI step and the base step share this optimizer state (docs/math.md §2) and differ only in
    the learning rate written into it before each update (`pipo.pi_optimizer=separate`: the
    PI step has a state of its own, `TrainState.pi_opt_state`).
    """
    return skip_nonfinite(optax.chain(
        optax.clip_by_global_norm(spec.train.grad_clip),
        optax.inject_hyperparams(optax.adamw)(
            learning_rate=lr, b1=spec.train.adam_b1, b2=spec.train.adam_b2, weight_decay=spec.train.weight_decay),
    ), applies)


def with_lr(opt_state, lr) -> Any:
    """The same optimizer state with its AdamW learning rate set to `lr`."""
    clip_state, adam_state = opt_state.inner_state
    # The dtype inject_hyperparams stored (the params' dtype): the state keeps one type.
    stored = adam_state.hyperparams["learning_rate"]
    hyper = dict(adam_state.hyperparams, learning_rate=jnp.asarray(lr, jnp.asarray(stored).dtype))
    return opt_state._replace(inner_state=(clip_state, adam_state._replace(hyperparams=hyper)))


def make_teacher_optimizer(spec: TrainSpec, cfg: VpdConfig) -> optax.GradientTransformation:
    """VPD's teacher optimizer: the student's recipe (global-norm clip + AdamW, spec's betas / decay) at `cfg.lr`."""
    return make_optimizer(cfg.lr, spec)


def init_teacher_opt_state(spec: TrainSpec, cfg: VpdConfig, teacher_params):
    return make_teacher_optimizer(spec, cfg).init(teacher_params)


def nonfinite_counts(before, after) -> dict[str, jax.Array]:
    """Skipped (non-finite) updates between two states of one `make_optimizer` optimizer, and
    how many in a row end `after`."""
    return {"nonfinite_updates": after.total_notfinite - before.total_notfinite,
            "nonfinite_in_a_row": after.notfinite_count}


def stored_batch_template(spec: TrainSpec) -> TrainBatch:
    """Shapes of the batch PIPO keeps for verification (`batch.stored`): B sequences of prompt + response."""
    return stored_template(spec.batch, spec.seq_len, spec.rollout.max_new_tokens)


def _copy(tree):
    # Separate buffers: the state is donated to the jitted steps, and XLA may not donate
    # one buffer twice.
    return jax.tree.map(jnp.copy, tree)


def reference_copy(spec: TrainSpec, params):
    """The frozen reference policy: `params` stored in the compute dtype (`model.dtype`). The
    forward casts weights to it anyway, so its log-probs are those of `params`, at half the
    memory of float32 masters under bf16 compute."""
    return jax.tree.map(lambda x: jnp.copy(x).astype(spec.model.jnp_dtype), params)


def init_estimator_state(spec: TrainSpec) -> Any:
    """The fresh state the advantage estimator carries (`AdvantageEstimator.carried`), or None."""
    est = spec.estimator
    return None if est is None or est.carried is None else est.carried.init(spec)


def init_train_state(spec: TrainSpec, params, seed: int) -> TrainState:
    """A fresh state around `params` (the reference, critic backbone and teacher start as copies;
    the reference in the compute dtype, see `reference_copy`), with `spec`'s hyperparameters as
    `hyper` (`rl/hyper.py`; the optimizer states start at the same learning rates, in buffers of their own:
    the state is donated, and no buffer may be donated twice)."""
    critic = None
    if spec.has_critic:
        critic_params = {"backbone": _copy(params),
                         "value_head": jnp.zeros((spec.model.hidden_size,), jnp.float32)}
        critic = {"params": critic_params, "opt_state": make_optimizer(spec.critic.lr, spec).init(critic_params)}
    teacher = _copy(params) if spec.uses_teacher and (spec.sdpo.teacher == "ema" or spec.vpd) else None
    teacher_opt_state = vpd_delta = None
    if spec.vpd is not None:
        teacher_opt_state = init_teacher_opt_state(spec, spec.vpd, teacher)
        vpd_delta = vpd_loss.init_delta_state()
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=make_optimizer(spec.train.lr, spec).init(params),
        ref_params=reference_copy(spec, params),
        critic=critic,
        teacher_params=teacher,
        pipo=controller.init_pipo_state(spec.pipo.window, stored_batch_template(spec)),
        rng=jax.random.PRNGKey(seed),
        teacher_opt_state=teacher_opt_state,
        vpd_delta=vpd_delta,
        pi_opt_state=(make_optimizer(spec.pipo.lr, spec).init(params)
                      if spec.pipo.enabled and spec.pipo.pi_optimizer == "separate" else None),
        estimator_state=init_estimator_state(spec),
        hyper=hyperparameters_of(spec),
    )
