"""BNPO (`pipo_jax/losses/bnpo.py`, docs/math.md §1 "BNPO"): the success rates, the pool carried across
iterations, the method-of-moments Beta parameters and the normalised advantages, by hand, against the
special cases the paper names (REINFORCE with baseline, GRPO), against a numpy transcription of the
equations over several steps (the pool written out rate by rate, not recursively) and of the authors'
released code at decay 0; the registered estimator; `--check_config` listing its keys."""

import math
from types import SimpleNamespace

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import bnpo as bnpo_config
from pipo_jax.losses import advantages, bnpo
from pipo_jax.rl import algorithms
from pipo_jax.rl.algorithms import AdvantageInputs
from tests.rl.test_config import check_config_run
from tests.typed import spec_of


def _pool(*batches, decay):
    state = bnpo.init_bnpo_state()
    for rates in batches:
        state = bnpo.update_bnpo_state(state, jnp.asarray(rates, jnp.float32), decay=decay)
    return state


def _floats(tree):
    return {k: float(v) for k, v in tree.items()}


# ----------------------------------------------------------------------------- by hand


def test_success_rates_and_one_batch_parameters_by_hand():
    """Rates .25, .5, .75, 0 (G = 4): mean 3/8, unbiased variance (2 x 1/64 + 2 x 9/64) / 3 = 5/48;
    k = (3/8)(5/8) / (5/48) - 1 = 5/4, a = 15/32, b = 25/32, alpha = 1 + 5/32, beta = 1 + 25/96."""
    r = jnp.array([1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0], jnp.float32)
    rates = bnpo.success_rates(r, 4)
    chex.assert_trees_all_close(rates, jnp.array([0.25, 0.5, 0.75, 0.0]))
    state = _pool(rates, decay=0.0)
    chex.assert_trees_all_close((state.weight, state.weight_sq, state.rate_sum, state.rate_sq_sum),
                                (4.0, 4.0, 1.5, 0.875))
    got = _floats(bnpo.beta_parameters(state))
    want = {"rate_mean": 3 / 8, "rate_var": 5 / 48, "a": 15 / 32, "b": 25 / 32, "alpha": 1 + 5 / 32,
            "beta": 1 + 25 / 96}
    assert got == pytest.approx(want, rel=1e-6)


def test_the_pool_over_two_batches_by_hand():
    """decay 1/2: rates .25, .75 then .5, .5. W1 = 1/2 x 2 + 2 = 3, W2 = 1/4 x 2 + 2 = 5/2, S1 = 1/2 + 1,
    S2 = 1/2 x 5/8 + 1/2; mean 1/2; variance (1/16) / (3 - 5/6) = 3/104; k = (1/4) / (3/104) - 1 = 23/3,
    a = b = 23/6, alpha = beta = 1 + 23/18. The same batch at decay 0: the second batch alone, no spread."""
    state = _pool([0.25, 0.75], [0.5, 0.5], decay=0.5)
    chex.assert_trees_all_close((state.weight, state.weight_sq, state.rate_sum, state.rate_sq_sum),
                                (3.0, 2.5, 1.5, 0.8125))
    got = _floats(bnpo.beta_parameters(state))
    assert got == pytest.approx({"rate_mean": 0.5, "rate_var": 3 / 104, "a": 23 / 6, "b": 23 / 6,
                                 "alpha": 1 + 23 / 18, "beta": 1 + 23 / 18}, rel=1e-5)
    alone = _floats(bnpo.beta_parameters(_pool([0.25, 0.75], [0.5, 0.5], decay=0.0)))
    assert (alone["rate_var"], alone["alpha"], alone["beta"]) == (0.0, bnpo.MAX_SHAPE, bnpo.MAX_SHAPE)


def test_advantages_by_hand_for_a_known_density():
    """alpha = beta = 2: f_N(p) = 6 p (1 - p). Groups 1000 (p = 1/4, f = 9/8), 1100 (p = 1/2, f = 3/2),
    1111 and .5 .5 .5 .5 (all equal: 0)."""
    r = jnp.array([1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5], jnp.float32)
    adv = bnpo.bnpo_advantages(r, 4, 2.0, 2.0)
    want = [2 / 3, -2 / 9, -2 / 9, -2 / 9, 1 / 3, 1 / 3, -1 / 3, -1 / 3] + [0.0] * 8
    chex.assert_trees_all_close(adv, jnp.array(want), rtol=1e-5, atol=1e-7)


def test_uniform_is_reinforce_with_baseline_and_three_halves_is_grpo():
    """The paper's special cases on binary rewards: alpha = beta = 1 (the uniform density) gives r - p, the
    prompt-baseline REINFORCE (Dr. GRPO's r - mean); alpha = beta = 3/2, f_N = sqrt(p (1 - p)) / B(3/2, 3/2)
    with B(3/2, 3/2) = pi / 8, gives pi / 8 times GRPO's (r - mean) / population std."""
    r = jnp.array([1, 0, 0, 0, 1, 1, 0, 1, 0, 1, 0, 0, 1, 1, 1, 1], jnp.float32)
    baseline = advantages.group_relative_advantages(r, 4, norm_by_std=False)
    chex.assert_trees_all_close(bnpo.bnpo_advantages(r, 4, 1.0, 1.0), baseline, atol=1e-7)
    grpo = advantages.group_relative_advantages(r, 4, std_ddof=0, eps=0.0)
    chex.assert_trees_all_close(bnpo.bnpo_advantages(r, 4, 1.5, 1.5), math.pi / 8 * grpo, rtol=1e-5)
    assert float(jnp.max(jnp.abs(grpo))) > 1.0


def test_reward_range_and_the_weight_clip():
    """Rewards in [-1, 1] (reward_min = -1): -1 1 -1 1 is p = 1/2; with alpha = 3, beta = 1 (f = 3 p^2):
    A = +-(1/2) / (3/4). Taken as rewards in [0, 1] the same rows have p = 0, where the density is 0:
    1 / f_N is clipped at MAX_WEIGHT."""
    r = jnp.array([-1, 1, -1, 1], jnp.float32)
    chex.assert_trees_all_close(bnpo.bnpo_advantages(r, 4, 3.0, 1.0, reward_min=-1.0),
                                jnp.array([-1, 1, -1, 1]) * 2 / 3, rtol=1e-5)
    chex.assert_trees_all_close(bnpo.bnpo_advantages(r, 4, 3.0, 1.0), r * bnpo.MAX_WEIGHT, rtol=1e-6)
    assert float(bnpo.normaliser_weight(1.0, 1.0, 3.0)) == bnpo.MAX_WEIGHT  # Beta(1, 3) is 0 at p = 1


def test_too_few_rates_give_the_uniform_density_and_equal_rates_stay_finite():
    """One prompt and nothing before (the authors' code gives one prompt alpha = beta = 1 too): A = r - p,
    the variance undefined (NaN metrics). A pool of equal rates (variance 0): alpha, beta capped at
    MAX_SHAPE and the advantages small, finite and of the density there."""
    params = _floats(bnpo.beta_parameters(_pool([0.5], decay=0.0)))
    assert (params["alpha"], params["beta"], params["rate_mean"]) == (1.0, 1.0, 0.5)
    assert math.isnan(params["rate_var"]) and math.isnan(params["a"])
    assert _floats(bnpo.beta_parameters(bnpo.init_bnpo_state()))["alpha"] == 1.0
    r = jnp.array([1, 1, 0, 0], jnp.float32)
    chex.assert_trees_all_close(bnpo.bnpo_advantages(r, 4, params["alpha"], params["beta"]),
                                jnp.array([0.5, 0.5, -0.5, -0.5]))
    capped = bnpo.beta_parameters(_pool([0.5, 0.5, 0.5], decay=0.0))
    adv = bnpo.bnpo_advantages(r, 4, capped["alpha"], capped["beta"])
    want = 0.5 / _np_density(0.5, bnpo.MAX_SHAPE, bnpo.MAX_SHAPE)  # about 0.5 / 112.8
    chex.assert_trees_all_close(adv, jnp.array([1, 1, -1, -1]) * want, rtol=1e-2)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match=r"decay=1\.0 must be in \[0, 1\)"):
        bnpo.update_bnpo_state(bnpo.init_bnpo_state(), jnp.zeros(2), decay=1.0)
    with pytest.raises(ValueError, match="BNPO needs G >= 2"):
        bnpo.success_rates(jnp.zeros(4), 1)
    with pytest.raises(ValueError, match=r"reward_max=0\.0 must be > reward_min=0\.0"):
        bnpo.bnpo_advantages(jnp.zeros(4), 2, 1.0, 1.0, reward_max=0.0)


# ----------------------------------------------------------------------------- numpy transcriptions


def _np_density(p, alpha, beta):
    """The Beta(alpha, beta) density at p, from math.lgamma (0 where a zero power meets p = 0 or 1)."""
    if (p == 0 and alpha > 1) or (p == 1 and beta > 1):
        return 0.0
    log_b = math.lgamma(alpha) + math.lgamma(beta) - math.lgamma(alpha + beta)
    return math.exp((alpha - 1) * (math.log(p) if alpha != 1 else 0.0)
                    + (beta - 1) * (math.log1p(-p) if beta != 1 else 0.0) - log_b)


def _np_parameters(pool):
    """alpha, beta from a pool written out as (weight, rate) pairs: the weighted mean, the weighted variance
    with the reliability-weights correction sum w / (sum w - sum w^2 / sum w), then the paper's formulas."""
    w = np.array([x for x, _ in pool], np.float64)
    p = np.array([y for _, y in pool], np.float64)
    w1, w2 = w.sum(), (w * w).sum()
    if w1 - w2 / w1 <= 0:
        return 1.0, 1.0
    mean = (w * p).sum() / w1
    var = (w * (p - mean) ** 2).sum() / (w1 - w2 / w1)
    k = mean * (1 - mean) / max(var, bnpo.VAR_FLOOR) - 1
    clip = lambda x: min(max(x, 1.0), bnpo.MAX_SHAPE)  # noqa: E731
    return clip(1 + k * mean / 3), clip(1 + k * (1 - mean) / 3)


def _np_advantages(rewards, g, alpha, beta, lo=0.0, hi=1.0):
    out = []
    for group in np.asarray(rewards, np.float64).reshape(-1, g):
        s = (group - lo) / (hi - lo)
        p = s.mean()
        if np.all(group == group[0]):
            out += [0.0] * g
            continue
        f = _np_density(min(max(p, 0.0), 1.0), alpha, beta)
        weight = bnpo.MAX_WEIGHT if f == 0 else min(1 / f, bnpo.MAX_WEIGHT)
        out += list(weight * (s - p))
    return np.array(out)


@pytest.mark.parametrize("decay", [0.0, 0.3, 0.8])
def test_several_steps_against_the_numpy_transcription(decay):
    """Five batches of 6 prompts x G = 4 (binary rewards, then graded ones on [-1, 1] with the reward range
    set): after each, the recursive pool's alpha, beta and advantages equal those of the pool written out
    (every rate seen so far with weight decay^age)."""
    rng = np.random.default_rng(7)
    for lo, hi, draw in ((0.0, 1.0, lambda: rng.integers(0, 2, 24)), (-1.0, 1.0, lambda: rng.uniform(-1, 1, 24))):
        state, seen = bnpo.init_bnpo_state(), []
        for _ in range(5):
            rewards = np.round(draw().astype(np.float32), 2)
            rates = bnpo.success_rates(rewards, 4, reward_min=lo, reward_max=hi)
            state = bnpo.update_bnpo_state(state, rates, decay=decay)
            seen = [(w * decay, p) for w, p in seen] + [(1.0, p) for p in ((rewards.reshape(-1, 4) - lo) / (hi - lo))
                                                         .mean(axis=1)]
            got = bnpo.beta_parameters(state)
            alpha, beta = _np_parameters(seen)
            np.testing.assert_allclose([float(got["alpha"]), float(got["beta"])], [alpha, beta], rtol=1e-4)
            adv = bnpo.bnpo_advantages(rewards, 4, got["alpha"], got["beta"], reward_min=lo, reward_max=hi)
            np.testing.assert_allclose(np.asarray(adv), _np_advantages(rewards, 4, alpha, beta, lo, hi), rtol=1e-4,
                                       atol=1e-6)
            assert np.any(np.abs(np.asarray(adv)) > 0.05)


def _authors_advantages(scores, g, min_value=0.0, max_value=1.0):
    """The authors' released `compute_bnpo_outcome_advantage` transcribed to numpy: the batch's group means,
    their mean and unbiased variance (0 and 1 for a single prompt), alpha = max(1 + a / 3, 1), beta likewise,
    then clamp(1 / Beta pdf, 0, 1e6) x (score - p)."""
    scores = (np.asarray(scores, np.float64) - min_value) / (max_value - min_value)
    groups = scores.reshape(-1, g)
    all_p = groups.mean(axis=1)
    p_mean = all_p.mean() if len(all_p) > 1 else 0.0
    p_var = all_p.var(ddof=1) if len(all_p) > 1 else 1.0
    a = (p_mean * (1 - p_mean) / p_var - 1) * p_mean
    b = (p_mean * (1 - p_mean) / p_var - 1) * (1 - p_mean)
    alpha, beta = max(1 + a / 3, 1.0), max(1 + b / 3, 1.0)
    out = []
    for group, p in zip(groups, all_p):
        density = _np_density(p, alpha, beta)
        weight = 1e6 if density == 0 else min(1 / density, 1e6)
        out += list(weight * (group - p))
    return np.array(out), alpha, beta


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decay_zero_is_the_authors_code(seed):
    """`decay = 0` on any batch (fresh or not) is the authors' released estimator on that batch alone."""
    rng = np.random.default_rng(seed)
    state = _pool(rng.uniform(0, 1, 5), decay=0.0)  # an earlier batch: forgotten at decay 0
    rewards = rng.integers(0, 2, 32).astype(np.float32)
    state = bnpo.update_bnpo_state(state, bnpo.success_rates(rewards, 4), decay=0.0)
    got = bnpo.beta_parameters(state)
    want, alpha, beta = _authors_advantages(rewards, 4)
    np.testing.assert_allclose([float(got["alpha"]), float(got["beta"])], [alpha, beta], rtol=1e-5)
    adv = bnpo.bnpo_advantages(rewards, 4, got["alpha"], got["beta"])
    np.testing.assert_allclose(np.asarray(adv), want, rtol=1e-4, atol=1e-6)
    assert np.any(np.abs(want) > 0.1)


def test_jit_and_vmap_match_eager():
    rng = np.random.default_rng(3)
    rewards = jnp.asarray(rng.integers(0, 2, (2, 16)), jnp.float32)
    fn = lambda r: bnpo.bnpo_advantages(r, 4, 1.7, 2.4)  # noqa: E731
    chex.assert_trees_all_close(jax.vmap(fn)(rewards), jnp.stack([fn(r) for r in rewards]), rtol=1e-6)


# ----------------------------------------------------------------------------- the registered estimator


def test_registered_estimator_folds_each_batch_into_the_pool():
    """`advantage.estimator=bnpo` through `algorithms.estimate`: the state after each batch is the pure
    update's, the advantages read it (this batch included), the metrics are its Beta parameters, and the
    spec's reward range and decay are the ones read."""
    spec = SimpleNamespace(estimator=algorithms.ADVANTAGE_ESTIMATORS["bnpo"], rollout=SimpleNamespace(group_size=2),
                           advantage=SimpleNamespace(bnpo=SimpleNamespace(decay=0.5, reward_min=-1.0, reward_max=1.0)))
    est = spec.estimator
    assert est.group and not est.critic and est.carried is not None
    mask = jnp.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]], jnp.float32)
    state = est.carried.init(spec)
    chex.assert_trees_all_close(state, bnpo.init_bnpo_state())
    for rewards in ([1.0, -1.0, 0.0, 1.0], [1.0, 1.0, -1.0, 0.5]):
        r = jnp.asarray(rewards)
        x = AdvantageInputs(mask, advantages.outcome_token_rewards(r, mask), r)
        before = state
        adv, returns, state, metrics, fields = algorithms.estimate(spec, x, state)
        rates = bnpo.success_rates(r, 2, reward_min=-1.0, reward_max=1.0)
        want_state = bnpo.update_bnpo_state(before, rates, decay=0.5)
        chex.assert_trees_all_close(state, want_state)
        params = bnpo.beta_parameters(want_state)
        want = bnpo.bnpo_advantages(r, 2, params["alpha"], params["beta"], reward_min=-1.0, reward_max=1.0)
        chex.assert_trees_all_close(adv, want[:, None] * mask)
        assert returns is None and metrics["bnpo_alpha"] == params["alpha"] and "bnpo_rate_var" in metrics
        assert fields == {}  # no further batch fields (COPO's estimator has some)
    assert float(state.weight) == 2 * 0.5 + 2  # two batches of two prompts


def test_config_file_and_its_keys():
    """configs/bnpo.py: the estimator and algorithm, the authors' script's loss; its keys' checks name them;
    `--check_config` lists them with their values."""
    spec = spec_of(bnpo_config.get_config("micro"))
    assert (spec.algorithm.name, spec.estimator.name, spec.policy.name, spec.attribution.name) == (
        "bnpo", "bnpo", "token_clip", "group")
    assert (spec.advantage.bnpo.decay, spec.loss.clip_low, spec.loss.clip_high, spec.loss.clip_ratio_c,
            spec.loss.agg_mode, spec.loss.kl_coef) == (0.9, 0.2, 0.28, 10.0, "seq-mean-token-sum", 0.0)
    values, lines = check_config_run("--config=configs/bnpo.py:micro", "--config.advantage.bnpo.decay=0.5")
    assert {k: values[k] for k in ("algorithm", "advantage.estimator", "advantage.bnpo.decay",
                                   "advantage.bnpo.reward_min", "advantage.bnpo.reward_max", "pipo.attribution")} == {
        "algorithm": "bnpo", "advantage.estimator": "bnpo", "advantage.bnpo.decay": 0.5,
        "advantage.bnpo.reward_min": 0.0, "advantage.bnpo.reward_max": 1.0, "pipo.attribution": "group"}
    assert "(0: the current batch only, the authors' code)" in lines["advantage.bnpo.decay"]
