"""Name -> function tables: an algorithm is a config that picks entries here, not a subclass.

Every table has one call signature, so the trainer never branches on algorithm names.

ADVANTAGE_ESTIMATORS[name](batch, **cfg) -> (adv_bt, aux)
    batch: Mapping[str, Array]; aux: dict of extra outputs.
    "gae"   needs token_rewards_bt, values_bt, mask_bt; cfg gamma=1.0, lam=1.0, whiten=True;
            aux {"returns_bt"} (returns are never whitened).
    "grpo"  (alias "group_relative") needs seq_rewards_b, mask_bt; cfg group_size,
            std_ddof=0, norm_by_std=True, eps=1e-6. GRPO, GSPO, DAPO, Dr.GRPO (norm_by_std=False).

POLICY_LOSSES[name](logp_bt, logp_old_bt, adv_bt, mask_bt, **cfg) -> (loss scalar, metrics)
    cfg always accepts loss_agg_mode, num_tokens, num_seqs, norm_length (global counts, see
    `aggregation.py`). Loss-specific cfg:
    "token_clip"  eps_low=0.2, eps_high=0.2, clip_ratio_c=3.0, lower_clip_negative_adv=True
    "gspo"        eps_low=3e-4, eps_high=4e-4, lower_clip_negative_adv=True
    "sdpo_token"  logp_teacher_bt (required), is_clip=2.0, sd_mask_b=None   (adv_bt unused)
    "sdpo_jsd"    student_distill_logp_btn, teacher_distill_logp_btn (required), alpha=0.5,
                  is_clip=2.0, sd_mask_b=None, logp_teacher_bt=None          (adv_bt unused)
    The PI step calls `pipo.pi_surrogate_loss`, i.e. "token_clip" or "gspo" with rhat as adv.

ATTRIBUTIONS[name](batch, **cfg) -> attr_bt  (PIPO local attribution a_t, zero at padding)
    "group"       needs adv_bt, mask_bt; cfg group_size, additive_eps  (G * abar_i / sum_j |abar_j|)
    "gae"         needs adv_bt, mask_bt                     (PPO: the GAE advantages)
    "sdpo_token"  needs logp_teacher_bt, logp_bt, mask_bt; sd_mask_b  (logp_T - logp_S where sd_mask = 1)

KL_ESTIMATORS[name](logp_bt, logp_ref_bt) -> kl_bt    ("k1", "k2", "k3")

`rl/spec.py:train_spec` validates each config name against its table (a `ConfigError` naming
the key and the choices); loss aggregation is `aggregation.aggregate` over `AGG_MODES`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pipo_jax.losses import advantages, distill, pipo
from pipo_jax.losses.kl import KL_ESTIMATORS
from pipo_jax.losses.policy import gspo_loss, token_clip_loss


def _need(batch: Mapping, key: str, who: str):
    if key not in batch:
        raise KeyError(f"{who} needs batch[{key!r}]; the batch has {sorted(batch)}")
    return batch[key]


def _gae_estimator(batch, *, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True):
    mask_bt = _need(batch, "mask_bt", "advantage 'gae'")
    adv_bt, returns_bt = advantages.gae(
        _need(batch, "token_rewards_bt", "advantage 'gae'"),
        _need(batch, "values_bt", "advantage 'gae'"),
        mask_bt,
        gamma=gamma,
        lam=lam,
    )
    if whiten:
        adv_bt = advantages.masked_whiten(adv_bt, mask_bt)
    return adv_bt, {"returns_bt": returns_bt}


def _group_relative_estimator(batch, *, group_size: int, std_ddof: int = 0, norm_by_std: bool = True,
                              eps: float = 1e-6):
    adv_b = advantages.group_relative_advantages(
        _need(batch, "seq_rewards_b", "advantage 'grpo'"), group_size, std_ddof=std_ddof, norm_by_std=norm_by_std,
        eps=eps,
    )
    return advantages.broadcast_over_tokens(adv_b, _need(batch, "mask_bt", "advantage 'grpo'")), {}


def _group_attribution(batch, *, group_size: int, additive_eps: bool = False):
    return pipo.group_attribution(
        _need(batch, "adv_bt", "attribution 'group'"), _need(batch, "mask_bt", "attribution 'group'"), group_size,
        additive_eps,
    )


def _gae_attribution(batch):
    who = "attribution 'gae'"
    return pipo.gae_attribution(_need(batch, "adv_bt", who), _need(batch, "mask_bt", who))


def _sdpo_attribution(batch):
    who = "attribution 'sdpo_token'"
    return distill.token_attribution(_need(batch, "logp_teacher_bt", who), _need(batch, "logp_bt", who),
                                     _need(batch, "mask_bt", who), batch.get("sd_mask_b"))


ADVANTAGE_ESTIMATORS: dict[str, Callable] = {
    "gae": _gae_estimator,
    "grpo": _group_relative_estimator,
    "group_relative": _group_relative_estimator,
}

POLICY_LOSSES: dict[str, Callable] = {
    "token_clip": token_clip_loss,
    "gspo": gspo_loss,
    "sdpo_token": distill.sdpo_token_loss,
    "sdpo_jsd": distill.sdpo_jsd_loss,
}

ATTRIBUTIONS: dict[str, Callable] = {
    "group": _group_attribution,
    "gae": _gae_attribution,
    "sdpo_token": _sdpo_attribution,
}
