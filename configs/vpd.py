"""VPD (experimental, docs/math.md §4): SDPO's M-step toward a feedback-conditioned teacher that an
E-step (BCO loss on the implicit reward beta * log(q / pi_student)) refines every F steps.

Presets as for every algorithm (`tiny`, `micro`, `qwen3_4b`, `qwen3_8b`); ablations are
overrides: `--config.vpd.e_step=false` (= SDPO), `--config.vpd.reference=fixed`, and the
GRPO + SDPO hybrids `--config.vpd.hybrid=joint|reshape` (which switch the estimator, loss
and PIPO attribution to GRPO's: see `hybrid` below).
"""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.algorithm_config("vpd", preset)
    c.loss.agg_mode = "token-mean"
    c.loss.kl_coef = 0.0
    return c


def hybrid(preset: str, mode: str):
    """A GRPO + SDPO hybrid ablation (`joint` loss or advantage `reshape`) as a full config: the variant's registered
    estimator, loss and attribution (GRPO's), the base's aggregation and KL."""
    c = base.algorithm_config("vpd", preset, variant=mode)
    c.vpd.hybrid = mode
    return c
