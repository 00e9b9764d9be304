"""The PIPO settings in the trainer, on the `micro` preset: the SDPO PI denominator
(`pipo.sdpo_pi_denominator`), the PI step's clip / ratio (`pipo.pi_clip_*`, `pi_ratio`), its own
optimizer state (`pipo.pi_optimizer=separate`), verl's per-micro-batch token-mean
(`pipo.authors.micro_token_mean`) and the authors' PPO gate (`pipo.authors.ppo_adv_gate`).
Expected values are worked out by hand in the comments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo, gspo, ppo, sdpo
from pipo_jax.models import qwen3
from pipo_jax.rl import algorithms, learn, rollout, steps
from pipo_jax.rl.batch import TrainBatch
from pipo_jax.rl.hyper import hyperparameters_of
from pipo_jax.rl.spec import ConfigError
from tests.rl.micro_trainer import fresh_state, learned, sampled
from tests.typed import spec_of


def _stored(spec, attr_br, logp_shift=0.0):
    """A stored batch of ones (tokens id 1, every position real) whose behaviour and reference
    log-probs are the model's own minus `logp_shift` (ratio exp(logp_shift) on every token)."""
    b, L, r = spec.batch, spec.seq_len, spec.rollout.max_new_tokens
    params = qwen3.init_params(spec.model, jax.random.PRNGKey(0))
    mb = learn.pi_batch(TrainBatch(
        tokens_bl=jnp.ones((b, L), jnp.int32), mask_bl=jnp.ones((b, L), jnp.int32),
        mask_br=jnp.ones((b, r)), logp_old_br=jnp.zeros((b, r)), logp_ref_br=jnp.zeros((b, r)), attr_br=attr_br),
        attr_br, signal_rows=spec.pipo.sdpo_pi_denominator == "signal_tokens")
    logp, _ = algorithms.student_logprobs(spec, params, mb)
    return params, mb.replace(logp_old_br=logp - logp_shift, logp_ref_br=logp)


@pytest.mark.parametrize("denominator", ["all_tokens", "signal_tokens"])
def test_sdpo_pi_denominator(denominator):
    c = sdpo.get_config("micro")  # token-mean, no KL term
    c.pipo.enabled = True
    c.pipo.sdpo_pi_denominator = denominator
    spec = spec_of(c)
    b, r = spec.batch, spec.rollout.max_new_tokens
    # rhat = 1 on every token of row 0 (the one row with a teacher signal), 0 elsewhere; ratio 1:
    # the surrogate is -sum(rhat) / denominator = -r / (b * r) = -1 / b over all tokens, -r / r = -1 over the signal row's
    rhat = jnp.zeros((b, r)).at[0].set(1.0)
    params, mb = _stored(spec, rhat)
    loss, metrics = steps.pi_loss_fn(spec, hyper=hyperparameters_of(spec))(params, mb, steps.response_counts(mb))
    expected = -1.0 / b if denominator == "all_tokens" else -1.0
    np.testing.assert_allclose(float(metrics["pg_loss"]), expected, rtol=1e-5)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)


def test_signal_tokens_needs_a_teacher_attribution():
    c = grpo.get_config("micro")
    c.pipo.sdpo_pi_denominator = "signal_tokens"
    with pytest.raises(ConfigError, match="config.pipo.sdpo_pi_denominator: 'signal_tokens' is for a teacher"):
        spec_of(c)


@pytest.mark.parametrize("overrides, clipfrac", [
    ({}, 1.0),  # GSPO's clip 3e-4 / 4e-4: s = exp(0.1) = 1.105 > 1 + 4e-4, rhat > 0: every token clipped
    ({"pi_clip_low": 0.2, "pi_clip_high": 0.2}, 0.0),  # 1.105 < 1.2: none clipped
    ({"pi_ratio": "token", "pi_clip_low": 0.05, "pi_clip_high": 0.05}, 1.0),  # token ratio 1.105 > 1.05
])
def test_gspo_pi_clip_and_ratio(overrides, clipfrac):
    c = gspo.get_config("micro")
    c.pipo.enabled = True
    for k, v in overrides.items():
        c.pipo[k] = v
    spec = spec_of(c)
    assert spec.pi_ratio == overrides.get("pi_ratio", "sequence")
    params, mb = _stored(spec, jnp.ones((spec.batch, spec.rollout.max_new_tokens)), logp_shift=0.1)
    loss, metrics = steps.pi_loss_fn(spec, hyper=hyperparameters_of(spec))(params, mb, steps.response_counts(mb))
    np.testing.assert_allclose(float(metrics["pg_clipfrac"]), clipfrac, atol=1e-6)
    # value: -min(s, clip(s)) * 1 = -1.0004 (clipped) or -1.105 (exp(0.1), unclipped / token ratio 1.05)
    bound = 1 + overrides.get("pi_clip_high", 4e-4)
    np.testing.assert_allclose(float(metrics["pg_loss"]), -min(np.exp(0.1), bound), rtol=1e-4)


@pytest.mark.parametrize("per_micro, grad", [
    (False, 2.0),  # mini-batch token-mean: (3 * 1 + 1 * 5) / 4 tokens
    (True, 3.0),  # per micro-batch (one row each) / 2: (3 / 3 + 5 / 1) / 2
])
def test_micro_token_mean(per_micro, grad):
    c = grpo.get_config("micro")
    c.train.micro_batch_size_per_device = 1
    c.pipo.authors.micro_token_mean = per_micro
    spec = spec_of(c)
    mini = {"x": jnp.array([[1.0, 1.0, 1.0], [5.0, 9.0, 9.0]]), "m": jnp.array([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])}
    counts_fn = lambda b: {"num_tokens": jnp.sum(b["m"])}  # noqa: E731

    def loss_fn(w, mb, counts):
        loss = w * jnp.sum(mb["x"] * mb["m"]) / counts["num_tokens"]
        return loss, {"loss": loss}

    grads, metrics = steps.accumulate_grads(spec, loss_fn, jnp.array(1.0), mini, counts_fn(mini), counts_fn)
    np.testing.assert_allclose([float(grads), float(metrics["loss"])], [grad, grad], rtol=1e-6)


# micro: 4 groups of G = 4 (mixed groups, nonzero GRPO advantages); K = 2
REWARDS = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 1]]


def _iterate(c, n=4):
    spec, state = fresh_state(c)
    metrics = []
    for i, pattern in enumerate(REWARDS[:n]):
        ro = sampled(spec, state.params, jax.random.PRNGKey(10 + i))
        state, m = learned(spec, state, rollout.with_rewards(ro, jnp.array(pattern * (spec.batch // 4), jnp.float32)),
                           jax.random.PRNGKey(20 + i))
        metrics.append({k: float(v) for k, v in m.items() if np.ndim(v) == 0})
    return spec, state, metrics


def _adam_count(opt_state) -> int:
    counts = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(opt_state)[0]
              if "count" in jax.tree_util.keystr(path) and "notfinite" not in jax.tree_util.keystr(path)]
    return int(counts[0])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["shared", "separate"])
def test_pi_optimizer_separate_keeps_the_base_state_apart(mode):
    c = grpo.get_config("micro")
    c.pipo.enabled = True
    c.pipo.pi_optimizer = mode
    spec, state, metrics = _iterate(c)
    steps_per_update = spec.train.epochs * spec.batch // spec.mini_batch
    pi_steps = int(sum(m["pi_step_applied"] for m in metrics))
    assert pi_steps == 2  # K = 2: iterations 3 and 4
    base = 4 * steps_per_update
    if mode == "shared":
        assert state.pi_opt_state is None
        assert _adam_count(state.opt_state) == base + pi_steps * steps_per_update
    else:
        assert _adam_count(state.opt_state) == base
        assert _adam_count(state.pi_opt_state) == pi_steps * steps_per_update
        assert metrics[2]["pi/nonfinite_updates"] == 0.0


@pytest.mark.slow
def test_ppo_adv_gate_and_sign_attribution_in_the_trainer():
    c = ppo.get_config("micro")
    c.pipo.enabled = True
    c.pipo.authors.ppo_adv_gate = True
    c.pipo.authors.ppo_sign_attribution = True
    spec, state, metrics = _iterate(c, n=2)
    # iteration 1: empty window -> gate 0 (advantages zeroed, so the stored attribution is 0)
    # iteration 2: window [0.25] (one mean: sigma 1): xi_gate = 0.5 - 0.25, gate 0.25
    np.testing.assert_allclose([metrics[0]["ppo_gate"], metrics[1]["ppo_gate"]], [0.0, 0.25], atol=1e-6)
    attr = np.asarray(state.pipo.prev.attr_br)
    mask = np.asarray(state.pipo.prev.mask_br)
    assert set(np.unique(np.round(attr[mask > 0], 5))) <= {-1.0, 0.0, 1.0}  # about sign(abar) per response
    rows = np.abs(attr).sum(-1) > 0  # rows with a nonzero mean advantage: +-1 on every valid token
    assert rows.any() and np.all((np.abs(attr[rows]) == 1) | (mask[rows] == 0))
