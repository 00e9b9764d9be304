"""The registered methods' implementations: each advantage estimator, policy loss, attribution,
advantage shaping and algorithm, bound to the spec's settings and the model, and registered in the
tables of `rl/registry.py` (importing this module fills them; they are imported here under their
names, `algorithms.ALGORITHMS` is `registry.ALGORITHMS`).

`rl/spec.py:TrainSpec` validates the config's names against those tables (a `ConfigError` naming the
key and the choices) and resolves them, so the learner (`rl/learn.py`, `rl/steps.py`) calls
`spec.policy.fn(...)`, `spec.estimator.fn(...)`, `spec.attribution.fn(...)` and branches only on
declared capabilities (a critic, a teacher), never on a name. The pure loss math, and each method's
settings section, live in `pipo_jax/losses/`; the entries here bind them to the spec and the model.

`counts` are a mini-batch's global counts (`steps.response_counts`), so micro-batching
never changes a loss. `hyper` is the state's `rl/hyper.py:Hyperparameters`: a loss reads its clip
bounds (1 - eps_low, 1 + eps_high) and dual clip's c there (data), never from the spec.
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp

from pipo_jax.config.schema import ConfigError
from pipo_jax.losses import adora, advantages, bapo, bnpo, copo, cov, disco, distill, drpo, gdpo, pipo, riskpo
from pipo_jax.losses import vpd as vpd_loss
from pipo_jax.losses.aggregation import Aggregation
from pipo_jax.losses.policy import cispo_loss, gspo_loss, token_clip_loss
from pipo_jax.rl.batch import TrainBatch
from pipo_jax.rl.hyper import Hyperparameters
from pipo_jax.rl.registry import (  # noqa: F401 (the tables, read as `algorithms.<TABLE>`)
    ADVANTAGE_ESTIMATORS, ADVANTAGE_SHAPINGS, ALGORITHMS, ATTRIBUTIONS, POLICY_LOSSES, AdvantageEstimator,
    AdvantageInputs, Algorithm, Attribution, CarriedState, PolicyLoss, advantage_estimator, advantage_shaping,
    algorithm_variant, attribution, config_names, group_estimators, plain_algorithm, policy_loss, register_algorithm)
from pipo_jax.rl.response_logprobs import response_log_softmax, response_logprobs
from pipo_jax.rl.spec import TrainSpec


# ----------------------------------------------------------------------------- model passes


def student_logprobs(spec: TrainSpec, params, mb: TrainBatch):
    """(log pi(y_t) `[B, R]`, entropy `[B, R]` or None) of the batch's responses under `params`."""
    return response_logprobs(spec.model, params, mb.tokens_bl, mb.mask_bl, spec.prompt_len,
                             temperature=spec.rollout.temperature, impl=spec.logprob_impl,
                             with_entropy=spec.loss.entropy_coef > 0)


def teacher_logprobs(spec: TrainSpec, teacher_params, tokens_bq, mask_bq) -> jax.Array:
    """Teacher log-probs `[B, R]` of the response tokens in the teacher context (no gradient)."""
    q = tokens_bq.shape[1] - spec.rollout.max_new_tokens
    logp, _ = response_logprobs(spec.model, jax.lax.stop_gradient(teacher_params), tokens_bq, mask_bq, q,
                                temperature=spec.rollout.temperature, impl=spec.logprob_impl)
    return jax.lax.stop_gradient(logp)


def aggregation(spec: TrainSpec, counts: dict) -> Aggregation:
    """The `agg=` of every loss in `pipo_jax.losses`: `loss.agg_mode` with a mini-batch's global
    counts (`steps.response_counts`), normalised by the configured response length."""
    return Aggregation.of(spec.loss.agg_mode, counts, norm_length=spec.loss.norm_length or spec.rollout.max_new_tokens)


def _check_loss_inputs(logp_br, mb: TrainBatch) -> None:
    chex.assert_equal_shape([logp_br, mb.logp_old_br, mb.mask_br])
    chex.assert_type([logp_br, mb.logp_old_br], jnp.float32)


# ----------------------------------------------------------------------------- advantage estimators


@advantage_estimator("gae", critic=True)
def _gae(spec: TrainSpec, x: AdvantageInputs):
    """PPO: GAE(gamma, lambda) on the critic's values, whitened; returns are never whitened."""
    adv_br, returns_br = advantages.gae(x.token_rewards_br, x.values_br, x.mask_br, gamma=spec.advantage.gamma,
                                        lam=spec.advantage.lam)
    return advantages.masked_whiten(adv_br, x.mask_br), returns_br


@advantage_estimator("grpo", "group_relative", group=True)
def _group_relative(spec: TrainSpec, x: AdvantageInputs):
    """GRPO / GSPO / DAPO / Dr. GRPO (`norm_by_std=False`): (r - group mean) / group std on every token."""
    adv_b = advantages.group_relative_advantages(x.seq_rewards_b, spec.rollout.group_size,
                                                 std_ddof=spec.advantage.std_ddof,
                                                 norm_by_std=spec.advantage.norm_by_std)
    return advantages.broadcast_over_tokens(adv_b, x.mask_br), None


@advantage_estimator("rloo", group=True)
def _rloo(spec: TrainSpec, x: AdvantageInputs):
    """RLOO: r_i - mean_{j != i} r_j over the group, on every token of response i (docs/math.md §1)."""
    adv_b = advantages.leave_one_out_advantages(x.seq_rewards_b, spec.rollout.group_size)
    return advantages.broadcast_over_tokens(adv_b, x.mask_br), None


@advantage_estimator("reinforce_pp")
def _reinforce_pp(spec: TrainSpec, x: AdvantageInputs):
    """REINFORCE++: the discounted return of the token rewards (`advantage.gamma`), whitened over
    the batch's valid tokens (docs/math.md §1); no group, any G."""
    return advantages.reinforce_pp_advantages(x.token_rewards_br, x.mask_br, gamma=spec.advantage.gamma), None


@advantage_estimator("reinforce_pp_baseline", group=True)
def _reinforce_pp_baseline(spec: TrainSpec, x: AdvantageInputs):
    """REINFORCE++-baseline: r_i - group mean on every token, whitened over the batch's valid tokens."""
    return advantages.reinforce_pp_baseline_advantages(x.seq_rewards_b, x.mask_br, spec.rollout.group_size), None


def _bnpo_rewards(spec: TrainSpec) -> dict:
    return dict(reward_min=spec.advantage.bnpo.reward_min, reward_max=spec.advantage.bnpo.reward_max)


def _bnpo_update(spec: TrainSpec, state: bnpo.BnpoState, x: AdvantageInputs):
    """This batch's success rates into BNPO's pool (`advantage.bnpo.decay`); the pool's Beta parameters as
    metrics."""
    rates = bnpo.success_rates(x.seq_rewards_b, spec.rollout.group_size, **_bnpo_rewards(spec))
    state = bnpo.update_bnpo_state(state, rates, decay=spec.advantage.bnpo.decay)
    return state, {f"bnpo_{k}": v for k, v in bnpo.beta_parameters(state).items()}


@advantage_estimator("bnpo", group=True, carried=CarriedState(lambda spec: bnpo.init_bnpo_state(), _bnpo_update),
                     settings=bnpo.BnpoSettings)
def _bnpo(spec: TrainSpec, x: AdvantageInputs):
    """BNPO: (r~ - p_q) / f_N(p_q; alpha, beta) on every token, alpha and beta from the pool of recent success
    rates `x.state` (this batch's included), `losses/bnpo.py` (docs/math.md §1 "BNPO")."""
    params = bnpo.beta_parameters(x.state)
    adv_b = bnpo.bnpo_advantages(x.seq_rewards_b, spec.rollout.group_size, params["alpha"], params["beta"],
                                 **_bnpo_rewards(spec))
    return advantages.broadcast_over_tokens(adv_b, x.mask_br), None


@advantage_estimator("copo", group=True, settings=copo.CopoSettings)
def _copo(spec: TrainSpec, x: AdvantageInputs):
    """COPO (`losses/copo.py`, docs/math.md §1 "COPO"): GRPO's group advantage as the local one, and for the
    `copo` loss each row's global advantage (its prompt's mean reward standardised over the batch's prompts)
    and the weight of its local loss (from its group's outcome entropy, `advantage.copo.*`), as the batch
    fields `global_adv_b` and `local_weight_b`."""
    a, g = spec.advantage, spec.rollout.group_size
    local_b = advantages.group_relative_advantages(x.seq_rewards_b, g, std_ddof=a.std_ddof, norm_by_std=a.norm_by_std)
    global_b, weight_b, _ = copo.copo_advantages(
        x.seq_rewards_b, local_b, x.tokens_br, x.mask_br, group_size=g, outcome=a.copo.outcome, gamma=a.copo.gamma,
        rho=a.copo.rho, blend=a.copo.blend, consistency_reward=a.copo.consistency_reward, std_ddof=a.std_ddof,
        norm_by_std=a.norm_by_std)
    return (advantages.broadcast_over_tokens(local_b, x.mask_br), None,
            {"global_adv_b": global_b, "local_weight_b": weight_b})


@advantage_estimator("riskpo", group=True, settings=riskpo.RiskpoSettings)
def _riskpo(spec: TrainSpec, x: AdvantageInputs):
    """RiskPO (`losses/riskpo.py`, docs/math.md §1 "RiskPO"): the Mixed Value-at-Risk advantages of bundles of
    `advantage.riskpo.bundle_size` consecutive prompts, on every token of each response."""
    a = spec.advantage
    adv_b = riskpo.riskpo_advantages(x.seq_rewards_b, spec.rollout.group_size, bundle_size=a.riskpo.bundle_size,
                                     alpha=a.riskpo.alpha, beta=a.riskpo.beta, omega=a.riskpo.omega,
                                     natural_baseline=a.riskpo.natural_baseline, credit=a.riskpo.credit,
                                     norm_by_std=a.norm_by_std, std_ddof=a.std_ddof)
    return advantages.broadcast_over_tokens(adv_b, x.mask_br), None


def _gdpo_components(spec: TrainSpec, x: AdvantageInputs) -> tuple[jax.Array, tuple[float, ...]]:
    """GDPO's reward components [B, C] and their weights: the task's (`Task.reward_weights`), and when the
    learner shapes the reward (`loss.kl_in_reward`, `dapo.overlong_buffer`) one more, weight 1, the sequence
    reward minus the task's weighted sum, so that the components sum to the reward the other estimators read."""
    comps_bc = jnp.asarray(x.reward_components_bc, jnp.float32)
    weights = tuple(float(c.weight) for c in spec.task.reward_weights())
    if not (spec.loss.kl_in_reward or spec.dapo.overlong_buffer):
        return comps_bc, weights
    shaping_b = x.seq_rewards_b - comps_bc @ jnp.asarray(weights, jnp.float32)
    return jnp.concatenate([comps_bc, shaping_b[:, None]], axis=1), weights + (1.0,)


@advantage_estimator("gdpo", group=True, reward_components=True)
def _gdpo(spec: TrainSpec, x: AdvantageInputs):
    """GDPO (`losses/gdpo.py`, docs/math.md §1 "GDPO"): each reward component normalised within its group, the
    weighted sum normalised over the batch, on every token of each response."""
    comps_bc, weights = _gdpo_components(spec, x)
    adv_b = gdpo.gdpo_advantages(comps_bc, weights, spec.rollout.group_size, std_ddof=spec.advantage.std_ddof,
                                 norm_by_std=spec.advantage.norm_by_std)
    return advantages.broadcast_over_tokens(adv_b, x.mask_br), None


@advantage_estimator("adora", group=True, settings=adora.AdoraSettings)
def _adora(spec: TrainSpec, x: AdvantageInputs):
    """ADORA (`losses/adora.py`, docs/math.md §1 "ADORA"): GRPO's group advantage, times 1 on the prompts whose
    longest correct response is longer than their incorrect ones' mean length this iteration and
    `advantage.adora.tds_weight` on the others; the weights as the batch field `adora_weight_b` (the
    attribution's)."""
    a = spec.advantage
    adv_b, weight_b = adora.adora_advantages(
        x.seq_rewards_b, jnp.sum(x.mask_br, axis=1), spec.rollout.group_size,
        success_threshold=a.adora.success_threshold, max_length=a.adora.max_length or spec.rollout.max_new_tokens,
        tds_weight=a.adora.tds_weight, std_ddof=a.std_ddof, norm_by_std=a.norm_by_std)
    return advantages.broadcast_over_tokens(adv_b, x.mask_br), None, {"adora_weight_b": weight_b}


def estimate(spec: TrainSpec, x: AdvantageInputs, state: Any = None):
    """`spec.estimator` on `x`: (adv_br, returns_br | None, the estimator's state after this batch, metrics,
    the further `TrainBatch` fields it fills: {} but for COPO's and ADORA's). An estimator with `carried` folds the
    batch into `state` (`TrainState.estimator_state`) first and reads the result; the others pass `state` through
    unchanged, with no metrics."""
    est, metrics = spec.estimator, {}
    if est.carried is not None:
        state, metrics = est.carried.update(spec, state, x)
        x = x._replace(state=state)
    adv, returns, *fields = est.fn(spec, x)
    return adv, returns, state, metrics, (fields[0] if fields else {})


# ----------------------------------------------------------------------------- policy losses


def _clip_loss(loss, spec: TrainSpec, hyper, params, mb: TrainBatch, counts: dict, **kw):
    logp, ent = student_logprobs(spec, params, mb)
    _check_loss_inputs(logp, mb)
    value, metrics = loss(logp, mb.logp_old_br, mb.adv_br, mb.mask_br, ratio_low=hyper.ratio_low,
                          ratio_high=hyper.ratio_high, **kw, agg=aggregation(spec, counts))
    return value, metrics, logp, ent


def dual_clip_c(spec: TrainSpec, hyper: Hyperparameters):
    """The dual clip's c: 0.0 (off: structure, `loss.clip_ratio_c=0`) or `hyper.clip_ratio_c` (data)."""
    return 0.0 if spec.loss.clip_ratio_c == 0 else hyper.clip_ratio_c


def base_clip_ratio_c(spec: TrainSpec, hyper: Hyperparameters):
    """The token clip's dual clip in the base step: `loss.clip_ratio_c` (`dual_clip_c`), but 0 for PPO under
    `pipo.compat=true`: the authors' PPO actor loss (`ppo_layback`, also their PPO PI loss) is
    max(-A r, -A clip(r)) with the +-20 log-ratio clamp and no dual clip (docs/pipo_vs_authors.md)."""
    if spec.pipo.compat and spec.algorithm.authors_ppo:
        return 0.0
    return dual_clip_c(spec, hyper)


@policy_loss("token_clip", pi_ratio="token", dual_clip=True)
def _token_clip(spec: TrainSpec, params, teacher_params, mb: TrainBatch, counts: dict, *, hyper: Hyperparameters):
    """PPO-style token clip with dual clip `clip_ratio_c` (`losses/policy.py:token_clip_loss`);
    PPO under `pipo.compat`: without the dual clip (`base_clip_ratio_c`)."""
    return _clip_loss(token_clip_loss, spec, hyper, params, mb, counts, clip_ratio_c=base_clip_ratio_c(spec, hyper))


@policy_loss("gspo", pi_ratio="sequence")
def _gspo(spec: TrainSpec, params, teacher_params, mb: TrainBatch, counts: dict, *, hyper: Hyperparameters):
    """GSPO's sequence-ratio clip (`losses/policy.py:gspo_loss`); its PI step uses the sequence ratio."""
    return _clip_loss(gspo_loss, spec, hyper, params, mb, counts)


@policy_loss("cispo", pi_ratio="token")
def _cispo(spec: TrainSpec, params, teacher_params, mb: TrainBatch, counts: dict, *, hyper: Hyperparameters):
    """CISPO: the clipped, detached importance weight times A log pi (`losses/policy.py:cispo_loss`)."""
    return _clip_loss(cispo_loss, spec, hyper, params, mb, counts)


@policy_loss("kl_cov", pi_ratio="token", settings=cov.KlCovSettings)
def _kl_cov(spec: TrainSpec, params, teacher_params, mb: TrainBatch, counts: dict, *, hyper: Hyperparameters):
    """KL-Cov (`losses/cov.py:kl_cov_loss`): -A r, + `loss.kl_cov.coef` |log ratio| on the
    `loss.kl_cov.ratio` tokens of largest covariance in the micro-batch at hand; no clip."""
    logp, ent = student_logprobs(spec, params, mb)
    _check_loss_inputs(logp, mb)
    loss, metrics = cov.kl_cov_loss(logp, mb.logp_old_br, mb.adv_br, mb.mask_br, ratio=spec.loss.kl_cov.ratio,
                                    coef=spec.loss.kl_cov.coef, agg=aggregation(spec, counts))
    return loss, metrics, logp, ent


@policy_loss("clip_cov", pi_ratio="token", settings=cov.ClipCovSettings)
def _clip_cov(spec: TrainSpec, params, teacher_params, mb: TrainBatch, counts: dict, *, hyper: Hyperparameters):
    """Clip-Cov (`losses/cov.py:clip_cov_loss`): the token clip without dual clip, `loss.clip_cov.ratio`
    unclipped tokens of covariance in [`loss.clip_cov.low`, `high`] drawn with `counts["rng"]`
    (`steps.accumulate_grads`: one key per micro-batch) and left out."""
    logp, ent = student_logprobs(spec, params, mb)
    _check_loss_inputs(logp, mb)
    loss, metrics = cov.clip_cov_loss(logp, mb.logp_old_br, mb.adv_br, mb.mask_br, key=counts["rng"],
                                      ratio_low=hyper.ratio_low, ratio_high=hyper.ratio_high,
                                      ratio=spec.loss.clip_cov.ratio, cov_low=spec.loss.clip_cov.low,
                                      cov_high=spec.loss.clip_cov.high, agg=aggregation(spec, counts))
    return loss, metrics, logp, ent


def _check_whole_groups(spec: TrainSpec, mb: TrainBatch, policy: str) -> None:
    """A loss over each prompt's G responses together and a KL penalty over the mini-batch (DRPO, DisCO)
    needs unshuffled rows and the mini-batch in one micro-batch."""
    if spec.train.shuffle:
        raise ConfigError(f"config.train.shuffle: loss.policy={policy!r} reads each prompt's G responses together; "
                          "set it to false")
    if mb.mask_br.shape[0] != spec.mini_batch:
        raise ConfigError(f"config.train.micro_batch_size_per_device: loss.policy={policy!r} needs the mini-batch of "
                          f"{spec.mini_batch} rows in one micro-batch (its KL penalty is over the mini-batch); set 0")


@policy_loss("drpo", pi_ratio="token", settings=drpo.DrpoSettings)
def _drpo(spec: TrainSpec, params, teacher_params, mb: TrainBatch, counts: dict, *, hyper: Hyperparameters):
    """DRPO (`losses/drpo.py:drpo_loss`): the decoupled, length-weighted discriminative objective over
    each group of the mini-batch, with the KL penalty. It reads whole groups, so the mini-batch must be
    one micro-batch of unshuffled rows (`train.shuffle=false`, `train.micro_batch_size_per_device=0`)."""
    _check_whole_groups(spec, mb, "drpo")
    logp, ent = student_logprobs(spec, params, mb)
    _check_loss_inputs(logp, mb)
    g = spec.rollout.group_size
    loss, metrics = drpo.drpo_loss(logp, mb.logp_old_br, mb.adv_br, mb.mask_br, group_size=g,
                                   num_prompts=spec.mini_batch // g, tau=spec.loss.drpo.tau, lam=spec.loss.drpo.lam,
                                   beta=spec.loss.drpo.beta, delta=spec.loss.drpo.delta)
    return loss, metrics, logp, ent


@policy_loss("bapo", pi_ratio="token", dual_clip=True, settings=bapo.BapoSettings)
def _bapo(spec: TrainSpec, params, teacher_params, mb: TrainBatch, counts: dict, *, hyper: Hyperparameters):
    """BAPO (`losses/bapo.py:bapo_loss`): the token clip at the ratio bounds chosen on the micro-batch at hand
    (`loss.bapo.*`: `variant=paper`, Algorithm 1, brings the positive tokens' share of Eq. 8 to `rho` by raising
    c_high, then c_low, within their ranges; `released_code` the authors' code's search), with the dual clip
    `loss.clip_ratio_c` (0 in `configs/bapo.py`: the paper's objective); `loss.clip_low` / `clip_high` are the
    PI step's clip only."""
    logp, ent = student_logprobs(spec, params, mb)
    _check_loss_inputs(logp, mb)
    lo = spec.loss.bapo
    loss, metrics = bapo.bapo_loss(logp, mb.logp_old_br, mb.adv_br, mb.mask_br, agg=aggregation(spec, counts),
                                   rho=lo.rho, lower_start=lo.lower_start, lower_max=lo.lower_max,
                                   lower_step=lo.lower_step, upper_start=lo.upper_start,
                                   upper_max=lo.upper_max, upper_step=lo.upper_step,
                                   prob_weight=lo.prob_weight, variant=lo.variant,
                                   clip_ratio_c=dual_clip_c(spec, hyper))
    return loss, metrics, logp, ent


@policy_loss("disco", pi_ratio="token", settings=disco.DiscoSettings)
def _disco(spec: TrainSpec, params, teacher_params, mb: TrainBatch, counts: dict, *, hyper: Hyperparameters):
    """DisCO (`losses/disco.py:disco_loss`): each group's positive responses' mean score against its
    negative ones' (`loss.disco.score`, `negatives`, `tau`) with the squared-hinge KL penalty
    (`beta`, `delta`); whole groups, one micro-batch per mini-batch, as DRPO."""
    _check_whole_groups(spec, mb, "disco")
    logp, ent = student_logprobs(spec, params, mb)
    _check_loss_inputs(logp, mb)
    g, lo = spec.rollout.group_size, spec.loss.disco
    loss, metrics = disco.disco_loss(logp, mb.logp_old_br, mb.adv_br, mb.mask_br, group_size=g,
                                     num_prompts=spec.mini_batch // g, score=lo.score,
                                     negatives=lo.negatives, tau=lo.tau, beta=lo.beta,
                                     delta=lo.delta)
    return loss, metrics, logp, ent


@policy_loss("copo", pi_ratio="token", dual_clip=True)
def _copo_loss(spec: TrainSpec, params, teacher_params, mb: TrainBatch, counts: dict, *, hyper: Hyperparameters):
    """COPO (`losses/copo.py:copo_loss`): per token, the token clip (dual clip `loss.clip_ratio_c`) on the local
    advantage weighted by `mb.local_weight_b` plus the same clip on the global advantage `mb.global_adv_b`
    weighted by the rest (the `copo` estimator's batch fields)."""
    logp, ent = student_logprobs(spec, params, mb)
    _check_loss_inputs(logp, mb)
    loss, metrics = copo.copo_loss(logp, mb.logp_old_br, mb.adv_br, mb.global_adv_b, mb.local_weight_b, mb.mask_br,
                                   agg=aggregation(spec, counts), ratio_low=hyper.ratio_low,
                                   ratio_high=hyper.ratio_high, clip_ratio_c=base_clip_ratio_c(spec, hyper))
    return loss, metrics, logp, ent


def _distill_kwargs(spec: TrainSpec, mb: TrainBatch, counts: dict) -> dict:
    return dict(is_clip=spec.sdpo.is_clip, sd_mask_b=mb.sd_mask_b, agg=aggregation(spec, counts["sd"]))


@policy_loss("sdpo_token", distills=True)
def _sdpo_token(spec: TrainSpec, params, teacher_params, mb: TrainBatch, counts: dict, *, hyper: Hyperparameters):
    """SDPO's token-level reverse KL toward the teacher (`losses/distill.py:sdpo_token_loss`)."""
    logp, ent = student_logprobs(spec, params, mb)
    _check_loss_inputs(logp, mb)
    logp_t = teacher_logprobs(spec, teacher_params, mb.teacher_tokens_bq, mb.teacher_mask_bq)
    loss, metrics = distill.sdpo_token_loss(logp, mb.logp_old_br, None, mb.mask_br, logp_teacher_br=logp_t,
                                            **_distill_kwargs(spec, mb, counts))
    return loss, metrics, logp, ent


@policy_loss("sdpo_jsd", distills=True)
def _sdpo_jsd(spec: TrainSpec, params, teacher_params, mb: TrainBatch, counts: dict, *, hyper: Hyperparameters):
    """SDPO's generalised JSD on the student's top-k tokens + tail (`losses/distill.py:sdpo_jsd_loss`)."""
    p, r = spec.prompt_len, spec.rollout.max_new_tokens
    q = mb.teacher_tokens_bq.shape[1] - r
    student = response_log_softmax(spec.model, params, mb.tokens_bl, mb.mask_bl, p,
                                   temperature=spec.rollout.temperature)
    teacher = jax.lax.stop_gradient(response_log_softmax(
        spec.model, jax.lax.stop_gradient(teacher_params), mb.teacher_tokens_bq, mb.teacher_mask_bq, q,
        temperature=spec.rollout.temperature))
    targets = mb.tokens_bl[:, p:]
    valid = mb.mask_br > 0
    logp = jnp.where(valid, jnp.take_along_axis(student, targets[..., None], axis=-1)[..., 0], 0.0)
    logp_t = jnp.where(valid, jnp.take_along_axis(teacher, targets[..., None], axis=-1)[..., 0], 0.0)
    _check_loss_inputs(logp, mb)
    s_brn, t_brn = distill.student_topk_with_tail(student, teacher, min(spec.sdpo.topk, student.shape[-1]))
    loss, metrics = distill.sdpo_jsd_loss(logp, mb.logp_old_br, None, mb.mask_br, student_distill_logp_brn=s_brn,
                                          teacher_distill_logp_brn=t_brn, alpha=spec.sdpo.alpha,
                                          logp_teacher_br=logp_t, **_distill_kwargs(spec, mb, counts))
    ent = -jnp.sum(jnp.exp(student) * student, axis=-1) if spec.loss.entropy_coef > 0 else None
    return loss, metrics, logp, ent


@policy_loss("vpd_joint", pi_ratio="token", dual_clip=True)
def _vpd_joint(spec: TrainSpec, params, teacher_params, mb: TrainBatch, counts: dict, *, hyper: Hyperparameters):
    """VPD's joint hybrid: the token clip loss on GRPO advantages + w x SDPO's token distillation."""
    logp, ent = student_logprobs(spec, params, mb)
    _check_loss_inputs(logp, mb)
    logp_t = teacher_logprobs(spec, teacher_params, mb.teacher_tokens_bq, mb.teacher_mask_bq)
    loss, metrics = vpd_loss.joint_hybrid_loss(
        logp, mb.logp_old_br, mb.adv_br, mb.mask_br, weight=spec.vpd.hybrid_weight, logp_teacher_br=logp_t,
        sd_mask_b=mb.sd_mask_b, is_clip=spec.sdpo.is_clip, ratio_low=hyper.ratio_low,
        ratio_high=hyper.ratio_high, clip_ratio_c=dual_clip_c(spec, hyper), agg=aggregation(spec, counts))
    return loss, metrics, logp, ent


# ----------------------------------------------------------------------------- attributions


@attribution("group")
def _group_attribution(spec: TrainSpec, batch: TrainBatch):
    """G x abar_i / sum_j |abar_j| over each group (docs/math.md §1)."""
    return pipo.group_attribution(batch.adv_br, batch.mask_br, spec.rollout.group_size,
                                  spec.pipo_options.attribution_eps_add)


@attribution("gae")
def _gae_attribution(spec: TrainSpec, batch: TrainBatch):
    """The estimator's token advantages themselves (PPO's whitened GAE, REINFORCE++'s whitened
    returns); PPO with `pipo.authors.ppo_sign_attribution`: the group attribution of the stored
    advantages over each prompt's G responses, G abar_i / (sum_j |abar_j| (+) 1e-6) (their PPO PI
    step groups by prompt; with G = 1, PPO's default, abar_i / (|abar_i| (+) 1e-6), about the sign)."""
    if spec.pipo_options.ppo_sign_attribution and spec.algorithm.authors_ppo:
        return pipo.group_attribution(batch.adv_br, batch.mask_br, spec.rollout.group_size,
                                      spec.pipo_options.attribution_eps_add)
    return pipo.gae_attribution(batch.adv_br, batch.mask_br)


@attribution("copo")
def _copo_attribution(spec: TrainSpec, batch: TrainBatch):
    """COPO: each response's blended advantage w A_local + (1 - w) A_global on its tokens, the advantage COPO's
    two clipped losses amount to at ratio 1 (`losses/copo.py:blended_advantages`, docs/math.md §1 "COPO")."""
    return copo.blended_advantages(batch.adv_br, batch.global_adv_b, batch.local_weight_b, batch.mask_br)


@attribution("adora")
def _adora_attribution(spec: TrainSpec, batch: TrainBatch):
    """ADORA: the group attribution times the prompt's ADORA weight `batch.adora_weight_b`, so the PI step keeps
    ADORA's split into advantageous and disadvantageous prompts (`losses/adora.py:adora_attribution`,
    docs/math.md §1 "ADORA")."""
    return adora.adora_attribution(batch.adv_br, batch.adora_weight_b, batch.mask_br, spec.rollout.group_size,
                                   spec.pipo_options.attribution_eps_add)


@attribution("sdpo_token", teacher=True)
def _sdpo_attribution(spec: TrainSpec, batch: TrainBatch):
    """SDPO: log p_T - log p_S on tokens of rows with teacher signal."""
    return distill.token_attribution(batch.logp_teacher_br, batch.logp_old_br, batch.mask_br, batch.sd_mask_b)


def attribute(spec: TrainSpec, batch: TrainBatch):
    """The stored attribution a_t of `batch`: `spec.attribution`, then `pipo.attribution_norm`."""
    attr = spec.attribution.fn(spec, batch)
    if spec.pipo.attribution_norm == "mean_abs":
        attr = pipo.normalise_attribution(attr, batch.mask_br)
    return attr


# ----------------------------------------------------------------------------- advantage shapings


@advantage_shaping("vpd_reshape")
def _vpd_reshape(spec: TrainSpec, batch: TrainBatch):
    """A' = A + w (log p_T - log p_S) on rows with teacher signal (VPD's reshape hybrid)."""
    return vpd_loss.reshaped_advantages(batch.adv_br, batch.logp_teacher_br, batch.logp_old_br, batch.mask_br,
                                        weight=spec.vpd.hybrid_weight, sd_mask_b=batch.sd_mask_b)


# ----------------------------------------------------------------------------- algorithms

CLIP_LOSSES = (("token_clip", "token_clip"), ("gspo", "gspo"), ("cispo", "cispo"))
GROUP_ESTIMATORS = ("grpo", "group_relative")  # GRPO's estimator under its two names: what its family accepts
SDPO_LOSSES = (("sdpo_token", "sdpo_token"), ("sdpo_jsd", "sdpo_jsd"))

register_algorithm(Algorithm("ppo", ("gae",), CLIP_LOSSES, "gae", authors_pi_token_loss=False, authors_ppo=True))
for _name in ("grpo", "gspo", "dapo"):
    register_algorithm(Algorithm(_name, GROUP_ESTIMATORS, CLIP_LOSSES, "group"))
# Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"): GRPO without its two
# length / difficulty biases; configs/dr_grpo.py sets them off: A_i = R_i - mean_g
# (`advantage.norm_by_std=false`) and each response's token losses summed and divided by a constant
# (`loss.agg_mode=seq-mean-token-sum-norm`, docs/math.md §1 "Aggregation"), not by the response's length.
register_algorithm(Algorithm("dr_grpo", GROUP_ESTIMATORS, CLIP_LOSSES, "group"))
# RLOO (Ahmadian et al. 2024, "Back to Basics"): the leave-one-out baseline, the token clip as verl's
# rloo; PIPO's attribution is the group one (docs/math.md §1 "RLOO").
register_algorithm(Algorithm("rloo", ("rloo",), CLIP_LOSSES, "group"))
# REINFORCE++ (Hu 2025, arXiv 2501.03262) and its baseline variant: globally whitened token advantages;
# PIPO's attribution is the advantages themselves, as PPO's (docs/math.md §1 "REINFORCE++").
register_algorithm(Algorithm("reinforce_pp", ("reinforce_pp", "reinforce_pp_baseline"), CLIP_LOSSES, "gae"))
# KL-Cov and Clip-Cov (Cui et al. 2025, arXiv 2505.22617): GRPO's group advantages, the policy gradient
# restricted on the tokens of high covariance of log-prob and advantage; PIPO's attribution is the
# group one (docs/math.md §1 "KL-Cov and Clip-Cov").
register_algorithm(Algorithm("kl_cov", GROUP_ESTIMATORS, (("kl_cov", "kl_cov"),), "group"))
register_algorithm(Algorithm("clip_cov", GROUP_ESTIMATORS, (("clip_cov", "clip_cov"),), "group"))
# DRPO (Li et al. 2025, arXiv 2510.04474): correct responses' length reward normalised among the correct
# ones only, a discriminative objective against the incorrect ones; GRPO's advantages mark which is
# which, so PIPO's attribution is the group one (docs/math.md §1 "DRPO").
register_algorithm(Algorithm("drpo", ("grpo",), (("drpo", "drpo"),), "group"))
# BAPO (Xi et al. 2025, arXiv 2510.18927): GRPO's group advantages, the clip bounds adapted on each update
# until the positive tokens' share of the loss reaches rho_0; PIPO's attribution is the group one
# (docs/math.md §1 "BAPO").
register_algorithm(Algorithm("bapo", GROUP_ESTIMATORS, (("bapo", "bapo"),), "group"))
# DisCO (Li et al. 2025, arXiv 2505.12366): a discriminative objective of positive against negative responses
# with a non-clipping score and a squared-hinge KL penalty; GRPO's advantages mark which is which, so
# PIPO's attribution is the group one (docs/math.md §1 "DisCO").
register_algorithm(Algorithm("disco", GROUP_ESTIMATORS, (("disco", "disco"),), "group"))
# BNPO (Xiao et al. 2025, arXiv 2506.02864): the reward minus the prompt's success rate over a Beta density
# whose parameters follow a pool of recent success rates (the estimator's carried state); per prompt a
# positive multiple of r - mean, so PIPO's attribution is the group one (docs/math.md §1 "BNPO").
register_algorithm(Algorithm("bnpo", ("bnpo",), CLIP_LOSSES, "group"))
# COPO (Han et al. 2025, arXiv 2508.04138): GRPO's group advantage blended, per response and by its group's
# outcome entropy, with a global one over the batch's prompts, so groups of equal rewards keep a signal; PIPO's
# attribution is the blended advantage (docs/math.md §1 "COPO").
register_algorithm(Algorithm("copo", ("copo",), (("copo", "copo"),), "copo"))
# RiskPO (Ren et al. 2025, arXiv 2510.00911): the Mixed Value-at-Risk advantages of bundles of questions, through
# the token clip; PIPO's attribution is the advantages themselves, as REINFORCE++'s (docs/math.md §1 "RiskPO").
register_algorithm(Algorithm("riskpo", ("riskpo",), CLIP_LOSSES, "gae"))
# GDPO (Liu et al. 2026, arXiv 2601.05242): each reward component normalised within its group, the sum over the
# batch, through the token clip; per prompt a different combination of the components than GRPO's, normalised
# within the group, so PIPO's attribution is the group one (docs/math.md §1 "GDPO").
register_algorithm(Algorithm("gdpo", ("gdpo",), CLIP_LOSSES, "group"))
# ADORA (Ren et al. 2026, arXiv 2602.10019; the authors' released rule): GRPO's group advantages scaled down on the
# prompts that are temporarily disadvantageous this iteration, through the token clip; PIPO's attribution is the
# group one times that weight (docs/math.md §1 "ADORA").
register_algorithm(Algorithm("adora", ("adora",), CLIP_LOSSES, "adora"))
register_algorithm(Algorithm("sdpo", ("none",), SDPO_LOSSES, "sdpo_token", teacher=True))
register_algorithm(Algorithm("vpd", ("none",), SDPO_LOSSES, "sdpo_token", teacher=True, vpd_settings=True))
register_algorithm(Algorithm("vpd+joint", GROUP_ESTIMATORS, (("token_clip", "vpd_joint"),), "group", teacher=True,
                             config_name="vpd", variant="joint", vpd_settings=True))
register_algorithm(Algorithm("vpd+reshape", GROUP_ESTIMATORS, CLIP_LOSSES, "group", teacher=True,
                             advantage_shaping="vpd_reshape", config_name="vpd", variant="reshape", vpd_settings=True))
