"""DisCO (docs/math.md §1 "DisCO", `losses/disco.py`): a group computed by hand (both scores, DisCO's
log-sum-exp and DisCO-b's mean over the negatives, the gradient), and a numpy transcription of the
objective as the paper states it with the authors' penalty (groups with both positive and negative
responses; the positives' mean score minus tau x log-mean-exp of the negatives' scores / tau, or minus
their mean; the KL penalty sg(max(beta (kl - delta), 0)) kl; the group sum over the number of prompts)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.losses.disco import disco_loss


def disco_reference(logp, old, rewards, mask, g, score, negatives, tau, beta, delta):
    logp, old, mask = (np.asarray(x, np.float64) for x in (logp, old, mask))
    b = logp.shape[0]
    per_token = logp if score == "log_likelihood" else np.exp(logp - old)
    s = (per_token * mask).sum(1) / mask.sum(1)
    total = 0.0
    for q in range(b // g):
        rows = range(q * g, (q + 1) * g)
        pos = [i for i in rows if rewards[i] == 1]
        neg = [j for j in rows if rewards[j] == 0]
        if not pos or not neg:
            continue
        if negatives == "log_sum_exp":
            neg_term = tau * np.log(np.mean([np.exp(s[j] / tau) for j in neg]))
        else:
            neg_term = np.mean([s[j] for j in neg])
        total += np.mean([s[i] for i in pos]) - neg_term
    kl = ((old - logp) * mask).sum() / mask.sum()
    return -total / (b // g) + max(beta * (kl - delta), 0.0) * kl


def _adv(rewards, g, mask):  # GRPO's sign: r - group mean, on every valid token
    r = np.asarray(rewards, np.float64).reshape(-1, g)
    return jnp.asarray((r - r.mean(1, keepdims=True)).reshape(-1), jnp.float32)[:, None] * mask


def _hand_group():
    """One group of 4 (R = 4): positive rows 0 (2 tokens of -1) and 1 (4 of -0.5), negative rows 2 (3 of -2)
    and 3 (one of -3): log-likelihood scores -1, -0.5, -2, -3."""
    logp = jnp.array([[-1.0, -1.0, 0, 0], [-0.5, -0.5, -0.5, -0.5], [-2.0, -2.0, -2.0, 0], [-3.0, 0, 0, 0]])
    mask = jnp.array([[1.0, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]])
    return logp, mask, _adv([1, 1, 0, 0], 4, mask)


@pytest.mark.parametrize("negatives, want", [
    ("log_sum_exp", -0.75 - (-2.0 + np.log((1 + np.exp(-1.0)) / 2))),  # tau = 1: log mean(e^-2, e^-3)
    ("mean", -0.75 - (-2.5)),
])
def test_disco_log_likelihood_by_hand(negatives, want):
    """J = mean(-1, -0.5) - the negatives' term; logp = logp_old, so kl = 0 and no penalty; two prompts in
    the mini-batch (the second not in the batch here), so the objective is J / 2."""
    logp, mask, adv = _hand_group()
    loss, m = disco_loss(logp, logp, adv, mask, group_size=4, num_prompts=2, negatives=negatives, tau=1.0,
                         beta=10.0, delta=0.0)
    np.testing.assert_allclose(float(loss), -want / 2, rtol=1e-6)
    assert float(m["disco_constraint"]) == 0.0 and float(m["disco_valid_groups_frac"]) == 0.5
    # the gradient: d(-J/2)/d logp on a positive row's token = -1/2 (mean of 2) / |o_i| / 2; on a negative
    # row's token = w_j / |o_j| / 2 with w_j the softmax of the negatives' s / tau (log_sum_exp) or 1/2 (mean)
    grad = np.asarray(jax.grad(lambda lp: disco_loss(lp, logp, adv, mask, group_size=4, num_prompts=2,
                                                     negatives=negatives, tau=1.0, beta=10.0, delta=0.0)[0])(logp))
    w = np.exp([-2.0, -3.0]) / np.exp([-2.0, -3.0]).sum() if negatives == "log_sum_exp" else np.array([0.5, 0.5])
    want_grad = np.array([[-1 / 8, -1 / 8, 0, 0], [-1 / 16] * 4, [w[0] / 6] * 3 + [0], [w[1] / 2, 0, 0, 0]])
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-8)


def test_disco_likelihood_ratio_by_hand():
    """Scores = token means of the ratios: row 0 ratios 2 and 1 (1.5), row 1 ratio 0.5 (0.5), row 2 ratios 1
    and 3 (2), row 3 ratio 1 (1); rows 0, 1 positive. tau = 2: J = 1 - 2 log((e^1 + e^0.5) / 2); with
    DisCO-b J = 1 - 1.5. kl = mean of -log r over the 6 tokens = -(log 2 + log 0.5 + log 3) / 6."""
    old = jnp.full((4, 2), -1.0)
    ratios = jnp.array([[2.0, 1.0], [0.5, 1.0], [1.0, 3.0], [1.0, 1.0]])
    mask = jnp.array([[1.0, 1], [1, 0], [1, 1], [1, 0]])
    logp = old + jnp.log(ratios)
    adv = _adv([1, 1, 0, 0], 4, mask)
    kl = -(np.log(2.0) + np.log(0.5) + np.log(3.0)) / 6
    for negatives, j in (("log_sum_exp", 1.0 - 2.0 * np.log((np.e + np.exp(0.5)) / 2)), ("mean", 1.0 - 1.5)):
        loss, m = disco_loss(logp, old, adv, mask, group_size=4, num_prompts=1, score="likelihood_ratio",
                             negatives=negatives, tau=2.0, beta=100.0, delta=0.01)
        assert kl < 0.01 and float(m["disco_constraint"]) == 0.0  # inside the trust region: no penalty
        np.testing.assert_allclose(float(loss), -j, rtol=1e-5)
        np.testing.assert_allclose(float(m["ppo_kl"]), kl, rtol=1e-5)
    # delta = -1 puts kl outside: the penalty sg(beta (kl - delta)) kl = 100 (kl + 1) kl is added
    loss, m = disco_loss(logp, old, adv, mask, group_size=4, num_prompts=1, score="likelihood_ratio",
                         negatives="mean", tau=2.0, beta=100.0, delta=-1.0)
    np.testing.assert_allclose(float(m["disco_constraint"]), 100.0 * (kl + 1.0) * kl, rtol=1e-5)
    np.testing.assert_allclose(float(loss), 0.5 + 100.0 * (kl + 1.0) * kl, rtol=1e-5)
    assert float(m["pg_clipfrac"]) == 1.0


@pytest.mark.parametrize("score", ["log_likelihood", "likelihood_ratio"])
@pytest.mark.parametrize("negatives", ["log_sum_exp", "mean"])
def test_disco_equals_numpy_transcription(score, negatives):
    k = jax.random.split(jax.random.PRNGKey(1), 3)
    g, b, r = 4, 16, 7
    logp = -jax.random.uniform(k[0], (b, r), minval=0.1, maxval=3.0)
    old = logp + 0.02 + 0.05 * jax.random.normal(k[1], logp.shape)  # kl about 0.02: the penalty is on
    lengths = np.asarray(jax.random.randint(k[2], (b,), 1, r + 1))
    mask = jnp.asarray((np.arange(r)[None] < lengths[:, None]).astype(np.float32))
    rewards = [1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0]  # mixed, all-correct, all-wrong, mixed
    adv = _adv(rewards, g, mask)
    tau = 10.0 if score == "log_likelihood" else 1.0
    for beta, delta in ((1e3, 1e-4), (0.0, 0.0), (50.0, 10.0)):
        loss, m = disco_loss(logp, old, adv, mask, group_size=g, num_prompts=b // g, score=score,
                             negatives=negatives, tau=tau, beta=beta, delta=delta)
        want = disco_reference(logp, old, rewards, mask, g, score, negatives, tau, beta, delta)
        np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)  # f32: s - tau lme nearly cancels
        assert float(m["disco_valid_groups_frac"]) == 0.5
    # the penalty's gradient is sg(beta (kl - delta)) d kl: on the KL part alone (no signal: A = 0)
    f = lambda lp: disco_loss(lp, old, 0 * adv, mask, group_size=g, num_prompts=b // g, score=score,  # noqa: E731
                              negatives=negatives, tau=tau, beta=1e3, delta=1e-4)[0]
    kl = float(((old - logp) * mask).sum() / mask.sum())
    coef = max(1e3 * (kl - 1e-4), 0.0)
    assert coef > 0
    np.testing.assert_allclose(np.asarray(jax.grad(f)(logp)), -coef * np.asarray(mask) / float(mask.sum()),
                               rtol=1e-4, atol=1e-8)
