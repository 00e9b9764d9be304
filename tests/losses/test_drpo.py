"""DRPO (docs/math.md §1 "DRPO", `losses/drpo.py`): a hand-computed group, and a numpy transcription of
the paper's objective as the authors' code computes it (groups with both correct and incorrect responses;
length weights normalised among the correct ones; tau x log-mean-exp of the incorrect scores / tau; the
KL penalty sg(max(beta (kl - delta), 0)) kl; the group sum over the number of prompts)."""

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax.losses.drpo import drpo_loss


def drpo_reference(logp, old, rewards, mask, g, tau, lam, beta, delta):
    logp, old, mask = (np.asarray(x, np.float64) for x in (logp, old, mask))
    b, r = logp.shape
    lengths = mask.sum(1)
    score = (logp * mask).sum(1) / lengths
    total = 0.0
    for q in range(b // g):
        rows = range(q * g, (q + 1) * g)
        pos = [i for i in rows if rewards[i] == 1]
        neg = [i for i in rows if rewards[i] == 0]
        if not pos or not neg:
            continue
        lme = np.log(np.mean([np.exp(score[j] / tau) for j in neg]))
        w = {i: np.exp((1 - lengths[i] / r) / lam) for i in pos}
        total += sum(w[i] * (score[i] - tau * lme) for i in pos) / sum(w.values())
    kl = ((old - logp) * mask).sum() / mask.sum()
    return -total / (b // g) + max(beta * (kl - delta), 0.0) * kl


def _adv(rewards, g):  # GRPO's sign: r - group mean
    r = np.asarray(rewards, np.float64).reshape(-1, g)
    return jnp.asarray((r - r.mean(1, keepdims=True)).reshape(-1), jnp.float32)


def test_drpo_by_hand():
    """One group of 3 (R = 4): correct rows 0 (2 tokens) and 1 (4 tokens), incorrect row 2; lambda = 1,
    tau = 1: s = -1, -0.5, -2; w = e^0.5, e^0; J = (e^.5 (-1 + 2) + 1 (-.5 + 2)) / (e^.5 + 1);
    logp = logp_old, so kl = 0 and no penalty."""
    logp = jnp.array([[-1.0, -1.0, 0.0, 0.0], [-0.5, -0.5, -0.5, -0.5], [-2.0, -2.0, -2.0, 0.0]])
    mask = jnp.array([[1.0, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]])
    adv = _adv([1, 1, 0], 3)[:, None] * mask
    loss, m = drpo_loss(logp, logp, adv, mask, group_size=3, num_prompts=1, tau=1.0, lam=1.0, beta=10.0, delta=0.0)
    e = np.exp(0.5)
    np.testing.assert_allclose(float(loss), -(e * 1.0 + 1.5) / (e + 1), rtol=1e-6)
    assert float(m["drpo_constraint"]) == 0.0 and float(m["drpo_valid_groups_frac"]) == 1.0
    # the gradient: d/ds_0 = -w_0 / sum w, pushed evenly onto row 0's two tokens
    grad = jax.grad(lambda lp: drpo_loss(lp, logp, adv, mask, group_size=3, num_prompts=1, tau=1.0, lam=1.0,
                                         beta=10.0, delta=0.0)[0])(logp)
    np.testing.assert_allclose(np.asarray(grad[0, :2]), -e / (e + 1) / 2 + 0 * grad[0, :2], rtol=1e-5)


def test_drpo_equals_numpy_transcription():
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    g, b, r = 4, 16, 7
    logp = -jax.random.uniform(k[0], (b, r), minval=0.1, maxval=3.0)
    old = logp + 0.05 * jax.random.normal(k[1], logp.shape)
    lengths = np.asarray(jax.random.randint(k[2], (b,), 1, r + 1))
    mask = jnp.asarray((np.arange(r)[None] < lengths[:, None]).astype(np.float32))
    rewards = [1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0]  # mixed, all-correct, all-wrong, mixed
    adv = _adv(rewards, g)[:, None] * mask
    for beta, delta in ((1e3, 1e-4), (0.0, 0.0), (50.0, 10.0)):
        loss, _ = drpo_loss(logp, old, adv, mask, group_size=g, num_prompts=b // g, tau=10.0, lam=0.1,
                            beta=beta, delta=delta)
        want = drpo_reference(logp, old, rewards, mask, g, 10.0, 0.1, beta, delta)
        np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-7)  # f32: s - tau lme nearly cancels
    # the penalty's gradient is sg(beta (kl - delta)) d kl: a finite-difference check on the KL part alone
    f = lambda lp: drpo_loss(lp, old, 0 * adv, mask, group_size=g, num_prompts=b // g, beta=1e3, delta=1e-4)[0]  # noqa: E731
    kl = float(((old - logp) * mask).sum() / mask.sum())
    coef = max(1e3 * (kl - 1e-4), 0.0)
    np.testing.assert_allclose(np.asarray(jax.grad(f)(logp)), -coef * np.asarray(mask) / float(mask.sum()),
                               rtol=1e-4, atol=1e-8)
