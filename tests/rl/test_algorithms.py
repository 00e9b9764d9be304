"""Algorithms as registered objects (`rl/algorithms.py`): every entry against the pure loss math it
binds, the config checks that come from the declarations, and no name branch in the learner."""

import ast
import importlib
import pathlib
from types import SimpleNamespace

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import bapo, clip_cov, disco, dr_grpo, drpo, grpo, kl_cov, ppo, reinforce_pp, rloo, sdpo, vpd
from pipo_jax.losses import adora, advantages, bnpo, copo, cov, distill, gdpo, pipo, riskpo
from pipo_jax.losses import vpd as vpd_loss
from pipo_jax.losses.aggregation import Aggregation
from pipo_jax.losses.bapo import bapo_loss
from pipo_jax.losses.disco import disco_loss
from pipo_jax.losses.drpo import drpo_loss
from pipo_jax.losses.policy import cispo_loss, gspo_loss, token_clip_loss
from pipo_jax.models import qwen3
from pipo_jax.rl import algorithms, controller, steps
from pipo_jax.rl.algorithms import AdvantageInputs
from pipo_jax.rl.batch import TrainBatch
from pipo_jax.rl.hyper import hyperparameters_of
from pipo_jax.rl.response_logprobs import response_logprobs
from pipo_jax.rl.spec import ConfigError
from pipo_jax.tasks.protocol import RewardComponent
from tests.typed import spec_of

B, T = 4, 3
MASK = jnp.array([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], jnp.float32)
REPO = pathlib.Path(__file__).resolve().parents[2]


def _spec_ns(**sections):
    return SimpleNamespace(**{k: SimpleNamespace(**v) for k, v in sections.items()})


def test_advantage_estimators_bind_the_pure_functions():
    rewards = jnp.array([1.0, 0.0, 0.0, 0.0])
    tok = advantages.outcome_token_rewards(rewards, MASK)
    spec = _spec_ns(rollout=dict(group_size=2), advantage=dict(std_ddof=1, norm_by_std=True, gamma=0.9, lam=0.8))
    grp = algorithms.ADVANTAGE_ESTIMATORS["grpo"]
    assert algorithms.ADVANTAGE_ESTIMATORS["group_relative"] is grp and not grp.critic
    adv, returns = grp.fn(spec, AdvantageInputs(MASK, tok, rewards))
    want = advantages.group_relative_advantages(rewards, 2, std_ddof=1)
    chex.assert_trees_all_close(adv, advantages.broadcast_over_tokens(want, MASK))
    assert returns is None
    gae = algorithms.ADVANTAGE_ESTIMATORS["gae"]
    values = jnp.full((B, T), 0.25)
    adv, returns = gae.fn(spec, AdvantageInputs(MASK, tok, rewards, values))
    raw, ret = advantages.gae(tok, values, MASK, gamma=0.9, lam=0.8)
    chex.assert_trees_all_close(adv, advantages.masked_whiten(raw, MASK))
    chex.assert_trees_all_close(returns, ret)  # returns are never whitened
    assert gae.critic


def _estimator_cases():
    """Each registered estimator's pure function (`pipo_jax.losses.advantages`) with the spec below."""
    def grpo_case(spec, x):
        return advantages.broadcast_over_tokens(advantages.group_relative_advantages(x.seq_rewards_b, 2, std_ddof=1),
                                                x.mask_br)
    return {
        "grpo": grpo_case,
        "group_relative": grpo_case,
        "gae": lambda spec, x: advantages.masked_whiten(advantages.gae(x.token_rewards_br, x.values_br, x.mask_br,
                                                                       gamma=0.9, lam=0.8)[0], x.mask_br),
        "rloo": lambda spec, x: advantages.broadcast_over_tokens(
            advantages.leave_one_out_advantages(x.seq_rewards_b, 2), x.mask_br),
        "reinforce_pp": lambda spec, x: advantages.reinforce_pp_advantages(x.token_rewards_br, x.mask_br, gamma=0.9),
        "reinforce_pp_baseline": lambda spec, x: advantages.reinforce_pp_baseline_advantages(x.seq_rewards_b,
                                                                                            x.mask_br, 2),
        "bnpo": _bnpo_case,
        "copo": grpo_case,  # the local advantage; its batch fields are checked against `copo_advantages` below
        "riskpo": lambda spec, x: advantages.broadcast_over_tokens(
            riskpo.riskpo_advantages(x.seq_rewards_b, 2, bundle_size=2, alpha=0.25, beta=0.75, omega=2.0,
                                     natural_baseline=False, credit="std"), x.mask_br),
        "gdpo": lambda spec, x: advantages.broadcast_over_tokens(
            gdpo.gdpo_advantages(x.reward_components_bc, (1.0, 0.5), 2, std_ddof=1), x.mask_br),
        "adora": lambda spec, x: advantages.broadcast_over_tokens(_adora_case(x)[0], x.mask_br),
    }


def _adora_case(x):
    """ADORA at lambda .25, correct above .5, cut at 3 tokens (max_new_tokens): (A_b, w_b)."""
    return adora.adora_advantages(x.seq_rewards_b, jnp.sum(x.mask_br, axis=1), 2, success_threshold=0.5,
                                  max_length=3, tds_weight=0.25, std_ddof=1)


def _bnpo_case(spec, x):
    """BNPO at decay .5 after a first batch of rates 1, 0 (`_BNPO_BEFORE`): alpha, beta of that pool with this
    batch's rates folded in."""
    state = bnpo.init_bnpo_state()
    for rewards in (_BNPO_BEFORE, x.seq_rewards_b):
        state = bnpo.update_bnpo_state(state, bnpo.success_rates(rewards, 2), decay=0.5)
    params = bnpo.beta_parameters(state)
    return advantages.broadcast_over_tokens(bnpo.bnpo_advantages(x.seq_rewards_b, 2, params["alpha"], params["beta"]),
                                            x.mask_br)


_BNPO_BEFORE = jnp.array([1.0, 1.0, 0.0, 0.0])


def test_every_registered_estimator_has_a_case():
    assert sorted(_estimator_cases()) == sorted(algorithms.ADVANTAGE_ESTIMATORS)


@pytest.mark.parametrize("name", sorted(_estimator_cases()))
def test_registered_estimator_equals_its_advantage_math(name):
    """`spec.estimator.fn` = its pure function with the spec's settings (G = 2, gamma .9, lam .8, ddof 1),
    on token rewards with a KL part (so the return varies along a response) and an outcome."""
    rewards = jnp.array([1.0, 0.0, 0.5, 0.5])
    tok = advantages.outcome_token_rewards(rewards, MASK) - 0.1 * jnp.arange(T, dtype=jnp.float32) * MASK
    x = AdvantageInputs(MASK, tok, advantages.sequence_rewards(tok, MASK), jnp.full((B, T), 0.25),
                        tokens_br=jnp.array([[3, 4, 5], [3, 4, 0], [3, 0, 0], [3, 7, 7]]),
                        reward_components_bc=jnp.array([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0], [1.0, -1.0]]))
    parts = (RewardComponent("answer", 1.0), RewardComponent("stop", 0.5))  # the task's, GDPO's weights
    advantage = dict(std_ddof=1, norm_by_std=True, gamma=0.9, lam=0.8,
                     bnpo=SimpleNamespace(decay=0.5, reward_min=0.0, reward_max=1.0),
                     copo=SimpleNamespace(outcome="response", gamma=2.0, rho=0.5, blend="soft",
                                          consistency_reward=True),
                     riskpo=SimpleNamespace(bundle_size=2, alpha=0.25, beta=0.75, omega=2.0, natural_baseline=False,
                                            credit="std"),
                     adora=SimpleNamespace(tds_weight=0.25, success_threshold=0.5, max_length=0))
    spec = _spec_ns(task=dict(reward_weights=lambda: parts), loss=dict(kl_in_reward=False),
                    dapo=dict(overlong_buffer=0), rollout=dict(group_size=2, max_new_tokens=T), advantage=advantage)
    est = algorithms.ADVANTAGE_ESTIMATORS[name]
    if est.carried is not None:  # the state after an earlier batch, then this one folded in (`algorithms.estimate`)
        before = est.carried.update(spec, est.carried.init(spec), x._replace(seq_rewards_b=_BNPO_BEFORE))[0]
        x = x._replace(state=est.carried.update(spec, before, x)[0])
    got, returns, *fields = est.fn(spec, x)
    chex.assert_trees_all_close(got, _estimator_cases()[name](spec, x), atol=1e-6)
    if name == "copo":  # every response its own outcome: H = 1 bit in both groups
        glob, w, _ = copo.copo_advantages(x.seq_rewards_b, got[:, 0], x.tokens_br, MASK, group_size=2, gamma=2.0,
                                          rho=0.5, blend="soft", consistency_reward=True)
        chex.assert_trees_all_close(fields[0], {"global_adv_b": glob, "local_weight_b": w})
        chex.assert_trees_all_close(w, jnp.full(B, 1 / (1 + np.exp(-1.0))), rtol=1e-6)
    elif name == "adora":  # seq rewards .7, -.1 | .5, .2: prompt 0's correct 3 tokens > 2, prompt 1 has none correct
        chex.assert_trees_all_close(fields[0], {"adora_weight_b": _adora_case(x)[1]})
        np.testing.assert_allclose(fields[0]["adora_weight_b"], [1.0, 1.0, 0.25, 0.25])
    else:
        assert not fields
    assert (returns is not None) == algorithms.ADVANTAGE_ESTIMATORS[name].critic
    assert float(jnp.max(jnp.abs(got))) > 0.1 and bool(jnp.all(got * (1 - MASK) == 0))


def test_rloo_and_reinforce_pp_estimators_by_hand():
    """configs/rloo.py and configs/reinforce_pp.py (G = 2 groups of the micro preset's shapes here):
    RLOO r_i - r_other on every token; REINFORCE++ the whitened return over the batch's tokens;
    its baseline variant r_i - group mean, whitened. Declared group: RLOO and the baseline only."""
    est = algorithms.ADVANTAGE_ESTIMATORS
    assert est["rloo"].group and est["reinforce_pp_baseline"].group and not est["reinforce_pp"].group
    assert not any(est[n].critic for n in ("rloo", "reinforce_pp", "reinforce_pp_baseline"))
    spec = _spec_ns(rollout=dict(group_size=2), advantage=dict(gamma=1.0))
    rewards = jnp.array([1.0, 0.0, 0.75, 0.25])
    x = AdvantageInputs(MASK, advantages.outcome_token_rewards(rewards, MASK), rewards)
    adv, _ = est["rloo"].fn(spec, x)  # G = 2: the other response is the baseline
    chex.assert_trees_all_close(adv, jnp.array([1.0, -1.0, 0.5, -0.5])[:, None] * MASK)
    # REINFORCE++ with the outcome only: 3 + 2 + 1 + 3 tokens of 1, 0, .75, .25; mean 4.5 / 9 = .5,
    # unbiased var (3 * .25 + 2 * .25 + .0625 + 3 * .0625) / 8 = 1.5 / 8
    adv, _ = est["reinforce_pp"].fn(spec, x)
    sd = np.sqrt(1.5 / 8 + 1e-8)
    chex.assert_trees_all_close(adv, jnp.array([0.5, -0.5, 0.25, -0.25])[:, None] / sd * MASK, rtol=1e-5)
    # the baseline variant, rewards 1, 0 | 1, 1: r - group mean = .5, -.5, 0, 0 on 3, 2, 1, 3 tokens:
    # mean .5 / 9, squared deviations 3 (.5 - m)^2 + 2 (.5 + m)^2 + 4 m^2 over 8 (the plain variant: mean 7 / 9)
    rewards = jnp.array([1.0, 0.0, 1.0, 1.0])
    x = AdvantageInputs(MASK, advantages.outcome_token_rewards(rewards, MASK), rewards)
    adv, _ = est["reinforce_pp_baseline"].fn(spec, x)
    m = 0.5 / 9
    sd = np.sqrt((3 * (0.5 - m) ** 2 + 2 * (0.5 + m) ** 2 + 4 * m ** 2) / 8 + 1e-8)
    chex.assert_trees_all_close(adv, (jnp.array([0.5, -0.5, 0.0, 0.0])[:, None] - m) / sd * MASK, rtol=1e-5)
    plain, _ = est["reinforce_pp"].fn(spec, x)
    assert float(jnp.max(jnp.abs(plain - adv))) > 0.1


def test_rloo_and_reinforce_pp_configs_resolve_their_pieces():
    """The algorithm files: RLOO takes only its estimator and the group attribution (G >= 2);
    REINFORCE++ both of its estimators, the advantages as attribution, and G = 1."""
    r = spec_of(rloo.get_config("micro"))
    assert (r.algorithm.name, r.estimator.name, r.policy.name, r.attribution.name, r.loss.kl_in_reward,
            r.loss.kl_estimator) == ("rloo", "rloo", "token_clip", "group", True, "k1")
    p = spec_of(reinforce_pp.get_config("micro"))
    assert (p.algorithm.name, p.estimator.name, p.policy.name, p.attribution.name, p.loss.kl_in_reward,
            p.advantage.gamma) == ("reinforce_pp", "reinforce_pp", "token_clip", "gae", True, 1.0)
    c = reinforce_pp.get_config("micro")
    c.rollout.group_size = 1  # REINFORCE++ samples k >= 1 responses per prompt
    assert spec_of(c).rollout.group_size == 1
    c.advantage.estimator = "reinforce_pp_baseline"
    with pytest.raises(ConfigError, match=r"config\.rollout\.group_size: G=1 with a group method "
                                          r"\(advantage\.estimator='reinforce_pp_baseline'"):
        spec_of(c)
    c.rollout.group_size = 4
    assert spec_of(c).estimator.name == "reinforce_pp_baseline"
    c = rloo.get_config("micro")
    c.advantage.estimator = "grpo"
    with pytest.raises(ConfigError, match=r"config\.advantage\.estimator: 'grpo' does not fit algorithm='rloo' "
                                          r"\(expected one of \('rloo',\)\)"):
        spec_of(c)
    c = rloo.get_config("micro")
    c.rollout.group_size = 1
    with pytest.raises(ConfigError, match=r"config\.rollout\.group_size: G=1 with a group method "
                                          r"\(advantage\.estimator='rloo'"):
        spec_of(c)
    # REINFORCE++'s attribution is its advantages; the authors' PPO sign switch is PPO's only
    batch = TrainBatch(tokens_bl=jnp.zeros((B, 5), jnp.int32), mask_bl=jnp.ones((B, 5), jnp.int32), mask_br=MASK,
                       logp_old_br=jnp.zeros((B, T)), logp_ref_br=jnp.zeros((B, T)),
                       adv_br=jnp.array([[0.5, 1.0, 2.0], [-1.0, -0.5, 3.0], [0.2, 9.0, 9.0], [1.0, 1.0, 1.0]]))
    c = reinforce_pp.get_config("micro")
    c.pipo.compat = True
    compat = spec_of(c)
    assert compat.pipo_options.ppo_sign_attribution
    chex.assert_trees_all_close(algorithms.attribute(compat, batch), batch.adv_br * MASK)


def test_attributions_bind_the_pure_functions():
    adv = jnp.array([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0], [2.0, 0.0, 0.0], [2.0, 2.0, 2.0]])
    batch = TrainBatch(tokens_bl=jnp.zeros((B, 5), jnp.int32), mask_bl=jnp.ones((B, 5), jnp.int32), mask_br=MASK,
                       logp_old_br=2 * adv, logp_ref_br=jnp.zeros((B, T)), adv_br=adv, logp_teacher_br=adv,
                       sd_mask_b=jnp.array([1.0, 0.0, 1.0, 1.0]))
    for eps_add in (False, True):
        spec = SimpleNamespace(rollout=SimpleNamespace(group_size=2),
                               pipo_options=controller.PipoOptions(attribution_eps_add=eps_add))
        chex.assert_trees_all_close(algorithms.ATTRIBUTIONS["group"].fn(spec, batch),
                                    pipo.group_attribution(adv, MASK, 2, eps_add))
    gae = algorithms.ATTRIBUTIONS["gae"]
    plain = SimpleNamespace(pipo_options=controller.PipoOptions(), algorithm=SimpleNamespace(authors_ppo=True))
    chex.assert_trees_all_close(gae.fn(plain, batch), adv * MASK)
    signed = SimpleNamespace(pipo_options=controller.PipoOptions(ppo_sign_attribution=True),
                             algorithm=SimpleNamespace(authors_ppo=True), rollout=SimpleNamespace(group_size=1))
    # the authors' PPO attribution with G = 1: each response's mean advantage over |mean| (+) 1e-6, on its tokens
    sign = jnp.array([1.0, -1.0, 1.0, 1.0])[:, None] * MASK
    chex.assert_trees_all_close(gae.fn(signed, batch), sign, atol=1e-5)
    # G = 2: grouped by prompt as theirs (`compute_layback_coefficients` over uid), not by row:
    # abar = 1, -1 | 2 / 1, 2 -> 2 * abar / (1 + 1) = 1, -1 | 2 * 2 / 4, 2 * 2 / 4 = 1, 1; another batch
    # abar = 1, -.1 | 2, .5 -> 2 / 1.1, -.2 / 1.1 | 4 / 2.5, 1 / 2.5 (by row: +-1, 1, 1)
    signed.rollout.group_size = 2
    chex.assert_trees_all_close(gae.fn(signed, batch), jnp.array([1.0, -1.0, 1.0, 1.0])[:, None] * MASK, atol=1e-5)
    skew = batch.replace(adv_br=jnp.array([[1.0, 1.0, 1.0], [-0.1, -0.1, 7.0], [2.0, 5.0, 5.0], [0.5, 0.5, 0.5]]))
    want = jnp.array([2 / 1.1, -0.2 / 1.1, 1.6, 0.4])[:, None] * MASK
    chex.assert_trees_all_close(gae.fn(signed, skew), want, rtol=1e-5)
    signed.rollout.group_size = 1
    chex.assert_trees_all_close(gae.fn(signed, skew), jnp.array([1.0, -1.0, 1.0, 1.0])[:, None] * MASK, atol=1e-5)
    # COPO: w A_local + (1 - w) A_global on each valid token
    weighted = batch.replace(global_adv_b=jnp.array([0.5, -1.0, 2.0, 0.0]),
                             local_weight_b=jnp.array([1.0, 0.0, 0.5, 0.25]))
    want = jnp.array([[1.0] * 3, [-1.0] * 3, [2.0, 0.0, 0.0], [0.5] * 3]) * MASK
    chex.assert_trees_all_close(algorithms.ATTRIBUTIONS["copo"].fn(None, weighted), want)
    # ADORA: the group attribution times the prompt's weight
    spec = SimpleNamespace(rollout=SimpleNamespace(group_size=2), pipo_options=controller.PipoOptions())
    weighted = batch.replace(adora_weight_b=jnp.array([1.0, 1.0, 0.1, 0.1]))
    chex.assert_trees_all_close(algorithms.ATTRIBUTIONS["adora"].fn(spec, weighted),
                                jnp.array([1.0, 1.0, 0.1, 0.1])[:, None] * pipo.group_attribution(adv, MASK, 2))
    sd = algorithms.ATTRIBUTIONS["sdpo_token"]
    assert sd.teacher and not algorithms.ATTRIBUTIONS["group"].teacher
    chex.assert_trees_all_close(sd.fn(None, batch), distill.token_attribution(adv, 2 * adv, MASK, batch.sd_mask_b))


def _micro_batch(spec, seed=0):
    """A random batch of the spec's shapes with teacher contexts (the prompt, left-padded wider)."""
    k = jax.random.split(jax.random.PRNGKey(seed), 8)
    b, p, r, v = spec.batch, spec.prompt_len, spec.rollout.max_new_tokens, spec.model.vocab_size
    tokens = jax.random.randint(k[0], (b, p + r), 1, v)
    mask = jnp.ones((b, p + r), jnp.int32).at[:, p + r - 2:].set(jnp.arange(b)[:, None] % 2)  # ragged responses
    mask_br = mask[:, p:].astype(jnp.float32)
    params = qwen3.init_params(spec.model, k[1])
    logp, _ = response_logprobs(spec.model, params, tokens, mask, p, temperature=spec.rollout.temperature)
    old = jnp.where(mask_br > 0, logp + 0.3 * jax.random.normal(k[2], logp.shape), 0.0)
    teacher_tokens = jnp.concatenate([jnp.zeros((b, 3), jnp.int32), tokens], axis=1)
    teacher_mask = jnp.concatenate([jnp.zeros((b, 3), jnp.int32), mask], axis=1)
    batch = TrainBatch(tokens_bl=tokens, mask_bl=mask, mask_br=mask_br, logp_old_br=old, logp_ref_br=old,
                       adv_br=jax.random.normal(k[3], (b, r)) * mask_br, teacher_tokens_bq=teacher_tokens,
                       teacher_mask_bq=teacher_mask, sd_mask_b=(jnp.arange(b) % 3 > 0).astype(jnp.float32),
                       global_adv_b=jax.random.normal(k[6], (b,)), local_weight_b=jax.random.uniform(k[7], (b,)))
    teacher = qwen3.init_params(spec.model, k[4])
    return params, teacher, batch


def _configs():
    def with_loss(module, policy, **loss):
        def make():
            c = module.get_config("micro")
            c.loss.policy = policy
            for key, value in loss.items():  # "bapo.rho": a key of the loss's own section
                section, _, leaf = key.rpartition(".")
                (c.loss[section] if section else c.loss)[leaf] = value
            return c
        return make

    return {
        "token_clip": with_loss(grpo, "token_clip"),
        "gspo": with_loss(grpo, "gspo", clip_ratio_c=0.0, clip_low=3e-4, clip_high=4e-4),
        "cispo": with_loss(grpo, "cispo", clip_ratio_c=0.0),
        "sdpo_token": with_loss(sdpo, "sdpo_token"),
        "sdpo_jsd": with_loss(sdpo, "sdpo_jsd"),
        "vpd_joint": lambda: vpd.hybrid("micro", "joint"),
        "kl_cov": with_loss(kl_cov, "kl_cov", **{"kl_cov.ratio": 0.1, "kl_cov.coef": 0.5}),
        "clip_cov": with_loss(clip_cov, "clip_cov",
                              **{"clip_cov.ratio": 0.1, "clip_cov.low": -1.0, "clip_cov.high": 1.0}),
        "drpo": _drpo_whole_batch,
        "bapo": with_loss(bapo, "bapo", **{"bapo.rho": 0.5, "bapo.upper_step": 0.1, "bapo.prob_weight": False}),
        "disco": _disco_whole_batch,
        "copo": with_loss(importlib.import_module("configs.copo"), "copo", clip_high=0.28, clip_ratio_c=2.0),
    }


def _drpo_whole_batch():
    """configs/drpo.py with the batch as one mini-batch (DRPO's loss takes whole mini-batches), tau = 1."""
    c = drpo.get_config("micro")
    c.train.mini_batch_prompts, c.loss.drpo.tau, c.loss.drpo.delta = c.rollout.prompts_per_batch, 1.0, 0.0
    return c


def _disco_whole_batch():
    """configs/disco.py with the batch as one mini-batch (whole mini-batches, as DRPO), the likelihood-ratio
    score, DisCO-b's mean over the negatives, delta = 0 (the penalty is on)."""
    c = disco.get_config("micro")
    c.train.mini_batch_prompts = c.rollout.prompts_per_batch
    c.loss.disco.score, c.loss.disco.negatives, c.loss.disco.delta = "likelihood_ratio", "mean", 0.0
    return c


@pytest.mark.parametrize("name", ["drpo", "disco"])
def test_whole_group_losses_refuse_shuffled_rows_and_split_mini_batches(name):
    """DRPO and DisCO read each prompt's G responses together and a KL penalty over the mini-batch: with
    `train.shuffle=true`, or handed a micro-batch smaller than the mini-batch, the loss names the key."""
    c = _configs()[name]()
    spec = spec_of(c)
    params, teacher, mb = _micro_batch(spec)
    counts = steps.response_counts(mb)
    half = jax.tree.map(lambda x: x[: spec.batch // 2], mb)
    with pytest.raises(ConfigError, match=rf"config\.train\.micro_batch_size_per_device: loss\.policy='{name}' "
                                          rf"needs the mini-batch of {spec.mini_batch} rows in one micro-batch"):
        spec.policy.fn(spec, params, teacher, half, counts, hyper=hyperparameters_of(spec))
    c.train.shuffle = True
    spec = spec_of(c)
    with pytest.raises(ConfigError, match=rf"config\.train\.shuffle: loss\.policy='{name}' reads each prompt's G "
                                          "responses together; set it to false"):
        spec.policy.fn(spec, params, teacher, mb, counts, hyper=hyperparameters_of(spec))


def test_every_registered_policy_loss_has_a_case():
    assert sorted(_configs()) == sorted(algorithms.POLICY_LOSSES)


@pytest.mark.parametrize("name", sorted(_configs()))
def test_registered_policy_loss_equals_its_loss_math(name):
    """`spec.policy.fn` on a micro model = the pure loss of `pipo_jax.losses` on log-probs computed
    directly, with the spec's settings; the global counts are honoured (twice the tokens, half the loss)."""
    spec = spec_of(_configs()[name]())
    assert spec.policy.name == name
    params, teacher, mb = _micro_batch(spec)
    counts = dict(steps.response_counts(mb), rng=jax.random.PRNGKey(3))  # the key `steps.accumulate_grads` adds
    hyper = hyperparameters_of(spec)
    loss, metrics, logp, _ = jax.jit(lambda p, t: spec.policy.fn(spec, p, t, mb, counts, hyper=hyper))(params, teacher)
    p, t = spec.prompt_len, spec.rollout.temperature
    want_logp, _ = response_logprobs(spec.model, params, mb.tokens_bl, mb.mask_bl, p, temperature=t)
    # the same computation (response_logprobs) jitted in a different program: float32 rounding of
    # log-softmax sums over a 40-token vocabulary (|logp| < 10), well under 1e-5
    chex.assert_trees_all_close(logp, want_logp, atol=1e-5)
    agg = dict(agg=Aggregation(spec.loss.agg_mode, counts["num_tokens"], counts["num_seqs"],
                               norm_length=spec.rollout.max_new_tokens))
    lo = spec.loss
    teacher_logp, _ = response_logprobs(spec.model, teacher, mb.teacher_tokens_bq, mb.teacher_mask_bq,
                                        mb.teacher_tokens_bq.shape[1] - spec.rollout.max_new_tokens, temperature=t)
    sd_agg = dict(agg=agg["agg"].replace(num_tokens=counts["sd"]["num_tokens"], num_seqs=counts["sd"]["num_seqs"]))
    if name == "token_clip":
        want, _ = token_clip_loss(want_logp, mb.logp_old_br, mb.adv_br, mb.mask_br, ratio_low=1 - lo.clip_low,
                                  ratio_high=1 + lo.clip_high, clip_ratio_c=lo.clip_ratio_c, **agg)
    elif name == "gspo":
        want, _ = gspo_loss(want_logp, mb.logp_old_br, mb.adv_br, mb.mask_br, ratio_low=1 - 3e-4,
                            ratio_high=1 + 4e-4, **agg)
    elif name == "cispo":
        want, _ = cispo_loss(want_logp, mb.logp_old_br, mb.adv_br, mb.mask_br, ratio_low=1 - lo.clip_low,
                             ratio_high=1 + lo.clip_high, **agg)
    elif name == "sdpo_token":
        want, _ = distill.sdpo_token_loss(want_logp, mb.logp_old_br, None, mb.mask_br, logp_teacher_br=teacher_logp,
                                          is_clip=spec.sdpo.is_clip, sd_mask_b=mb.sd_mask_b, **sd_agg)
    elif name == "vpd_joint":
        want, _ = vpd_loss.joint_hybrid_loss(want_logp, mb.logp_old_br, mb.adv_br, mb.mask_br,
                                             weight=spec.vpd.hybrid_weight, logp_teacher_br=teacher_logp,
                                             sd_mask_b=mb.sd_mask_b, is_clip=spec.sdpo.is_clip,
                                             ratio_low=1 - lo.clip_low, ratio_high=1 + lo.clip_high,
                                             clip_ratio_c=lo.clip_ratio_c, **agg)
    elif name == "kl_cov":
        want, _ = cov.kl_cov_loss(want_logp, mb.logp_old_br, mb.adv_br, mb.mask_br, ratio=0.1, coef=0.5, **agg)
    elif name == "clip_cov":
        want, m = cov.clip_cov_loss(want_logp, mb.logp_old_br, mb.adv_br, mb.mask_br, key=counts["rng"],
                                    ratio_low=1 - lo.clip_low, ratio_high=1 + lo.clip_high, ratio=0.1, cov_low=-1.0,
                                    cov_high=1.0, **agg)
        assert float(m["cov_frac"]) > 0  # tokens were left out, so the key and the settings matter
    elif name == "drpo":
        g = spec.rollout.group_size
        want, _ = drpo_loss(want_logp, mb.logp_old_br, mb.adv_br, mb.mask_br, group_size=g, num_prompts=spec.batch // g,
                            tau=1.0, lam=lo.drpo.lam, beta=lo.drpo.beta, delta=0.0)
    elif name == "bapo":
        want, m = bapo_loss(want_logp, mb.logp_old_br, mb.adv_br, mb.mask_br, rho=0.5, lower_start=lo.bapo.lower_start,
                            lower_max=lo.bapo.lower_max, lower_step=lo.bapo.lower_step,
                            upper_start=lo.bapo.upper_start, upper_max=lo.bapo.upper_max, upper_step=0.1,
                            prob_weight=False, **agg)
        chex.assert_trees_all_close((metrics["bapo_clip_low"], metrics["bapo_clip_high"]),
                                    (m["bapo_clip_low"], m["bapo_clip_high"]), rtol=1e-6)
        assert float(m["bapo_clip_high"]) > lo.bapo.upper_start  # the bounds moved: the settings are read
    elif name == "disco":
        g = spec.rollout.group_size
        want, _ = disco_loss(want_logp, mb.logp_old_br, mb.adv_br, mb.mask_br, group_size=g,
                             num_prompts=spec.batch // g, score="likelihood_ratio", negatives="mean",
                             tau=lo.disco.tau, beta=lo.disco.beta, delta=0.0)
    elif name == "copo":
        want, m = copo.copo_loss(want_logp, mb.logp_old_br, mb.adv_br, mb.global_adv_b, mb.local_weight_b, mb.mask_br,
                                 ratio_low=1 - 0.2, ratio_high=1 + 0.28, clip_ratio_c=2.0, **agg)
        chex.assert_trees_all_close(metrics["copo_local_weight"], m["copo_local_weight"], rtol=1e-6)
    else:  # sdpo_jsd: the full distributions; its top-k support is tested in tests/losses/test_distill.py
        want = None
    if want is not None:
        chex.assert_trees_all_close(loss, want, rtol=1e-4, atol=1e-6)  # the log-prob rounding above, summed
    assert bool(jnp.isfinite(loss)) and float(loss) != 0.0 and all(v.shape == () for v in metrics.values())
    if name in ("drpo", "disco"):  # over the mini-batch's prompts (static), not the token counts
        return
    key = "sd" if spec.policy.distills else None
    doubled = dict(counts, **({key: {k: 2 * v for k, v in counts[key].items()}} if key else
                              {"num_tokens": 2 * counts["num_tokens"], "num_seqs": 2 * counts["num_seqs"]}))
    hyper = hyperparameters_of(spec)
    half = jax.jit(lambda p, t: spec.policy.fn(spec, p, t, mb, doubled, hyper=hyper)[0])(params, teacher)
    chex.assert_trees_all_close(half, loss / 2, rtol=1e-5)


@pytest.mark.parametrize("key, value, match", [
    ("loss.policy", "ppo", r"config\.loss\.policy: 'ppo' is not one of \('token_clip', 'gspo', 'cispo'"),
    ("loss.policy", "sdpo_token", r"config\.loss\.policy: 'sdpo_token' does not fit algorithm='grpo' \(expected "
                                  r"one of \('token_clip', 'gspo', 'cispo'\)\)"),
    ("loss.kl_estimator", "k4", r"config\.loss\.kl_estimator: 'k4' is not one of \('k1', 'k2', 'k3'\)"),
    ("advantage.estimator", "gae", r"config\.advantage\.estimator: 'gae' does not fit algorithm='grpo'"),
    ("pipo.attribution", "gae", r"config\.pipo\.attribution: 'gae' does not fit algorithm='grpo' \(expected 'group'\)"),
    ("algorithm", "reinforce", r"config\.algorithm: 'reinforce' is not one of \('ppo', 'grpo', 'gspo', 'dapo', "
                               r"'dr_grpo', 'rloo', 'reinforce_pp', 'kl_cov', 'clip_cov', 'drpo', 'bapo', 'disco', "
                               r"'bnpo', 'copo', 'riskpo', 'gdpo', 'adora', 'sdpo', 'vpd'\)"),
])
def test_unregistered_or_unfitting_names_are_config_errors(key, value, match):
    c = grpo.get_config("micro")
    section, _, field = key.rpartition(".")
    (c[section] if section else c)[field] = value
    with pytest.raises(ConfigError, match=match):
        spec_of(c)


@pytest.mark.parametrize("compat, want_loss", [(True, 4.0), (False, 3.0)])
def test_ppo_base_loss_under_compat_is_the_authors_without_dual_clip(compat, want_loss):
    """PPO's base token clip, A = -1 and ratio 4 on every token: the authors' PPO actor loss
    (`ppo_layback`, `pipo.compat=true`) is max(-A r, -A clip(r)) = 4 with gradient -A r = 4 per
    token; ours without compat caps it with the dual clip, min(4, -A * 3) = 3, gradient 0.
    GRPO under compat keeps the dual clip (their GRPO actor is verl's)."""
    c = ppo.get_config("micro")
    c.pipo.compat = compat
    spec = spec_of(c)
    assert algorithms.base_clip_ratio_c(spec, hyperparameters_of(spec)) == (0.0 if compat else 3.0)
    params, teacher, mb = _micro_batch(spec)
    logp, _ = response_logprobs(spec.model, params, mb.tokens_bl, mb.mask_bl, spec.prompt_len,
                                temperature=spec.rollout.temperature)
    mb = mb.replace(logp_old_br=jnp.where(mb.mask_br > 0, logp - jnp.log(4.0), 0.0), adv_br=-mb.mask_br)
    counts = steps.response_counts(mb)

    def loss(p):
        return spec.policy.fn(spec, p, teacher, mb, counts, hyper=hyperparameters_of(spec))[0]

    value, grads = jax.jit(jax.value_and_grad(loss))(params)  # one program, not the model's ops one by one
    np.testing.assert_allclose(float(value), want_loss, rtol=1e-5)
    grad_norm = float(jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree.leaves(grads))))
    assert (grad_norm > 1e-3) if compat else (grad_norm == 0.0)
    g = grpo.get_config("micro")
    g.pipo.compat = True
    g_spec = spec_of(g)
    assert algorithms.base_clip_ratio_c(g_spec, hyperparameters_of(g_spec)) == 3.0


def test_dr_grpo_is_grpo_without_its_normalisations():
    """The registered `dr_grpo` with configs/dr_grpo.py's defaults: advantages r - group mean (hand
    values, one group of G = 4), and its policy loss the token clip summed over tokens over the
    constant max_new_tokens, averaged over responses (not GRPO's per-response token mean)."""
    spec = spec_of(dr_grpo.get_config("micro"))
    assert (spec.algorithm.name, spec.advantage.norm_by_std, spec.loss.agg_mode, spec.policy.name) == (
        "dr_grpo", False, "seq-mean-token-sum-norm", "token_clip")
    rewards = jnp.array([1.0, 0.0, 0.75, 0.25])
    adv, _ = spec.estimator.fn(spec, AdvantageInputs(MASK, advantages.outcome_token_rewards(rewards, MASK), rewards))
    chex.assert_trees_all_close(adv, jnp.array([0.5, -0.5, 0.25, -0.25])[:, None] * MASK)
    params, teacher, mb = _micro_batch(spec)
    counts = steps.response_counts(mb)
    assert algorithms.aggregation(spec, counts).norm_length == spec.rollout.max_new_tokens
    loss, _, logp, _ = spec.policy.fn(spec, params, teacher, mb, counts, hyper=hyperparameters_of(spec))
    clip = dict(ratio_low=1 - 0.2, ratio_high=1 + 0.2, clip_ratio_c=3.0)
    norm = Aggregation.of("seq-mean-token-sum-norm", counts, norm_length=spec.rollout.max_new_tokens)
    want, _ = token_clip_loss(logp, mb.logp_old_br, mb.adv_br, mb.mask_br, agg=norm, **clip)
    chex.assert_trees_all_close(loss, want, rtol=1e-6)
    grpo_loss, _ = token_clip_loss(logp, mb.logp_old_br, mb.adv_br, mb.mask_br,
                                   agg=Aggregation.of("seq-mean-token-mean", counts), **clip)
    assert abs(float(loss) - float(grpo_loss)) > 1e-3


def test_loss_norm_length_is_the_constant_divisor():
    """`loss.norm_length` replaces max_new_tokens as seq-mean-token-sum-norm's divisor: twice the
    length, half the policy loss."""
    c = dr_grpo.get_config("micro")
    spec = spec_of(c)
    c.loss.norm_length = 2 * spec.rollout.max_new_tokens
    longer = spec_of(c)
    assert algorithms.aggregation(longer, {"num_tokens": 1.0, "num_seqs": 1.0}).norm_length == c.loss.norm_length
    params, teacher, mb = _micro_batch(spec)
    counts = steps.response_counts(mb)
    loss = spec.policy.fn(spec, params, teacher, mb, counts, hyper=hyperparameters_of(spec))[0]
    longer_loss = longer.policy.fn(longer, params, teacher, mb, counts, hyper=hyperparameters_of(longer))[0]
    chex.assert_trees_all_close(longer_loss, loss / 2, rtol=1e-6)


def test_declared_capabilities_make_the_checks():
    c = grpo.get_config("micro")
    c.loss.policy = "cispo"  # no dual clip: the default clip_ratio_c = 3 would have no effect
    with pytest.raises(ConfigError, match=r"config\.loss\.clip_ratio_c: loss.policy='cispo' has no dual clip"):
        spec_of(c)
    c.loss.clip_ratio_c = 0.0
    assert spec_of(c).pi_ratio == "token"
    c = vpd.hybrid("micro", "joint")
    c.loss.policy, c.loss.clip_ratio_c = "gspo", 0.0  # the joint hybrid trains the token clip loss only
    with pytest.raises(ConfigError, match=r"config\.loss\.policy: 'gspo' does not fit algorithm='vpd' with "
                                          r"vpd\.hybrid='joint' \(expected one of \('token_clip',\)\)"):
        spec_of(c)
    assert spec_of(vpd.hybrid("micro", "joint")).policy.name == "vpd_joint"
    reshape = spec_of(vpd.hybrid("micro", "reshape"))
    assert reshape.advantage_shaping is algorithms.ADVANTAGE_SHAPINGS["vpd_reshape"] and reshape.uses_teacher


def test_group_estimators_are_declared_and_need_two_samples():
    assert algorithms.group_estimators() == ("grpo", "group_relative", "rloo", "reinforce_pp_baseline", "bnpo", "copo",
                                             "riskpo", "gdpo", "adora")
    assert algorithms.GROUP_ESTIMATORS == ("grpo", "group_relative")  # what GRPO's family accepts
    assert not algorithms.ADVANTAGE_ESTIMATORS["gae"].group
    c = grpo.get_config("micro")
    c.rollout.group_size = 1
    with pytest.raises(ConfigError, match=r"config\.rollout\.group_size: G=1 with a group method "
                                          r"\(advantage\.estimator='grpo'"):
        spec_of(c)


def test_registration_rejects_duplicates_and_unknown_pieces():
    with pytest.raises(ValueError, match="'token_clip' is registered twice"):
        algorithms.policy_loss("token_clip")(lambda *a: None)
    with pytest.raises(ValueError, match="unknown policy loss 'nope'"):
        algorithms.register_algorithm(algorithms.Algorithm("x", ("grpo",), (("nope", "nope"),), "group"))
    with pytest.raises(ValueError, match="pi_ratio 'row'"):
        algorithms.policy_loss("x", pi_ratio="row")
    assert "x" not in algorithms.ALGORITHMS and "x" not in algorithms.POLICY_LOSSES


NAMES = set(algorithms.ALGORITHMS) | {k.split("+")[0] for k in algorithms.ALGORITHMS} | set(
    algorithms.POLICY_LOSSES) | set(algorithms.ADVANTAGE_ESTIMATORS) | set(algorithms.ATTRIBUTIONS)


@pytest.mark.parametrize("module", ["rl/learn.py", "rl/steps.py", "rl/loop.py", "rl/rollout.py", "rl/vpd_estep.py",
                                    "run/sharded_steps.py", "run/trainer.py", "run/placement.py"])
def test_the_learner_never_branches_on_a_registered_name(module):
    """No string literal naming an algorithm, policy loss, estimator or attribution in the learner's
    code (docstrings aside): it calls the registered objects and reads declared capabilities."""
    tree = ast.parse((REPO / "pipo_jax" / module).read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = [(n.lineno, n.value) for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in NAMES
             and id(n) not in docstrings]
    assert not found, f"{module}: {found}"
    assert importlib.import_module(f"pipo_jax.{module[:-3].replace('/', '.')}")
