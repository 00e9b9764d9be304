"""Figure 3a of the PIPO paper: the GRPO gradient scale eta(p) for G = 8 and 128 (Theorem 6.2).

Draws eta(p, G) over the success rate p (log y axis) with the boundary asymptote
sqrt(G-1) / (G p (1-p)) of Corollary 6.3 dashed, and, unless `--mc-groups 0`, Monte-Carlo
estimates of the expected GRPO gradient scale on a softmax bandit (error bars = 2 standard
errors) measured with the package's own advantages and loss. Writes a PNG.

    python experiments/figure3a.py --out runs/figure3a.png
"""

from __future__ import annotations

import argparse
import logging
import math
import os

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from pipo_jax.losses import theory
from pipo_jax.run import compile_cache

log = logging.getLogger("figure3a")
GROUP_SIZES = (8, 128)
MC_SUCCESS_RATES = (0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 0.98)


def bandit_logits_for(p: float) -> tuple[jax.Array, jax.Array]:
    """A 4-arm bandit with one successful arm of probability p (its logit solves softmax = p)."""
    others = jnp.array([0.3, -0.2, 0.0])
    logit = math.log(p / (1 - p)) + float(jax.nn.logsumexp(others))
    return jnp.concatenate([jnp.array([logit]), others]), jnp.array([1, 0, 0, 0])


def draw(out: str, mc_groups: int, seed: int) -> dict:
    """Render the figure to `out`; returns the plotted MC points {G: [(p, eta_hat, eta_se, eta)]}."""
    p = np.concatenate([np.geomspace(1e-4, 0.5, 400), 1 - np.geomspace(0.5, 1e-4, 400)[1:]])
    fig, ax = plt.subplots(figsize=(5.2, 3.8), dpi=150)
    mc_points: dict[int, list] = {}
    for g, color in zip(GROUP_SIZES, ("tab:blue", "tab:red")):
        ax.plot(p, np.asarray(theory.eta(jnp.asarray(p, jnp.float32), g)), color=color, label=f"$\\eta(p)$, G={g}")
        ax.plot(p, np.asarray(theory.eta_asymptote(jnp.asarray(p, jnp.float32), g)), color=color, ls="--", lw=0.8,
                label=f"$\\sqrt{{G-1}}/(Gp(1-p))$, G={g}")
        if mc_groups > 0:
            pts = []
            for i, rate in enumerate(MC_SUCCESS_RATES):
                logits, success = bandit_logits_for(rate)
                r = theory.grpo_gradient_scale_mc(jax.random.key(seed + 1000 * g + i), logits, success, g, mc_groups)
                pts.append((r["p"], r["eta_hat"], r["eta_se"], float(theory.eta(r["p"], g))))
            arr = np.array(pts)
            ax.errorbar(arr[:, 0], arr[:, 1], yerr=2 * arr[:, 2], fmt="o", ms=3, color=color, capsize=2,
                        label=f"Monte-Carlo GRPO, G={g}")
            mc_points[g] = pts
    ax.set_yscale("log")
    ax.set_xlabel("success rate $p_t$")
    ax.set_ylabel("gradient scale $\\eta(p_t)$")
    ax.set_title("GRPO boundary sensitivity (Thm. 6.2)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6.5)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return mc_points


class _OneLineParser(argparse.ArgumentParser):
    """argparse with a bad argument reported as one line (no usage text), exit status 2."""

    def error(self, message):
        self.exit(2, f"error: {message}\n")


def main(argv=None) -> None:
    parser = _OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="PNG path to write")
    parser.add_argument("--mc-groups", type=int, default=20_000,
                        help="groups per Monte-Carlo point (0 draws the curves only)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.out.lower().endswith(".png"):
        parser.error(f"--out={args.out!r} must end in .png")
    if args.mc_groups < 0:
        parser.error(f"--mc-groups={args.mc_groups} must be >= 0")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    compile_cache.configure()  # as the other commands (experiments/cli.py): PIPO_JAX_COMPILATION_CACHE moves it
    try:
        points = draw(args.out, args.mc_groups, args.seed)
    except OSError as e:  # the output path: missing permission, a file where a directory should be
        parser.error(f"--out={args.out!r}: {e}")
    for g, pts in points.items():
        for p, eta_hat, se, eta in pts:
            log.info("G=%d p=%.3f eta=%.4f mc=%.4f +- %.4f (%.1f se)", g, p, eta, eta_hat, se, (eta_hat - eta) / se)
    log.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
