"""COPO (docs/math.md §1 "COPO", `losses/copo.py`): the outcome entropy, the global reward and advantage,
the entropy weight under each gate and the blended loss computed by hand (a clipped token where the blend
of the two clipped losses differs from the clip of the blended advantage), and a numpy transcription of
the authors' released code (their per-prompt loops: a Counter over each group's answers, the mean reward
times the optional consistency coefficient, the batch standardisation, sigmoid(k (H - b)) gated, two
dual-clipped token losses mixed per token) on random batches."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.losses import copo
from pipo_jax.losses.aggregation import Aggregation
from tests.rl.test_config import check_config_run

G = 4
# two prompts, R = 3: prompt 0's answers 56, 56, 57, 9 (rewards 1, 1, 0, 0); prompt 1's four 1 1 1 (reward 0)
TOKENS = jnp.array([[5, 6, 0], [5, 6, 0], [5, 7, 0], [9, 0, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]])
MASK = jnp.array([[1, 1, 0], [1, 1, 0], [1, 1, 0], [1, 0, 0]] + [[1, 1, 1]] * 4, jnp.float32)
REWARDS = jnp.array([1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
LOCAL = jnp.array([1.0, 1.0, -1.0, -1.0, 0.0, 0.0, 0.0, 0.0])  # GRPO's: +-1 in the mixed group, 0 in the flat one


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def test_outcome_entropy_by_hand():
    """Prompt 0 has outcomes {56: 2, 57: 1, 9: 1} (1.5 bits) as responses, {1: 2, 0: 2} (1 bit) as rewards;
    prompt 1 has one outcome either way (0 bits); trailing padding never separates two answers."""
    h = copo.outcome_entropy(copo.same_outcome(TOKENS, MASK, REWARDS, G, "response"))
    np.testing.assert_allclose(np.asarray(h), [1.5, 0.0], atol=1e-6)
    h = copo.outcome_entropy(copo.same_outcome(TOKENS, MASK, REWARDS, G, "reward"))
    np.testing.assert_allclose(np.asarray(h), [1.0, 0.0], atol=1e-6)
    ragged = TOKENS.at[1, 2].set(4)  # a token past the end of response 1: masked, still the answer 56
    h = copo.outcome_entropy(copo.same_outcome(ragged, MASK, REWARDS, G, "response"))
    np.testing.assert_allclose(np.asarray(h), [1.5, 0.0], atol=1e-6)
    with pytest.raises(ValueError, match="COPO outcome 'answer' is not one of"):
        copo.same_outcome(TOKENS, MASK, REWARDS, G, "answer")


def test_global_advantage_and_weights_by_hand():
    """R = (0.5, 0): centred +-0.25 over the two prompts, torch.std sqrt(2 x 0.0625) = 0.3536, so A^g = +-0.7071
    on every row of each prompt (the flat prompt 1 gets -0.7071: it still has a signal). The weight of the
    local loss sigmoid(5 (1.5 - 1)) = 0.9241 on prompt 0; prompt 1 (H = 0) sigmoid(-5) = 0.0067. Gates:
    soft_with_zero keeps it on the two rewarded rows only; soft_with_forced on the rows with A^l != 0
    (prompt 0's); soft everywhere. With the consistency reward R_0 = 0.5 (1 - 0.375 x 1.5) = 0.21875 and
    lambda_4 = (1 - 1/4) / log2 4 = 0.375; prompt 1's R stays 0."""
    want_global = np.repeat([1.0, -1.0], G) * 0.25 / (np.sqrt(2 * 0.0625) + 1e-6)
    w0, w1 = _sigmoid(2.5), _sigmoid(-5.0)
    cases = {"soft_with_zero": [w0, w0, 0, 0, 0, 0, 0, 0], "soft_with_forced": [w0] * 4 + [0] * 4,
             "soft": [w0] * 4 + [w1] * 4}
    for blend, want_w in cases.items():
        glob, w, h = copo.copo_advantages(REWARDS, LOCAL, TOKENS, MASK, group_size=G, blend=blend)
        np.testing.assert_allclose(np.asarray(glob), want_global, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(w), want_w, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(h), [1.5, 0.0], atol=1e-6)
    r = copo.global_rewards(REWARDS, jnp.array([1.5, 0.0]), G, consistency_reward=True)
    np.testing.assert_allclose(np.asarray(r), [0.21875, 0.0], rtol=1e-6)
    # the population std and no standardisation: +-0.25 / 0.25 = +-1, then +-0.25
    np.testing.assert_allclose(np.asarray(copo.global_advantages(jnp.array([0.5, 0.0]), std_ddof=0)),
                               [1.0 / (1 + 4e-6), -1.0 / (1 + 4e-6)], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(copo.global_advantages(jnp.array([0.5, 0.0]), norm_by_std=False)),
                               [0.25, -0.25])
    assert np.all(np.asarray(copo.global_advantages(jnp.array([0.5, 0.5, 0.5]))) == 0.0)
    with pytest.raises(ValueError, match="COPO blend 'hard' is not one of"):
        copo.local_weights(jnp.zeros(2), REWARDS, LOCAL, G, gamma=5.0, rho=1.0, blend="hard")


def test_copo_loss_blends_two_clipped_losses_by_hand():
    """One row of two tokens, A^l = 1, A^g = -2, w = 0.25, eps 0.2, dual clip 3. Token 0 at ratio 1: both losses
    -A, so 0.25 x -1 + 0.75 x 2 = 1.25. Token 1 at ratio 2: the local loss is clipped at 1.2 (-1.2, no
    gradient), the global one -A^g r = 4 (under the dual clip's 6): 0.25 x -1.2 + 0.75 x 4 = 2.7. Token mean
    (1.25 + 2.7) / 2 = 1.975; the gradient on token 1's logp is 0.75 x 2 x 2 / 2 = 1.5 (only the global
    loss's), where the clip of the blended advantage (0.25 - 1.5 = -1.25) would give 1.25 x 2 / 2 = 1.25."""
    old = jnp.array([[-1.0, -1.0]])
    logp = old + jnp.log(jnp.array([[1.0, 2.0]]))
    mask = jnp.ones((1, 2))
    args = dict(adv_br=jnp.ones((1, 2)), global_adv_b=jnp.array([-2.0]), weight_b=jnp.array([0.25]), mask_br=mask,
                agg=Aggregation("token-mean"))
    loss, m = copo.copo_loss(logp, old, **args)
    np.testing.assert_allclose(float(loss), 1.975, rtol=1e-6)
    np.testing.assert_allclose([float(m["pg_clipfrac"]), float(m["copo_global_clipfrac"]),
                                float(m["copo_local_weight"])], [0.5, 0.0, 0.25], rtol=1e-6)
    grad = np.asarray(jax.grad(lambda lp: copo.copo_loss(lp, old, **args)[0])(logp))
    np.testing.assert_allclose(grad, [[0.25 * -1 / 2 + 0.75 * 2 / 2, 1.5]], rtol=1e-5)
    blended = copo.blended_advantages(args["adv_br"], args["global_adv_b"], args["weight_b"], mask)
    np.testing.assert_allclose(np.asarray(blended), [[-1.25, -1.25]], rtol=1e-6)


def _entropy_bits(answers):
    counts = collections.Counter(answers)
    probs = np.array([c / len(answers) for c in counts.values()])
    return float(-(probs * np.log2(probs)).sum())


def _clip_loss(adv, ratio, eps, c):
    loss = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - eps, 1 + eps))
    return np.where(adv < 0, np.minimum(loss, -adv * c), loss)


def copo_reference(rewards, answers, logp, old, mask, g, k, b, gate, coef):
    """The authors' released code in numpy (float64): their loops over prompt ids; then their loss."""
    rewards, logp, old, mask = (np.asarray(x, np.float64) for x in (rewards, logp, old, mask))
    n = len(rewards) // g
    local, global_r, entropy = np.zeros(len(rewards)), np.zeros(n), np.zeros(n)
    for q in range(n):
        r = rewards[q * g:(q + 1) * g]
        entropy[q] = _entropy_bits(answers[q * g:(q + 1) * g])
        lam = (1 - 1 / g) / np.log2(g)
        global_r[q] = r.mean() * ((1 - lam * entropy[q]) if coef else 1.0)
        local[q * g:(q + 1) * g] = 0.0 if r.max() == r.min() else (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    glob = np.repeat(0.0 if global_r.max() == global_r.min() else
                     (global_r - global_r.mean()) / (global_r.std(ddof=1) + 1e-6), g)
    w = np.repeat(_sigmoid(k * (entropy - b)), g)
    w = {"soft_with_zero": w * (rewards != 0), "soft_with_forced": w * (local != 0), "soft": w}[gate]
    ratio = np.exp(logp - old)
    per_token = (w[:, None] * _clip_loss(local[:, None] * mask, ratio, 0.2, 3.0)
                 + (1 - w[:, None]) * _clip_loss(glob[:, None] * np.ones_like(mask), ratio, 0.2, 3.0))
    seq = (per_token * mask).sum(1) / mask.sum(1)  # seq-mean-token-mean
    return seq.mean(), local, glob, w


@pytest.mark.parametrize("gate", copo.BLENDS)
@pytest.mark.parametrize("coef", [False, True])
def test_copo_matches_a_transcription_of_the_authors_code(gate, coef):
    """Random batches of 5 prompts x 4 responses whose answers (one or two tokens) and 0 / 1 rewards repeat,
    so groups are flat, mixed, consistent and diverse; ratios around 1 so both clips engage."""
    rng = np.random.RandomState(7 + coef)
    for _ in range(3):
        b, r = 20, 3
        first, second = rng.randint(1, 4, b), rng.randint(1, 3, b)
        lengths = rng.randint(1, 3, b)
        tokens = np.stack([first, np.where(lengths > 1, second, 0), np.zeros(b, int)], 1)
        mask = np.stack([np.ones(b), (lengths > 1).astype(float), np.zeros(b)], 1)
        rewards = (first == 1).astype(np.float64)
        answers = [tuple(tokens[i, :lengths[i]]) for i in range(b)]
        old = rng.uniform(-2, -0.5, (b, r))
        logp = old + rng.normal(0, 0.3, (b, r))
        want, local, glob, w = copo_reference(rewards, answers, logp, old, mask, G, 5.0, 1.0, gate, coef)
        got_local = jnp.asarray(local, jnp.float32)
        got_glob, got_w, _ = copo.copo_advantages(jnp.asarray(rewards, jnp.float32), got_local, jnp.asarray(tokens),
                                                  jnp.asarray(mask, jnp.float32), group_size=G, blend=gate,
                                                  consistency_reward=coef)
        np.testing.assert_allclose(np.asarray(got_glob), glob, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(got_w), w, rtol=1e-5, atol=1e-7)
        m = jnp.asarray(mask, jnp.float32)
        loss, _ = copo.copo_loss(jnp.asarray(logp, jnp.float32), jnp.asarray(old, jnp.float32), got_local[:, None] * m,
                                 got_glob, got_w, m, agg=Aggregation("seq-mean-token-mean"))
        np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)
        assert np.any(glob != 0) and np.any((w > 0) & (w < 1))


def test_check_config_prints_the_copo_keys():
    """`--check_config` of configs/copo.py: the keys COPO reads, each with its value and description."""
    values, lines = check_config_run("--config=configs/copo.py:micro")
    assert {k: values[k] for k in ("algorithm", "advantage.estimator", "loss.policy", "pipo.attribution",
                                   "advantage.copo.gamma", "advantage.copo.rho", "advantage.copo.blend",
                                   "advantage.copo.outcome", "advantage.copo.consistency_reward")} == {
        "algorithm": "copo", "advantage.estimator": "copo", "loss.policy": "copo", "pipo.attribution": "copo",
        "advantage.copo.gamma": 5.0, "advantage.copo.rho": 1.0, "advantage.copo.blend": "soft_with_zero",
        "advantage.copo.outcome": "response", "advantage.copo.consistency_reward": False}
    assert lines["advantage.copo.blend"].endswith("[soft_with_zero | soft_with_forced | soft]")
