"""Every array function of pipo_jax.losses gives the same result eagerly, under jax.jit and under jax.vmap.

A host-side helper is not traced by design: `theory.grpo_gradient_scale_mc` (numpy statistics).
"""

import functools
import zlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.kernels import softmax_stats
from pipo_jax.losses import advantages as adv
from pipo_jax.losses import aggregation, distill, kl, masking, pipo, policy, theory, value
from pipo_jax.rl import controller
from pipo_jax.rl.batch import TrainBatch

B, T, V, L, K = 4, 3, 6, 5, 3


def f32(rng, *shape, scale=1.0):
    return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)


def mask(rng):
    m = (rng.random((B, T)) < 0.7).astype(np.float32)
    m[:, 0] = 1.0
    return jnp.asarray(m)


def logp(rng):
    return jnp.asarray(-rng.random((B, T)) - 0.1, jnp.float32)


def stored(rng):
    return TrainBatch(
        tokens_bl=jnp.asarray(rng.integers(0, 9, (B, L)), jnp.int32), mask_bl=jnp.ones((B, L), jnp.int32),
        mask_br=mask(rng), logp_old_br=logp(rng), logp_ref_br=logp(rng), attr_br=f32(rng, B, T),
    )


def state(rng):
    s = controller.init_pipo_state(K, stored(rng))
    for _ in range(int(rng.integers(K - 1, K + 2))):
        s = controller.push(s, float(rng.normal()), stored(rng))
    return s


CLIP = {"ratio_low": 1 - 0.2, "ratio_high": 1 + 0.28, "clip_ratio_c": 3.0}
CASES = {
    # name: (function of arrays only, argument factory)
    "masking.as_mask": (masking.as_mask, lambda r: (mask(r) > 0,)),
    "masking.masked_mean": (functools.partial(masking.masked_mean, axis=-1), lambda r: (f32(r, B, T), mask(r))),
    "masking.last_valid_index": (masking.last_valid_index, lambda r: (mask(r),)),
    "aggregation.aggregation_counts": (aggregation.aggregation_counts, lambda r: (mask(r),)),
    "aggregation.token_mean": (aggregation.token_mean, lambda r: (f32(r, B, T), mask(r), 9.0)),
    **{
        f"aggregation.aggregate[{m}]": (functools.partial(aggregation.aggregate, agg=aggregation.Aggregation(m)),
                                        lambda r: (f32(r, B, T), mask(r)))
        for m in aggregation.AGG_MODES
    },
    "adv.outcome_token_rewards": (adv.outcome_token_rewards, lambda r: (f32(r, B), mask(r))),
    "adv.kl_penalized_token_rewards": (functools.partial(adv.kl_penalized_token_rewards, beta=0.1),
                                       lambda r: (f32(r, B, T), logp(r), logp(r), mask(r))),
    "adv.sequence_rewards": (adv.sequence_rewards, lambda r: (f32(r, B, T), mask(r))),
    "adv.gae": (functools.partial(adv.gae, gamma=0.9, lam=0.8), lambda r: (f32(r, B, T), f32(r, B, T), mask(r))),
    "adv.masked_whiten": (adv.masked_whiten, lambda r: (f32(r, B, T), mask(r))),
    "adv.group_relative_advantages": (functools.partial(adv.group_relative_advantages, group_size=2, std_ddof=1),
                                      lambda r: (jnp.asarray(r.integers(0, 2, B), jnp.float32),)),
    "adv.broadcast_over_tokens": (adv.broadcast_over_tokens, lambda r: (f32(r, B), mask(r))),
    "adv.dapo_group_filter": (functools.partial(adv.dapo_group_filter, group_size=2),
                              lambda r: (jnp.asarray(r.integers(0, 2, B), jnp.float32),)),
    "adv.group_outcome_counts": (functools.partial(adv.group_outcome_counts, group_size=2),
                                 lambda r: (jnp.asarray(r.integers(0, 2, B), jnp.float32),)),
    "adv.overlong_penalty": (functools.partial(adv.overlong_penalty, max_len=20, buffer=4),
                             lambda r: (jnp.asarray(r.integers(10, 21, B)),)),
    "kl.kl_k1": (kl.kl_k1, lambda r: (logp(r), logp(r))),
    "kl.kl_k2": (kl.kl_k2, lambda r: (logp(r), logp(r))),
    "kl.kl_k3": (kl.kl_k3, lambda r: (logp(r), logp(r))),
    "kl.kl_estimate": (functools.partial(kl.kl_estimate, estimator="k3"), lambda r: (logp(r), logp(r))),
    "kl.kl_loss": (functools.partial(kl.kl_loss, agg=aggregation.Aggregation("seq-mean-token-mean")),
                   lambda r: (logp(r), logp(r), mask(r))),
    "softmax_stats.token_entropy": (softmax_stats.token_entropy, lambda r: (f32(r, B, T, V, scale=3.0),)),
    "value.clipped_value_loss": (functools.partial(value.clipped_value_loss, agg=aggregation.Aggregation("token-mean")),
                                 lambda r: (f32(r, B, T), f32(r, B, T), f32(r, B, T), mask(r))),
    "policy.token_log_ratio": (policy.token_log_ratio, lambda r: (logp(r), logp(r))),
    "policy.sequence_log_ratio": (policy.sequence_log_ratio, lambda r: (logp(r), logp(r), mask(r))),
    "policy.gspo_token_log_ratio": (policy.gspo_token_log_ratio, lambda r: (logp(r), logp(r), mask(r))),
    "policy.clipped_surrogate": (functools.partial(policy.clipped_surrogate, **CLIP),
                                 lambda r: (f32(r, B, T, scale=0.5), f32(r, B, T))),
    "policy.token_clip_loss": (functools.partial(policy.token_clip_loss, agg=aggregation.Aggregation("token-mean"),
                                                 **CLIP),
                               lambda r: (logp(r), logp(r), f32(r, B, T), mask(r))),
    "policy.gspo_loss": (policy.gspo_loss, lambda r: (logp(r), logp(r), f32(r, B, T), mask(r))),
    "distill.student_topk_with_tail": (functools.partial(distill.student_topk_with_tail, k=3),
                                       lambda r: (jax.nn.log_softmax(f32(r, B, T, V)),
                                                  jax.nn.log_softmax(f32(r, B, T, V)))),
    "distill.generalized_jsd": (functools.partial(distill.generalized_jsd, alpha=0.5),
                                lambda r: (jax.nn.log_softmax(f32(r, B, T, V)), jax.nn.log_softmax(f32(r, B, T, V)))),
    "distill.reverse_kl_token_loss": (distill.reverse_kl_token_loss, lambda r: (logp(r), logp(r))),
    "distill.importance_weight": (distill.importance_weight, lambda r: (logp(r), logp(r))),
    "distill.sdpo_token_loss": (lambda lp, old, m, t, sd: distill.sdpo_token_loss(lp, old, None, m, logp_teacher_br=t,
                                                                                   sd_mask_b=sd),
                                lambda r: (logp(r), logp(r), mask(r), logp(r), jnp.asarray(r.integers(0, 2, B)))),
    "distill.sdpo_jsd_loss": (lambda lp, old, m, s, t: distill.sdpo_jsd_loss(
        lp, old, None, m, student_distill_logp_brn=s, teacher_distill_logp_brn=t),
        lambda r: (logp(r), logp(r), mask(r), jax.nn.log_softmax(f32(r, B, T, V)),
                   jax.nn.log_softmax(f32(r, B, T, V)))),
    "distill.token_attribution": (distill.token_attribution, lambda r: (logp(r), logp(r), mask(r))),
    "distill.select_demonstrations": (functools.partial(distill.select_demonstrations, group_size=2),
                                      lambda r: (jnp.asarray(r.integers(0, 2, B), jnp.float32),)),
    "distill.ema_update": (distill.ema_update, lambda r: ({"w": f32(r, 2, 3)}, {"w": f32(r, 2, 3)})),
    "controller.window_statistics": (functools.partial(controller.window_statistics, ddof=1),
                               lambda r: (f32(r, K), jnp.int32(r.integers(0, K + 1)))),
    "controller.rectify": (functools.partial(controller.rectify, lam=0.1), lambda r: (f32(r, 5),)),
    "controller.improvement_signal": (functools.partial(controller.improvement_signal, lam=0.1, ddof=1),
                                lambda r: (f32(r), f32(r, K), jnp.int32(r.integers(K - 1, K + 1)))),
    "controller.window_full": (controller.window_full, lambda r: (state(r),)),
    "controller.pi_step_ready": (controller.pi_step_ready, lambda r: (state(r), f32(r))),
    "pipo.group_attribution": (functools.partial(pipo.group_attribution, group_size=2),
                               lambda r: (f32(r, B, T), mask(r))),
    "pipo.gae_attribution": (pipo.gae_attribution, lambda r: (f32(r, B, T), mask(r))),
    "pipo.pi_rewards": (pipo.pi_rewards, lambda r: (f32(r, B, T), f32(r), mask(r))),
    "pipo.pi_surrogate_loss": (functools.partial(pipo.pi_surrogate_loss, agg=aggregation.Aggregation("token-mean"),
                                                 no_lower_clip=True),
                               lambda r: (logp(r), logp(r), f32(r, B, T), mask(r))),
    "controller.pi_verification": (controller.pi_verification, lambda r: (state(r), f32(r))),
    "controller.push": (controller.push, lambda r: (state(r), f32(r), stored(r))),
    "controller.init_pipo_state": (lambda template: controller.init_pipo_state(K, template), lambda r: (stored(r),)),
    "theory.eta": (functools.partial(theory.eta, group_size=8), lambda r: (jnp.asarray(r.random(5) * 0.98 + 0.01),)),
    "theory.eta_asymptote": (functools.partial(theory.eta_asymptote, group_size=8),
                             lambda r: (jnp.asarray(r.random(5) * 0.98 + 0.01),)),
    "theory.bandit_success_probability": (theory.bandit_success_probability,
                                          lambda r: (f32(r, 5), jnp.asarray(r.integers(0, 2, 5)))),
}


def _close(a, b):
    chex.assert_trees_all_close(a, b, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(CASES))
def test_jit_and_vmap_match_eager(name):
    fn, make = CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    samples = [make(rng), make(rng)]
    eager = [fn(*args) for args in samples]
    _close(jax.jit(fn)(*samples[0]), eager[0])
    stacked_args = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *samples)
    batched = jax.jit(jax.vmap(fn))(*stacked_args)
    _close(batched, jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *eager))
