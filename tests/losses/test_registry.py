"""Registry: every entry is reachable by name with its documented uniform signature."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo
from pipo_jax.losses import advantages, distill, pipo, registry
from pipo_jax.losses.aggregation import AGG_MODES, aggregate
from pipo_jax.rl.spec import ConfigError, train_spec

B, T = 4, 3
MASK = jnp.array([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], jnp.float32)


def test_advantage_estimators():
    rewards = jnp.array([1.0, 0.0, 0.0, 0.0])
    adv, aux = registry.ADVANTAGE_ESTIMATORS["grpo"]({"seq_rewards_b": rewards, "mask_bt": MASK}, group_size=2)
    chex.assert_trees_all_close(adv, advantages.broadcast_over_tokens(advantages.group_relative_advantages(rewards, 2),
                                                                      MASK))
    assert aux == {} and registry.ADVANTAGE_ESTIMATORS["group_relative"] is registry.ADVANTAGE_ESTIMATORS["grpo"]
    tok = advantages.outcome_token_rewards(rewards, MASK)
    values = jnp.full((B, T), 0.25)
    adv, aux = registry.ADVANTAGE_ESTIMATORS["gae"]({"token_rewards_bt": tok, "values_bt": values, "mask_bt": MASK})
    raw, ret = advantages.gae(tok, values, MASK)
    chex.assert_trees_all_close(adv, advantages.masked_whiten(raw, MASK))
    chex.assert_trees_all_close(aux["returns_bt"], ret)
    adv_raw, _ = registry.ADVANTAGE_ESTIMATORS["gae"]({"token_rewards_bt": tok, "values_bt": values, "mask_bt": MASK},
                                                      whiten=False)
    chex.assert_trees_all_close(adv_raw, raw)
    with pytest.raises(KeyError, match="needs batch\\['values_bt'\\]"):
        registry.ADVANTAGE_ESTIMATORS["gae"]({"token_rewards_bt": tok, "mask_bt": MASK})


@pytest.mark.parametrize("name", sorted(registry.POLICY_LOSSES))
def test_policy_losses_uniform_signature(name):
    rng = np.random.default_rng(0)
    logp = jnp.asarray(-rng.random((B, T)), jnp.float32)
    old = logp - 0.1
    adv = jnp.asarray(rng.normal(size=(B, T)), jnp.float32)
    extra = {}
    if name == "sdpo_token":
        extra = {"logp_teacher_bt": logp - 0.3}
    if name == "sdpo_jsd":
        s = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(B, T, 5)), jnp.float32))
        extra = {"student_distill_logp_btn": s, "teacher_distill_logp_btn": s[..., ::-1]}
    fn = registry.POLICY_LOSSES[name]
    loss, metrics = fn(logp, old, adv, MASK, loss_agg_mode="token-mean", num_tokens=20.0, num_seqs=None,
                       norm_length=None, **extra)
    assert loss.shape == () and bool(jnp.isfinite(loss)) and float(loss) != 0.0
    assert all(v.shape == () for v in metrics.values())
    half, _ = fn(logp, old, adv, MASK, loss_agg_mode="token-mean", num_tokens=40.0, **extra)
    chex.assert_trees_all_close(half, loss / 2, rtol=1e-6)  # the global count is honoured


def test_attributions():
    adv = jnp.array([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0], [2.0, 0.0, 0.0], [2.0, 2.0, 2.0]])
    got = registry.ATTRIBUTIONS["group"]({"adv_bt": adv, "mask_bt": MASK}, group_size=2)
    chex.assert_trees_all_close(got, pipo.group_attribution(adv, MASK, 2))
    chex.assert_trees_all_close(registry.ATTRIBUTIONS["gae"]({"adv_bt": adv, "mask_bt": MASK}), adv * MASK)
    sd = registry.ATTRIBUTIONS["sdpo_token"]({"logp_teacher_bt": adv, "logp_bt": 2 * adv, "mask_bt": MASK})
    chex.assert_trees_all_close(sd, distill.token_attribution(adv, 2 * adv, MASK))


def test_aggregations_and_kl_tables():
    loss = jnp.arange(12, dtype=jnp.float32).reshape(B, T)
    for mode in AGG_MODES:  # every mode `loss.agg_mode` accepts aggregates to a finite scalar
        out = aggregate(loss, MASK, mode, num_tokens=7.0, num_seqs=4.0, norm_length=3.0)
        assert out.shape == () and bool(jnp.isfinite(out))
    assert sorted(registry.KL_ESTIMATORS) == ["k1", "k2", "k3"]


@pytest.mark.parametrize("key, table", [("policy", registry.POLICY_LOSSES), ("kl_estimator", registry.KL_ESTIMATORS)])
def test_unregistered_names_are_config_errors_naming_field_and_choices(key, table):
    """The tables are looked up by the names `train_spec` validated: an unregistered name fails
    at start-up with the config key and the registered choices."""
    c = grpo.get_config("micro")
    c.loss[key] = "ppo"
    with pytest.raises(ConfigError, match=f"config.loss.{key}: 'ppo' is not one of .*{sorted(table)[-1]}"):
        train_spec(c)
