"""`TrainState`: everything a run carries between iterations, as one pytree.

Policy params and AdamW state, the frozen reference params, the PPO critic (params +
its optimizer state), the SDPO EMA teacher, the PIPO controller state, the RNG key and
the iteration counter. Checkpoints save exactly this tree, so a resumed run continues
bit-exactly.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from pipo_jax.losses import pipo
from pipo_jax.losses import vpd as vpd_loss
from pipo_jax.rl.sections import VpdConfig
from pipo_jax.rl.spec import TrainSpec


@struct.dataclass
class TrainState:
    step: jax.Array  # int32 [], iterations done
    params: Any
    opt_state: Any
    ref_params: Any
    critic: Any  # None, or {"params": {"backbone", "value_head"}, "opt_state"} (PPO)
    teacher_params: Any  # None, or the SDPO / VPD teacher
    pipo: pipo.PipoState
    rng: jax.Array
    teacher_opt_state: Any = None  # VPD: the E-step's AdamW state
    vpd_delta: Any = None  # VPD: running mean of implicit rewards (losses.vpd.DeltaState)
    pi_opt_state: Any = None  # `pipo.pi_optimizer=separate`: the PI step's own AdamW state


# `optax.apply_if_finite` gives up and applies a non-finite update after this many in a row;
# the trainer stops at `spec.train.max_bad_steps` instead, so that point is never reached.
_NEVER_APPLY_NONFINITE = 2**30


def make_optimizer(lr: float, spec: TrainSpec) -> optax.GradientTransformation:
    """Global-norm clipping then AdamW whose learning rate lives in the state (see `with_lr`),
    inside `optax.apply_if_finite`: an update whose gradients hold a NaN / inf is skipped
    (params and inner state unchanged) and counted (`nonfinite_counts`).

    The PI step and the base step share this optimizer state (SPEC 2) and differ only in
    the learning rate written into it before each update (`pipo.pi_optimizer=separate`: the
    PI step has a state of its own, `TrainState.pi_opt_state`).
    """
    return optax.apply_if_finite(optax.chain(
        optax.clip_by_global_norm(spec.train.grad_clip),
        optax.inject_hyperparams(optax.adamw)(
            learning_rate=lr, b1=spec.train.adam_b1, b2=spec.train.adam_b2, weight_decay=spec.train.weight_decay),
    ), max_consecutive_errors=_NEVER_APPLY_NONFINITE)


def with_lr(opt_state, lr) -> Any:
    """The same optimizer state with its AdamW learning rate set to `lr`."""
    clip_state, adam_state = opt_state.inner_state
    # The dtype inject_hyperparams stored (the params' dtype), so both branches of the PI
    # step's `lax.cond` carry the same state type.
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


def stored_batch_template(spec: TrainSpec) -> pipo.StoredBatch:
    """Shapes of the batch PIPO keeps for verification: B sequences of prompt + response."""
    b, L, r = spec.batch, spec.seq_len, spec.rollout.response_len
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
    return pipo.StoredBatch(
        tokens_bl=i32(b, L), attention_mask_bl=i32(b, L), mask_bt=f32(b, r),
        logp_old_bt=f32(b, r), logp_ref_bt=f32(b, r), attr_bt=f32(b, r),
    )


def _copy(tree):
    # Separate buffers: the state is donated to the jitted steps, and XLA may not donate
    # one buffer twice.
    return jax.tree.map(jnp.copy, tree)


def reference_copy(spec: TrainSpec, params):
    """The frozen reference policy: `params` stored in the compute dtype (`model.dtype`). The
    forward casts weights to it anyway, so its log-probs are those of `params`, at half the
    memory of float32 masters under bf16 compute."""
    return jax.tree.map(lambda x: jnp.copy(x).astype(spec.model.jnp_dtype), params)


def init_train_state(spec: TrainSpec, params, seed: int) -> TrainState:
    """A fresh state around `params` (the reference, critic backbone and teacher start as copies;
    the reference in the compute dtype, see `reference_copy`)."""
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
        pipo=pipo.init_pipo_state(spec.pipo.window, stored_batch_template(spec)),
        rng=jax.random.PRNGKey(seed),
        teacher_opt_state=teacher_opt_state,
        vpd_delta=vpd_delta,
        pi_opt_state=(make_optimizer(spec.pipo.lr, spec).init(params)
                      if spec.pipo.enabled and spec.pipo.pi_optimizer == "separate" else None),
    )
