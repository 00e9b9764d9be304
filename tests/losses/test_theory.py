"""eta(p, G) of Theorem 6.2: hand values, float64 reference, asymptote, Monte-Carlo bandit check."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipo_jax.losses import theory


def eta_reference(p: float, g: int) -> float:
    """Theorem 6.2 verbatim in float64."""
    num = sum(math.sqrt(k * (g - k)) * math.comb(g, k) * p**k * (1 - p) ** (g - k) for k in range(1, g))
    return num / (g * p * (1 - p) * (1 - p**g - (1 - p) ** g))


def test_eta_hand_values():
    # G = 2: only k = 1, numerator 2p(1-p), non-degenerate mass 2p(1-p) -> eta = 1 / (2p(1-p))
    chex.assert_trees_all_close(theory.eta(jnp.array([0.5, 0.1]), 2), jnp.array([2.0, 1 / 0.18]), rtol=1e-6)
    # G = 4, p = 1/2: (2*sqrt3*4 + 2*6) / 16 / (4 * 1/4 * (1 - 2/16))
    chex.assert_trees_all_close(theory.eta(0.5, 4), jnp.float32((8 * math.sqrt(3) + 12) / 16 / 0.875), rtol=1e-6)


@pytest.mark.parametrize("g", [2, 3, 8, 128])
def test_eta_matches_float64_reference(g):
    ps = [1e-4, 1e-3, 0.01, 0.1, 0.3, 0.5, 0.77, 0.95, 0.999]
    got = np.asarray(theory.eta(jnp.asarray(ps, jnp.float32), g))
    want = np.array([eta_reference(p, g) for p in ps])
    np.testing.assert_allclose(got, want, rtol=2e-4)


def test_eta_symmetry_and_boundary_asymptote():
    p = jnp.array([2.0**-17, 2.0**-10, 0.1875, 0.375])  # 1 - p is exact in float32
    for g in (8, 128):
        chex.assert_trees_all_close(theory.eta(p, g), theory.eta(1.0 - p, g), rtol=1e-6)
        ratio = np.asarray(theory.eta(p, g) / theory.eta_asymptote(p, g))
        assert abs(ratio[0] - 1) < 1e-3  # eta ~ sqrt(G-1) / (G p (1-p)) as p -> 0
        assert abs(ratio[0] - 1) < abs(ratio[1] - 1) < abs(ratio[2] - 1)  # and the gap closes monotonically
    chex.assert_trees_all_close(theory.eta_asymptote(0.5, 8), jnp.float32(math.sqrt(7) / 2), rtol=1e-6)
    # G = 2: the asymptote is exact
    chex.assert_trees_all_close(theory.eta(p, 2), theory.eta_asymptote(p, 2), rtol=1e-5)
    with pytest.raises(ValueError, match="G=1"):
        theory.eta(0.5, 1)


def test_bandit_success_probability_and_gradient():
    p, grad = theory.bandit_success_probability(jnp.array([0.0, 0.0, math.log(2.0)]), jnp.array([1, 0, 1]))
    chex.assert_trees_all_close(p, jnp.float32(0.75))  # softmax = [1/4, 1/4, 1/2]
    chex.assert_trees_all_close(grad, jnp.array([0.0625, -0.1875, 0.125]), rtol=1e-6)  # pi * (s - p)
    auto = jax.grad(lambda z: theory.bandit_success_probability(z, jnp.array([1, 0, 1]))[0])(
        jnp.array([0.0, 0.0, math.log(2.0)]))
    chex.assert_trees_all_close(grad, auto, rtol=1e-6)


def test_figure3a_script_writes_png(tmp_path):
    from experiments import figure3a

    out = tmp_path / "fig" / "figure3a.png"
    figure3a.main(["--out", str(out), "--mc-groups", "0"])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    logits, success = figure3a.bandit_logits_for(0.3)
    p, _ = theory.bandit_success_probability(logits, success)
    assert float(p) == pytest.approx(0.3, rel=1e-5)
    with pytest.raises(SystemExit):
        figure3a.main(["--out", str(tmp_path / "f.pdf")])


@pytest.mark.parametrize(
    "arm_logits, success",
    [
        ([0.0, 1.0, -1.0, 0.5], [1, 0, 0, 0]),  # p ~ 0.17
        ([-2.0, 1.0, 0.5, 1.5, -3.0], [1, 0, 0, 0, 1]),  # p ~ 0.02, near the boundary
        ([2.0, 1.0, 0.0, -1.0], [1, 1, 0, 0]),  # p ~ 0.87
    ],
)
def test_monte_carlo_grpo_gradient_scale_matches_eta(arm_logits, success):
    g = 8
    r = theory.grpo_gradient_scale_mc(jax.random.key(0), jnp.array(arm_logits), jnp.array(success), g, 40_000)
    expected = float(theory.eta(r["p"], g))
    # |eta_hat - eta| < 5 standard errors: a false failure has probability ~6e-7 (CLT; >= 5000 non-degenerate groups)
    assert abs(r["eta_hat"] - expected) < 5 * r["eta_se"], (r["eta_hat"], expected, r["eta_se"])
    # the whole expected gradient vector is eta * grad p (the conditional score terms average out)
    assert np.all(np.abs(r["grad_mean_n"] - expected * r["grad_p_n"]) < 5 * r["grad_se_n"] + 1e-12)
    # power: the tolerance separates eta from the scale with verl's ddof=1 std (x sqrt((G-1)/G)) and from
    # the scale without conditioning on a non-degenerate group (x P(1 <= S <= G-1))
    p = r["p"]
    p_nondeg = 1 - p**g - (1 - p) ** g
    assert 5 * r["eta_se"] < expected * (1 - math.sqrt((g - 1) / g))
    assert 5 * r["eta_se"] < expected * (1 - p_nondeg)
