"""Loss math: advantages, policy losses, self-distillation, the PI step's loss (docs/math.md §1-3).

Modules (one concept each; all functions are pure and jit/vmap-able):
    aggregation   loss_agg_mode reductions with global token / sequence counts
    advantages    GAE + masked whitening, group-relative advantages, DAPO filter / overlong
    policy        token clip (asymmetric eps, dual clip), GSPO sequence ratio, CISPO
    kl            k1 / k2 / k3 KL-to-reference estimators and the KL loss term
    value         clipped value loss (PPO critic)
    distill       SDPO generalised JSD / reverse-KL token loss, IS weight, attribution, EMA
    pipo          the PI step's attributions, PI rewards and surrogate loss (its controller:
                  `pipo_jax/rl/controller.py`)
    theory        eta(p, G) of Theorem 6.2, its asymptote, the Monte-Carlo bandit check
    vpd           VPD's E-step math: implicit reward, BCO loss, margin, the GRPO + SDPO hybrids

`pipo_jax/rl/algorithms.py` registers these as an algorithm's named pieces.

The composite functions are wrapped in `jax.jit` with their configuration arguments (modes,
eps, group sizes, ...) static, so an eager call compiles once per shape and configuration;
inside a jitted trainer step the wrappers inline.
"""
