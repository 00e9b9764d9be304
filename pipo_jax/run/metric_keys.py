"""Every key a run writes to metrics.jsonl and TensorBoard, declared once: its kind and meaning.

docs/metrics.md's table is rendered from `METRICS` (`python -m pipo_jax.run.metric_keys` prints it,
`--write` puts it into the page); tests/run/test_metric_keys.py holds the page to the declarations and
tests/run/test_metric_keys_run.py a run's emitted keys: no key is emitted without a declaration, and the
TensorBoard tags equal the JSONL keys (every declared key is a tag TensorBoard keeps as it is).

A key's name says whether it is a count or a fraction (`NAMING`): a fraction ends in `_frac` (or is a
clip fraction, a share, an accuracy, a pass rate); a count names what it counts. `RENAMED` maps the
names earlier runs wrote to today's: `observe.read_metrics` reads an old metrics.jsonl under the new
names, so a run resumed from one keeps its step-0 figures.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import sys
import textwrap

# kind -> what its value is (the column "kind" of the table)
KINDS = {
    "count": "a number of things, what it counts in the name",
    "fraction": "a share in [0, 1]",
    "mean": "a mean, its unit in the meaning",
    "value": "a scalar of its own (a loss, a statistic, a bound)",
    "flag": "1 or 0",
    "seconds": "wall-clock seconds",
    "per_second": "a rate per wall-clock second",
}


@dataclasses.dataclass(frozen=True)
class Metric:
    """One key. `key` may hold `{name}` parts, each standing for one name of the run's own (a reward
    component, a benchmark, a teacher context): `{name}` matches letters, digits, `_`, `-` and `.`."""

    key: str
    kind: str
    meaning: str
    section: str

    def pattern(self) -> re.Pattern:
        parts = re.split(r"\{\w+\}", self.key)
        return re.compile("[A-Za-z0-9_.-]+".join(re.escape(p) for p in parts) + r"\Z")


# Sections of the table, in order: (name, what emits it and when).
SECTIONS = (
    ("iteration", "every iteration: the batch as sampled, before any update (`rl/learn.py:prepare_batch`)"),
    ("pipo", "every iteration: PIPO's controller (docs/math.md §2); `mu_t` also without PIPO"),
    ("train", "the base step (exploration), under `train/`: each optimizer step's value, averaged over the "
              "iteration's optimizer steps (epochs x mini-batches); which keys, by the policy loss"),
    ("pi", "the PI step (verification), under `pi/`: as `train/`, zeros where the step did not apply"),
    ("critic", "PPO's value model, under `critic/`"),
    ("advantage", "the advantage estimator's own figures, under `advantage/` (BNPO's pool)"),
    ("vpd", "VPD's E-step and teacher diagnostics, under `vpd/`"),
    ("rollout", "the rollout: DAPO's dynamic sampling, a host-scored task's counts, reward components"),
    ("timing", "every logged iteration: the chunk of iterations timed as a whole"),
    ("evaluation", "the trainer's evaluation: at iteration 0, every `eval.every` and at the end"),
    ("warmup", "row 0 (iteration 0) after a supervised warm-up (docs/results.md)"),
)

# The metrics of a step: the policy loss's (per loss), the regularisers', the step's own.
_LOSS_TERMS = (
    ("loss", "value", "the minimised loss: the policy loss plus the regularisers"),
    ("grad_norm", "value", "global L2 norm of the step's gradient, before clipping"),
    ("kl_loss", "mean", "the reference KL term (`loss.kl_estimator`, nats per token), before its weight "
                        "`loss.kl_coef` (with a KL loss term only)"),
    ("entropy_loss", "mean", "the entropy bonus's entropy (nats per token), before `loss.entropy_coef` (when "
                             "nonzero)"),
    ("pg_loss", "value", "the policy-gradient term of the loss"),
    ("pg_clipfrac", "fraction", "tokens whose ratio (CISPO: weight) the clip holds"),
    ("pg_clipfrac_lower", "fraction", "negative-advantage tokens the dual clip caps"),
    ("ppo_kl", "mean", "logp_old - logp per token (nats): how far the step moved the sampled tokens"),
    ("nonfinite_updates", "count", "optimizer steps skipped for a non-finite gradient (a separate PI "
                                   "optimizer's; the shared one's are the top-level key)"),
    ("nonfinite_in_a_row", "count", "non-finite steps in a row at the iteration's end"),
)
_TRAIN_ONLY = (
    ("cov_frac", "fraction", "KL-Cov / Clip-Cov: tokens the covariance selection penalises / leaves out"),
    ("bapo_clip_low", "value", "BAPO: the lower ratio bound c_low the search chose (token mean over micro-batches)"),
    ("bapo_clip_high", "value", "BAPO: the upper ratio bound c_high the search chose"),
    ("bapo_pos_share", "fraction", "BAPO: the positive tokens' share P / (P + N) at the chosen bounds"),
    ("disco_constraint", "value", "DisCO: the KL trust region's penalty term"),
    ("disco_valid_groups_frac", "fraction", "DisCO: prompts with both positive and negative responses"),
    ("drpo_constraint", "value", "DRPO: the KL trust region's penalty term"),
    ("drpo_valid_groups_frac", "fraction", "DRPO: prompts with both correct and incorrect responses"),
    ("copo_local_weight", "mean", "COPO: the local loss's blend weight w per token"),
    ("copo_global_clipfrac", "fraction", "COPO: tokens the global loss's clip holds"),
    ("sdpo_loss", "value", "SDPO / VPD: the distillation loss"),
    ("sdpo_teacher_minus_student_logp", "mean", "SDPO: logp_teacher - logp_student of the sampled token (nats), "
                                                "over the rows with a teacher signal"),
    ("joint_loss", "value", "VPD's joint hybrid: the policy-gradient plus the distillation loss"),
)

_METRICS = [
    Metric("reward_mean", "mean", "reward per response, as the task scores it (before shaping)", "iteration"),
    Metric("reward_std", "value", "the responses' reward standard deviation (population)", "iteration"),
    Metric("response_length", "mean", "response length (valid tokens per response)", "iteration"),
    Metric("entropy", "mean", "the entropy per valid token (nats) of the policy that sampled the batch", "iteration"),
    Metric("kl_ref", "mean", "k3 KL(pi || ref) per valid token (nats)", "iteration"),
    Metric("sampler_logp_gap", "mean", "|logp the sampler recorded - logp the learner computes| per valid "
                                       "token (nats): 0 up to rounding when both agree", "iteration"),
    Metric("groups_all_fail_count", "count", "groups whose responses all failed (reward < 1)", "iteration"),
    Metric("groups_mixed_count", "count", "groups with some but not all responses solved (reward >= 1)",
           "iteration"),
    Metric("groups_all_success_count", "count", "groups whose responses all succeeded", "iteration"),
    Metric("tokens", "count", "valid response tokens of the batch", "iteration"),
    Metric("teacher_context_frac", "fraction", "SDPO / VPD: responses the teacher sees a solution or feedback "
                                               "for", "iteration"),
    Metric("nonfinite_updates", "count", "optimizer steps of the iteration (base and shared PI) skipped for a "
                                         "non-finite gradient", "iteration"),
    Metric("nonfinite_in_a_row", "count", "non-finite optimizer steps in a row at the iteration's end (the run "
                                          "stops at `train.max_bad_steps`)", "iteration"),
    Metric("mu_t", "mean", "mu_t: the batch's mean sequence reward after shaping (Eq. 7)", "pipo"),
    Metric("mu_his", "mean", "mu_his: the window's mean of past mu_t (Eq. 8; absent while the window is empty)",
           "pipo"),
    Metric("sigma_his", "value", "sigma_his: the window's standard deviation (Eq. 8; absent while the window is "
                                 "empty)", "pipo"),
    Metric("xi", "value", "xi = (mu_t - mu_his) / sigma_his (Eq. 9), window standard deviations", "pipo"),
    Metric("c", "value", "c = phi_lam(xi), the scale of the PI rewards (docs/math.md §2)", "pipo"),
    Metric("pi_step_applied", "flag", "whether the PI step ran (a full window, a stored batch, c != 0)", "pipo"),
    Metric("ppo_gate", "value", "PPO with `pipo.authors.ppo_adv_gate`: clip(xi_gate, -2, 2), the advantages' "
                                "factor", "pipo"),
    Metric("ppo_gate_xi", "value", "PPO with `pipo.authors.ppo_adv_gate`: xi_gate, from the window before this "
                                   "iteration", "pipo"),
]
_METRICS += [Metric(f"train/{name}", kind, meaning, "train") for name, kind, meaning in _LOSS_TERMS[:8] + _TRAIN_ONLY]
_METRICS += [Metric(f"pi/{name}", kind, meaning, "pi") for name, kind, meaning in _LOSS_TERMS]
_METRICS += [
    Metric("critic/vf_loss", "value", "the clipped value loss", "critic"),
    Metric("critic/vf_clipfrac", "fraction", "tokens whose value the value clip holds", "critic"),
    Metric("critic/grad_norm", "value", "global L2 norm of the critic's gradient, before clipping", "critic"),
    Metric("critic/nonfinite_updates", "count", "critic optimizer steps skipped for a non-finite gradient",
           "critic"),
    Metric("critic/nonfinite_in_a_row", "count", "non-finite critic steps in a row at the iteration's end",
           "critic"),
    Metric("advantage/bnpo_alpha", "value", "BNPO: the normaliser's alpha", "advantage"),
    Metric("advantage/bnpo_beta", "value", "BNPO: the normaliser's beta", "advantage"),
    Metric("advantage/bnpo_rate_mean", "mean", "BNPO: the pool's mean success rate", "advantage"),
    Metric("advantage/bnpo_rate_var", "value", "BNPO: the pool's success-rate variance (absent while undefined)",
           "advantage"),
    Metric("advantage/bnpo_a", "value", "BNPO: the Beta fit's a (absent while undefined)", "advantage"),
    Metric("advantage/bnpo_b", "value", "BNPO: the Beta fit's b (absent while undefined)", "advantage"),
    Metric("vpd/e_step_applied", "flag", "whether the E-step ran this iteration", "vpd"),
    Metric("vpd/e_loss", "value", "the E-step's BCO loss", "vpd"),
    Metric("vpd/e_loss_pos", "value", "its term on the positive responses", "vpd"),
    Metric("vpd/e_loss_neg", "value", "its term on the negative responses", "vpd"),
    Metric("vpd/e_accuracy", "fraction", "labelled responses the implicit reward classifies right", "vpd"),
    Metric("vpd/rtilde_pos", "mean", "the implicit reward of the positive responses", "vpd"),
    Metric("vpd/rtilde_neg", "mean", "the implicit reward of the negative responses", "vpd"),
    Metric("vpd/rtilde_mean", "mean", "the labelled responses' implicit reward before the update", "vpd"),
    Metric("vpd/grad_norm", "value", "global L2 norm of the E-step's gradient", "vpd"),
    Metric("vpd/delta", "value", "the BCO margin used", "vpd"),
    Metric("vpd/num_pos", "count", "positive (labelled) responses", "vpd"),
    Metric("vpd/num_neg", "count", "negative (labelled) responses", "vpd"),
    Metric("vpd/teacher_entropy", "mean", "the teacher's entropy per valid token (nats)", "vpd"),
    Metric("vpd/student_entropy", "mean", "the student's entropy per valid token (nats)", "vpd"),
    Metric("vpd/kl_teacher_student", "mean", "KL(teacher || student) per valid token (nats)", "vpd"),
    Metric("dapo_gen_batches", "count", "DAPO: generation batches drawn to fill the batch", "rollout"),
    Metric("dapo_groups_kept", "count", "DAPO: groups kept (rewards not all equal)", "rollout"),
    Metric("dapo_groups_dropped", "count", "DAPO: groups dropped (all rewards equal)", "rollout"),
    Metric("dapo_exhausted", "flag", "DAPO: the batch could not be filled (the run stops with an error)",
           "rollout"),
    Metric("reward/unscored_count", "count", "a host-scored task: responses a time budget left unscored (scored 0)",
           "rollout"),
    Metric("reward/check_timeouts", "count", "a math task: answers whose own check timed out", "rollout"),
    Metric("reward_component/{name}", "mean", "GDPO's reward components: component `name`'s mean per response "
                                              "(`Task.reward_weights`)", "rollout"),
    Metric("iteration_time_s", "seconds", "wall time per iteration (the chunk's time over its iterations)",
           "timing"),
    Metric("tokens_per_s", "per_second", "`tokens` over `iteration_time_s`", "timing"),
    Metric("heldout_accuracy", "fraction", "greedy accuracy on `eval.n` fixed held-out problems (docs/results.md)",
           "evaluation"),
    Metric("heldout_pass_at_1", "fraction", "sampled pass@1 on the same problems (`eval.heldout_samples` per "
                                            "problem)", "evaluation"),
    Metric("teacher_accuracy_{name}", "fraction", "SDPO / VPD: greedy accuracy on the same problems shown the "
                                                  "teacher context `name` (`solution`, `feedback`)", "evaluation"),
    Metric("{name}_pass_at_{k}", "fraction", "math benchmark `name` (`eval.benchmarks`): pass@k", "evaluation"),
    Metric("{name}_unscored_count", "count", "math benchmark `name`: responses past the verifier's budget (scored "
                                             "0)", "evaluation"),
    Metric("warmup_steps", "count", "supervised warm-up steps run", "warmup"),
    Metric("warmup_time_s", "seconds", "the warm-up's wall time", "warmup"),
    Metric("warmup_accuracy", "fraction", "greedy accuracy at the warm-up's last check, on its own check set",
           "warmup"),
    Metric("warmup_pass_at_1", "fraction", "sampled pass@1 at that check (with `warmup.check_prompts`)", "warmup"),
    Metric("warmup_mixed_groups_frac", "fraction", "groups with some but not all responses solved at that check",
           "warmup"),
    Metric("warmup_teacher_solution_accuracy", "fraction", "greedy accuracy on the check set shown a solution "
                                                           "(absent: the task has no teacher context)", "warmup"),
    Metric("warmup_teacher_feedback_accuracy", "fraction", "the same, shown feedback", "warmup"),
    Metric("warmup_target_met", "flag", "with a warm-up target: whether every target held at the last check",
           "warmup"),
    Metric("warmup_target_accuracy", "fraction", "the target `warmup.target_accuracy`", "warmup"),
    Metric("warmup_target_pass_rate", "fraction", "the target `warmup.target_pass_rate`", "warmup"),
    Metric("warmup_target_mixed_groups_frac", "fraction", "the target `warmup.target_mixed_groups`", "warmup"),
]
METRICS: tuple[Metric, ...] = tuple(_METRICS)

# Names earlier runs wrote (old -> new). `{name}` as in `Metric.key`.
RENAMED = {
    "heldout_pass@1": "heldout_pass_at_1", "warmup_pass@1": "warmup_pass_at_1",  # TensorBoard renames '@'
    "groups_all_fail": "groups_all_fail_count", "groups_mixed": "groups_mixed_count",
    "groups_all_success": "groups_all_success_count", "warmup_mixed_groups": "warmup_mixed_groups_frac",
    "warmup_target_mixed_groups": "warmup_target_mixed_groups_frac",
    "train/disco_valid_groups": "train/disco_valid_groups_frac",
    "train/drpo_valid_groups": "train/drpo_valid_groups_frac",
    "reward/unscored": "reward/unscored_count", "{name}_unscored": "{name}_unscored_count",
}

# What makes a name say its kind (`naming_error`).
FRACTION_MARKS = ("_frac", "clipfrac", "_share", "accuracy", "pass_at_", "pass_rate")
COUNTED = ("tokens", "updates", "batches", "groups", "steps", "timeouts")
COUNT_MARKS = ("_count", "num_", "_in_a_row") + COUNTED
TENSORBOARD_TAG = re.compile(r"[-/\w.{}]+\Z")  # tensorboardX replaces any other character by '_'


def naming_error(metric: Metric) -> str | None:
    """Why `metric`'s name hides its kind, or None: a fraction's name carries a `FRACTION_MARKS`, a
    count's a `COUNT_MARKS` (what it counts), and a name with a fraction's mark is a fraction."""
    key = metric.key
    if metric.kind == "fraction" and not any(m in key for m in FRACTION_MARKS):
        return f"{key}: a fraction whose name does not say so (one of {FRACTION_MARKS})"
    if metric.kind == "count" and not any(m in key for m in COUNT_MARKS):
        return f"{key}: a count whose name does not say what it counts (one of {COUNT_MARKS})"
    if metric.kind != "fraction" and any(m in key for m in ("_frac", "clipfrac", "_share")):
        return f"{key}: named a fraction, declared a {metric.kind}"
    return None


def declaration(key: str) -> Metric | None:
    """The declared `Metric` a key emitted by a run falls under, or None."""
    return next((m for m in METRICS if m.pattern().match(key)), None)


def undeclared(keys) -> list[str]:
    """The keys (sorted) of `keys` without a declaration ("step", the row's index, is no metric)."""
    return sorted(k for k in keys if k != "step" and declaration(k) is None)


def current_name(key: str) -> str:
    """Today's name of a key an earlier run may have written under a name since renamed (`RENAMED`)."""
    if key in RENAMED:
        return RENAMED[key]
    for old, new in RENAMED.items():
        if "{name}" in old:
            head, tail = old.split("{name}")
            if key.startswith(head) and key.endswith(tail) and len(key) > len(head) + len(tail):
                return new.replace("{name}", key[len(head):len(key) - len(tail)])
    return key


def table() -> str:
    """docs/metrics.md's table: one row per key, by section."""
    lines = ["| kind | its value |", "| --- | --- |"] + [f"| {kind} | {what} |" for kind, what in KINDS.items()]
    lines.append("")
    for section, what in SECTIONS:
        lines += textwrap.wrap(f"**{section}**: {what}.", 120) + ["", "| key | kind | meaning |", "| --- | --- | --- |"]
        lines += [f"| `{m.key}` | {m.kind} | {m.meaning.replace('|', chr(92) + '|')} |" for m in METRICS
                  if m.section == section]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


BEGIN, END = "<!-- metrics:begin (python -m pipo_jax.run.metric_keys --write) -->", "<!-- metrics:end -->"


def rendered_page(page: str) -> str:
    """`page` (docs/metrics.md's text) with the block between `BEGIN` and `END` replaced by `table()`."""
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}{END}{tail}"


def main(argv: list[str]) -> None:
    if argv[1:] == ["--write"]:
        path = pathlib.Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
        path.write_text(rendered_page(path.read_text()))
        print(f"wrote {path}")
    else:
        print(table(), end="")


if __name__ == "__main__":
    main(sys.argv)
