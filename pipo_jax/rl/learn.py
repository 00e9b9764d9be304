"""One PIPO iteration's learning half (docs/math.md §2, steps 2-5) on a scored rollout, as a pure function.

    2. with theta_t (before any update): behaviour / reference log-probs, values (PPO),
       advantages, attributions a_t, SDPO teacher contexts; mu_t
    3. verification (PI step) on the stored B_{t-1} when the window is full and c != 0
    4. exploration (base step) on B_t from the verified params; PPO critic; SDPO EMA teacher
    5. push mu_t into the window and store B_t with a_t
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pipo_jax.losses import advantages, distill, pipo
from pipo_jax.losses.kl import kl_estimate
from pipo_jax.losses.masking import masked_mean
from pipo_jax.rl import algorithms, controller, steps, vpd_estep
from pipo_jax.rl.batch import TrainBatch, check_batch, stored
from pipo_jax.rl.hyper import Hyperparameters
from pipo_jax.rl.experience import Rollout, choose_contexts, response_part, shaped_rewards, teacher_settings
from pipo_jax.rl.response_logprobs import response_logprobs
from pipo_jax.rl.spec import TrainSpec
from pipo_jax.rl.state import TrainState, make_optimizer, nonfinite_counts, with_lr


def teacher_contexts(spec: TrainSpec, rollout: Rollout, rewards_b) -> tuple[jax.Array, jax.Array, jax.Array]:
    """SDPO / VPD teacher inputs `[B, Q + R]` (the teacher's prompt, then the student's
    response) and `sd_mask_b` (1 where the prompt carries a solution or feedback).

    The learner chooses each row's context (`experience.choose_contexts`); the task renders it: on
    the host with the rewards (`rollout.teacher_context`, `TaskReward.score_rollout`) or in JAX
    here (`Task.teacher_prompts`, `device_reward` tasks).
    """
    resp_tokens, resp_mask = response_part(spec, rollout)
    if rollout.teacher_context is not None:
        ctx_tokens, ctx_mask, has_context = rollout.teacher_context
    else:
        ctx_tokens, ctx_mask, has_context = spec.task.teacher_prompts(
            rollout.problems, resp_tokens, resp_mask, choose_contexts(rewards_b, teacher_settings(spec)))
    return (jnp.concatenate([ctx_tokens, resp_tokens], axis=1), jnp.concatenate([ctx_mask, resp_mask], axis=1),
            has_context.astype(jnp.float32))


def rollout_passes(spec: TrainSpec, state: TrainState, tokens_bl, mask_bl, teacher_inputs=None) -> dict:
    """The no-gradient passes over the rollout under theta_t, one micro-batch at a time
    (`steps.map_micro_batches`: the update's per-device micro-batch, so peak memory does not
    grow with the rollout): {"logp_old_br", "entropy_br", "logp_ref_br"} `[B, R]` float32,
    plus "values_br" (an estimator with a critic) and "logp_teacher_br" (`teacher_inputs` =
    SDPO / VPD teacher (tokens `[B, Q + R]`, mask)).
    """
    p, temperature = spec.prompt_len, spec.rollout.temperature
    inputs = {"tokens_bl": tokens_bl, "mask_bl": mask_bl}
    teacher = None
    if teacher_inputs is not None:
        inputs.update(teacher_tokens_bq=teacher_inputs[0], teacher_mask_bq=teacher_inputs[1])
        teacher = state.params if spec.live_teacher else state.teacher_params

    def one(mb):
        out = {}
        out["logp_old_br"], out["entropy_br"] = response_logprobs(
            spec.model, state.params, mb["tokens_bl"], mb["mask_bl"], p, temperature=temperature,
            impl=spec.logprob_impl, with_entropy=True)
        out["logp_ref_br"], _ = response_logprobs(spec.model, state.ref_params, mb["tokens_bl"], mb["mask_bl"], p,
                                                  temperature=temperature, impl=spec.logprob_impl)
        if spec.has_critic:
            out["values_br"] = steps.critic_values(spec, state.critic["params"], mb["tokens_bl"], mb["mask_bl"])
        if teacher is not None:
            out["logp_teacher_br"] = algorithms.teacher_logprobs(spec, teacher, mb["teacher_tokens_bq"],
                                                                 mb["teacher_mask_bq"])
        return out

    return steps.map_micro_batches(spec, one, inputs)


def reward_components(spec: TrainSpec, rollout: Rollout) -> jax.Array | None:
    """The task's reward components `[B, C]` (`Task.reward_components`) when the estimator reads them, else None."""
    if spec.estimator is None or not spec.estimator.reward_components:
        return None
    return spec.task.reward_components(rollout.problems, *response_part(spec, rollout))


def prepare(spec: TrainSpec, state: TrainState, rollout: Rollout) -> tuple[TrainBatch, jax.Array, dict]:
    """Step 2: the training batch of B_t under theta_t, mu_t, and batch metrics (`prepare_batch` without
    the estimator's carried state)."""
    return prepare_batch(spec, state, rollout)[:3]


def prepare_batch(spec: TrainSpec, state: TrainState, rollout: Rollout) -> tuple[TrainBatch, jax.Array, dict, Any]:
    """Step 2: the training batch of B_t under theta_t, mu_t, batch metrics, and the advantage estimator's
    carried state with B_t folded in (`algorithms.estimate`; `state.estimator_state` for one without)."""
    p = spec.prompt_len
    tokens, mask = rollout.tokens_bl, rollout.mask_bl
    mask_br = mask[:, p:].astype(jnp.float32)
    lengths_b = jnp.sum(mask_br, axis=1)
    teacher = {}
    if spec.uses_teacher:
        t_tokens, t_mask, sd_mask = teacher_contexts(spec, rollout, rollout.rewards_b)
        teacher = dict(teacher_tokens_bq=t_tokens, teacher_mask_bq=t_mask, sd_mask_b=sd_mask,
                       rewards_b=rollout.rewards_b)
    passes = rollout_passes(spec, state, tokens, mask, (t_tokens, t_mask) if teacher else None)
    logp_old, entropy, logp_ref = passes["logp_old_br"], passes["entropy_br"], passes["logp_ref_br"]
    rewards_b = shaped_rewards(spec, rollout.rewards_b, lengths_b)
    token_rewards = advantages.outcome_token_rewards(rewards_b, mask_br)
    if spec.loss.kl_in_reward:
        token_rewards = advantages.kl_penalized_token_rewards(token_rewards, logp_old, logp_ref, mask_br,
                                                              beta=state.hyper.kl_coef,
                                                              estimator=spec.loss.kl_estimator)
    seq_rewards = advantages.sequence_rewards(token_rewards, mask_br)
    mu_t = jnp.mean(seq_rewards)
    if spec.pipo.mu_source == "raw" and rollout.mu_raw is not None:  # DAPO: every sampled group
        mu_t = rollout.mu_raw

    components = reward_components(spec, rollout)
    batch = TrainBatch(tokens_bl=tokens, mask_bl=mask, mask_br=mask_br, logp_old_br=logp_old, logp_ref_br=logp_ref,
                       values_br=passes.get("values_br"), logp_teacher_br=passes.get("logp_teacher_br"), **teacher)
    estimator_state, estimator_metrics = state.estimator_state, {}
    if spec.estimator is not None:
        adv, returns, estimator_state, estimator_metrics, fields = algorithms.estimate(spec, algorithms.AdvantageInputs(
            mask_br=mask_br, token_rewards_br=token_rewards, seq_rewards_b=seq_rewards, values_br=batch.values_br,
            tokens_br=tokens[:, p:], reward_components_bc=components), state.estimator_state)
        batch = batch.replace(adv_br=adv, returns_br=returns, **fields)
    if spec.advantage_shaping is not None:
        batch = batch.replace(adv_br=spec.advantage_shaping(spec, batch))
    batch = batch.replace(attr_br=algorithms.attribute(spec, batch))
    check_batch(batch)

    groups = advantages.group_outcome_counts(rollout.rewards_b, spec.rollout.group_size)
    metrics = {
        "reward_mean": jnp.mean(rollout.rewards_b), "reward_std": jnp.std(rollout.rewards_b),
        "response_length": jnp.mean(lengths_b), "entropy": masked_mean(entropy, mask_br),
        "kl_ref": masked_mean(kl_estimate(logp_old, logp_ref, "k3"), mask_br),
        "sampler_logp_gap": masked_mean(jnp.abs(rollout.sample_logp_br - logp_old), mask_br),
        "groups_all_fail_count": groups["all_fail"], "groups_mixed_count": groups["mixed"],
        "groups_all_success_count": groups["all_success"], "tokens": jnp.sum(mask_br),
    }
    if spec.uses_teacher:  # share of responses the teacher sees a solution or feedback for
        metrics["teacher_context_frac"] = jnp.mean(batch.sd_mask_b)
    if components is not None:
        metrics.update({f"reward_component/{part.name}": jnp.mean(components[:, k])
                        for k, part in enumerate(spec.task.reward_weights())})
    metrics.update({f"advantage/{k}": v for k, v in estimator_metrics.items()})
    return batch, mu_t, metrics, estimator_state


def pi_batch(prev: TrainBatch, rhat_br, signal_rows: bool = False) -> TrainBatch:
    """The PI step's batch: the stored B_{t-1} (`batch.stored`) with rhat in place of its
    attributions (the loss reads no advantages). `signal_rows`
    (`pipo.sdpo_pi_denominator=signal_tokens`): `sd_mask_b` marks the rows whose stored
    attribution carries a signal (`pipo.signal_rows`), so the mini-batch counts "sd" are theirs."""
    sd_mask = pipo.signal_rows(prev.attr_br, prev.mask_br) if signal_rows else None
    return prev.replace(attr_br=None, rhat_br=rhat_br, sd_mask_b=sd_mask)


def ppo_gated(spec: TrainSpec, batch: TrainBatch, mu_t, pipo_state: controller.PipoState) -> tuple[TrainBatch, dict]:
    """`pipo.authors.ppo_adv_gate` (PPO): the base advantages times clip(xi_gate, -2, 2), xi_gate
    from the window before this iteration's push (`controller.ppo_gate`); the attribution follows
    the gated advantages (their PI step reads the stored, gated ones); returns untouched."""
    options = spec.pipo_options
    gate, xi_gate = controller.ppo_gate(mu_t, pipo_state.mu_window_k, pipo_state.count, ddof=options.ddof,
                                  xi_clip=options.xi_clip)
    batch = batch.replace(adv_br=batch.adv_br * gate * batch.mask_br)
    batch = batch.replace(attr_br=algorithms.attribute(spec, batch))
    return batch, {"ppo_gate": gate, "ppo_gate_xi": xi_gate}


def pi_step(spec: TrainSpec, params, opt_state, pipo_state: controller.PipoState, mu_t, rng,
            platform: str | None = None, *, hyper: Hyperparameters):
    """Step 3: verification on B_{t-1}; returns (params, opt_state, metrics). A no-op unless it
    applies. `opt_state` is the shared optimizer state, or with `pipo.pi_optimizer=separate`
    the PI step's own (`TrainState.pi_opt_state`). `hyper`: the state's hyperparameters (lam, the
    PI step's learning rate and clip, the base learning rate written back after it).

    When the step does not apply (the first K iterations, or c = 0) params and optimizer
    state come out unchanged, bit for bit: its optimizer is gated by `pi_step_applied`
    (`make_optimizer(applies=...)`). What a skipped iteration still computes depends on the
    platform the program is built for (`platform`, default `spec.model.platform`; never the
    host's), as the layer loop chooses:

    * "cuda" / "tpu": each optimizer step's forward and backward passes sit in a `lax.cond` on
      `pi_step_applied` (`minibatch_updates(compute=...)`), so a skipped iteration computes no
      gradients; its gated AdamW steps run (elementwise, state unchanged). Params and optimizer
      state never pass through the conditional: a `lax.cond` around the whole update returns them
      as new buffers beside its operands, which put 8.1 GB on the PI step's peak (8B at fsdp=8 on the
      GPU target: 49.1 GB a device against the base step's 41.1; docs/scaling.md).
    * "cpu": the update runs every iteration (no conditional: XLA:CPU copies a conditional's
      operands).

    Both forms give the same params, optimizer state and metrics (tests/rl/test_pi_step_forms.py);
    under `vmap` a `lax.cond` runs both branches anyway.
    """
    # An explicit platform is checked as the model config checks its own.
    platform = spec.model.platform if platform is None else spec.model.replace(platform=platform).platform
    rhat, signal = controller.pi_verification(pipo_state, mu_t, lam=hyper.lam, options=spec.pipo_options,
                                        ppo=spec.algorithm.authors_ppo)
    applied = signal["pi_step_applied"]
    batch = pi_batch(pipo_state.prev, rhat, signal_rows=spec.pipo.sdpo_pi_denominator == "signal_tokens")
    check_batch(batch)
    loss_fn = steps.pi_loss_fn(spec, hyper=hyper)

    optimizer = make_optimizer(hyper.pi_lr, spec, applies=applied)
    params, opt_state, m = steps.minibatch_updates(spec, loss_fn, optimizer, params, with_lr(opt_state, hyper.pi_lr),
                                                   batch, rng, compute=None if platform == "cpu" else applied)
    opt_state = with_lr(opt_state, hyper.lr)
    m = jax.tree.map(lambda x: jnp.where(applied, x, jnp.zeros_like(x)), m)
    empty = pipo_state.count == 0  # no window statistics yet: log nothing rather than 0
    signal = dict(signal, mu_his=jnp.where(empty, jnp.nan, signal["mu_his"]),
                  sigma_his=jnp.where(empty, jnp.nan, signal["sigma_his"]))
    metrics = dict(signal, pi_step_applied=signal["pi_step_applied"].astype(jnp.float32),
                   **{f"pi/{k}": v for k, v in m.items()})
    return params, opt_state, metrics


def learn(spec: TrainSpec, state: TrainState, rollout: Rollout, rng) -> tuple[TrainState, dict]:
    """Steps 2-5 of one iteration; returns the new state and the iteration's metrics."""
    k_pi, k_base, k_critic = jax.random.split(rng, 3)
    hyper = state.hyper
    batch, mu_t, metrics, estimator_state = prepare_batch(spec, state, rollout)
    params, opt_state = state.params, state.opt_state
    teacher, teacher_opt, vpd_delta = state.teacher_params, state.teacher_opt_state, state.vpd_delta
    if spec.vpd is not None:
        # VPD E-step: refine the teacher on this batch's outcomes (anchored to theta_t), so the
        # M-step below distils toward the refined teacher; the attribution follows it.
        teacher, teacher_opt, vpd_delta, e_metrics = vpd_estep.maybe_e_step(
            spec, spec.vpd, state.step, teacher, teacher_opt, batch, None, vpd_delta, jax.random.fold_in(rng, 3),
            lr=hyper.vpd_lr)
        metrics.update(e_metrics)
        if spec.vpd.e_step and spec.attribution.teacher:  # the attribution follows the refined teacher
            logp_t = steps.micro_teacher_logprobs(spec, teacher, batch.teacher_tokens_bq, batch.teacher_mask_bq)
            batch = batch.replace(logp_teacher_br=logp_t)
            batch = batch.replace(attr_br=algorithms.attribute(spec, batch))
        metrics.update(vpd_estep.teacher_diagnostics(spec, teacher, params, batch))
    pipo_state, pi_opt_state = state.pipo, state.pi_opt_state
    if spec.pipo.enabled:
        if spec.pipo_options.ppo_adv_gate and spec.algorithm.authors_ppo:  # the window before any push
            batch, gate_metrics = ppo_gated(spec, batch, mu_t, pipo_state)
            metrics.update(gate_metrics)
        if spec.pipo_options.window_twice:  # authors' code: mu_t enters the window before xi, and again below
            pipo_state = controller.push_mean(pipo_state, mu_t)
        if spec.pipo.pi_optimizer == "separate":
            params, new_pi_opt, pi_metrics = pi_step(spec, params, pi_opt_state, pipo_state, mu_t, k_pi,
                                                     hyper=hyper)
            pi_metrics.update({f"pi/{k}": v for k, v in nonfinite_counts(pi_opt_state, new_pi_opt).items()})
            pi_opt_state = new_pi_opt
        else:
            params, opt_state, pi_metrics = pi_step(spec, params, opt_state, pipo_state, mu_t, k_pi, hyper=hyper)
        metrics.update(pi_metrics)
    else:
        metrics["mu_t"] = mu_t

    optimizer = make_optimizer(hyper.lr, spec)
    loss_fn = steps.base_loss_fn(spec, teacher, hyper=hyper)
    params, opt_state, base_metrics = steps.minibatch_updates(spec, loss_fn, optimizer, params,
                                                              with_lr(opt_state, hyper.lr), batch, k_base)
    metrics.update({f"train/{k}": v for k, v in base_metrics.items()})

    critic = state.critic
    if spec.has_critic:
        c_opt = make_optimizer(hyper.critic_lr, spec)
        c_params, c_state, c_metrics = steps.minibatch_updates(spec, steps.critic_loss_fn(spec), c_opt,
                                                               critic["params"],
                                                               with_lr(critic["opt_state"], hyper.critic_lr), batch,
                                                               k_critic)
        critic = {"params": c_params, "opt_state": c_state}
        metrics.update({f"critic/{k}": v for k, v in c_metrics.items()})

    if teacher is not None:
        teacher = distill.ema_update(teacher, params, spec.sdpo.ema_rate)

    metrics.update(nonfinite_counts(state.opt_state, opt_state))  # base and (shared) PI steps share the count
    if spec.has_critic:
        metrics.update({f"critic/{k}": v for k, v in nonfinite_counts(state.critic["opt_state"],
                                                                      critic["opt_state"]).items()})

    new_pipo = state.pipo
    if spec.pipo.enabled:
        new_pipo = controller.push(pipo_state, mu_t, stored(batch))
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, critic=critic,
                              teacher_params=teacher, pipo=new_pipo, teacher_opt_state=teacher_opt,
                              vpd_delta=vpd_delta, pi_opt_state=pi_opt_state, estimator_state=estimator_state)
    return new_state, metrics
