"""Evaluate a policy: `n` samples per problem, pass@1 (mean over n) and unbiased pass@k per
benchmark, printed as a table (fractions 0-1, as the trainer logs them) and written as JSON; on the
built-in task also the greedy accuracy on the same problems (the trainer's `heldout_accuracy` figure).

Built-in task (a training run's workdir, latest orbax checkpoint):
    python -m experiments.eval --policy=runs/tiny --builtin_problems=512 --n=8 --out=runs/tiny/eval.json

Math benchmarks (a Hugging Face model directory with its tokenizer, JSONL/parquet files):
    python -m experiments.eval --policy=/models/Qwen3-4B --n=8 --max_new_tokens=4096 \
        --benchmark=MATH500=data/math500.jsonl --benchmark=AIME25=data/aime25.jsonl --out=runs/qwen3_4b_eval.json

A run workdir trained on a math task takes its tokenizer from the run's config
(`task.dataset.tokenizer_path` or `model.path`); `--tokenizer` overrides it. The trainer's
periodic evaluation (`config.eval.benchmarks`) scores benchmarks with the same
`pipo_jax.run.evaluate.math_benchmarks`.

The JSON records what was evaluated: ``{"written_by": "experiments.eval", "policy",
"checkpoint_step" (None for a HF directory), the sampling flags, "results": {benchmark:
pass@k ..., "greedy_accuracy" (the built-in task)}, "unscored" (responses the verifier's budget left unchecked, scored 0),
"provenance": commit / versions / machine}``. Its default path is `eval.<step>.json` in a
run workdir (one file per evaluated checkpoint) and `eval.json` in a HF directory. An
existing file is never overwritten unless it carries the ``written_by`` marker (a file this
script wrote) and `--overwrite` is given: a training log or any other file is refused.
"""

from __future__ import annotations

import json
import logging
import os

import jax
from absl import flags

from experiments import cli
from pipo_jax import provenance
from pipo_jax.data.prompts import DEFAULT_INSTRUCTION, PromptConfig
from pipo_jax.data.sources import SourceConfig
from pipo_jax.data.tokenizer import load_tokenizer, pad_token_id, stop_token_ids
from pipo_jax.run import evaluate, export
from pipo_jax.run.checkpoint import saved_steps
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.tasks import passk
from pipo_jax.tasks.math import MathVerifier, MathVerifyConfig

_POLICY = flags.DEFINE_string("policy", None, "HF model directory or training-run workdir", required=True)
_STEP = flags.DEFINE_integer("step", None, "checkpoint step of a run workdir (default: latest)")
_N = flags.DEFINE_integer("n", 8, "samples per problem")
_KS = flags.DEFINE_list("ks", ["1", "8"], "k values of pass@k (each <= n)")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "sampling temperature")
_SEED = flags.DEFINE_integer("seed", 0, "sampling seed")
_BATCH = flags.DEFINE_integer("batch_size", 64, "sequences per generate call")
_OUT = flags.DEFINE_string("out", None, "JSON output path (default: eval.<step>.json in a run workdir, eval.json "
                           "in a HF directory)")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "replace an earlier output of this script (never another file)")
_BUILTIN = flags.DEFINE_integer("builtin_problems", 0, "held-out problems of the built-in task (run workdirs)")
_BENCHMARKS = flags.DEFINE_multi_string("benchmark", [], "NAME=PATH of a JSONL/parquet file (repeatable)")
_FORMAT = flags.DEFINE_enum("format", "auto", ["auto", "jsonl", "parquet"], "benchmark file format")
_PROMPT_FIELD = flags.DEFINE_string("prompt_field", "problem", "dotted field of the question")
_ANSWER_FIELD = flags.DEFINE_string("answer_field", "answer", "dotted field of the reference answer")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "tokenizer directory (default: the HF policy directory, or "
                                 "a run's task.dataset.tokenizer_path / model.path)")
_STYLE = flags.DEFINE_enum("prompt_style", "instruct", ["instruct", "base"], "chat-template style")
_INSTRUCTION = flags.DEFINE_string("instruction", DEFAULT_INSTRUCTION, "text added after the question")
_THINKING = flags.DEFINE_enum("enable_thinking", "template", ["template", "true", "false"],
                              "Qwen3 chat template switch (template = its default)")
_ANSWER_PATTERN = flags.DEFINE_string("answer_pattern", None, "regex for the final answer instead of \\boxed{}")
_MAX_PROMPT = flags.DEFINE_integer("max_prompt_tokens", 512, "longer prompts are dropped (counted)")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 4096, "response budget (math benchmarks)")
_VERIFY_TIMEOUT = flags.DEFINE_float("verify_timeout_s", 5.0, "math: time limit of one answer's check")
_VERIFY_BUDGET = flags.DEFINE_float("verify_batch_budget_s", 600.0, "math: time limit of one benchmark's checks "
                                    "(answers past it score 0 and are counted as unscored)")
_VERIFY_WORKERS = flags.DEFINE_integer("verify_workers", 0, "math checker processes (0 = one per CPU core, max 16)")

WRITTEN_BY = "experiments.eval"


def checked_ks(ks: list[str], n: int) -> list[int]:
    """The pass@k values of `--ks` (each in [1, n]), or a `UsageError` naming the flags."""
    if n < 1:
        raise cli.UsageError(f"--n={n}: must be >= 1")
    values = cli.parse_list("ks", ks, int)
    if not values:
        raise cli.UsageError("--ks: give at least one k")
    for k in values:
        if not 1 <= k <= n:
            raise cli.UsageError(f"--ks={','.join(ks)}: pass@{k} needs 1 <= k <= --n={n} samples per problem")
    return values


def expected_step(policy: str, step: int | None) -> int | None:
    """The checkpoint step `load_policy_at` will read if it reads (`--step`, which must be saved,
    else the newest saved one); None for a HF directory."""
    if not os.path.isdir(os.path.join(policy, "checkpoints")):
        return step
    steps = saved_steps(os.path.join(policy, "checkpoints"))
    if step is not None and step not in steps:
        raise cli.UsageError(f"--step={step}: {policy} holds no checkpoint of that step (saved: {steps})")
    return step if step is not None else (steps[-1] if steps else None)


def default_out(policy: str, step: int | None) -> str:
    """`eval.<step>.json` in a run workdir, `eval.json` in a HF directory."""
    return os.path.join(policy, "eval.json" if step is None else f"eval.{step}.json")


def check_out(path: str, overwrite: bool) -> None:
    """Raises a `UsageError` unless `path` is new, or an earlier output of this script and `overwrite`."""
    if not os.path.lexists(path):
        return
    if os.path.isdir(path):
        raise cli.UsageError(f"--out={path}: is a directory; give a file path")
    try:
        with open(path, encoding="utf-8") as f:
            earlier = json.load(f)
    except (OSError, ValueError):
        earlier = None
    if not (isinstance(earlier, dict) and earlier.get("written_by") == WRITTEN_BY):
        raise cli.UsageError(f"--out={path}: the file exists and was not written by {WRITTEN_BY} (no \"written_by\" "
                             "marker); refusing to overwrite it: give another --out")
    if not overwrite:
        raise cli.UsageError(f"--out={path}: holds an earlier evaluation (policy {earlier.get('policy')}, step "
                             f"{earlier.get('checkpoint_step')}); pass --overwrite to replace it, or give another --out")


def write_record(path: str, record: dict) -> None:
    """Writes `record` to `path` whole (a temporary file renamed over it)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def tokenizer_path(policy: str, spec, explicit: str | None) -> str:
    """The tokenizer directory: explicit, the run's dataset task / model, or the HF policy dir."""
    if explicit:
        return explicit
    if spec is None:
        return policy
    path = export.run_tokenizer_dir(evaluate.load_run_config(policy))
    if not path:
        raise cli.UsageError(f"{policy}: the run trained the built-in task's model, which has no tokenizer; "
                             "math benchmarks need --tokenizer=DIR (and a model that uses it)")
    return path


def main(argv):
    del argv
    logging.basicConfig(level=logging.INFO)
    ks = checked_ks(_KS.value, _N.value)
    for flag in (_BATCH, _MAX_NEW, _MAX_PROMPT):
        if flag.value < 1:
            raise cli.UsageError(f"--{flag.name}={flag.value}: must be >= 1")
    if _BUILTIN.value < 0:
        raise cli.UsageError(f"--builtin_problems={_BUILTIN.value}: must be >= 0")
    if not _BUILTIN.value and not _BENCHMARKS.value:
        raise cli.UsageError("nothing to evaluate: give --builtin_problems and/or --benchmark")
    for item in _BENCHMARKS.value:
        if not all(item.partition("=")[::2]):
            raise cli.UsageError(f"--benchmark={item!r}: expected NAME=PATH")
    try:
        verify = MathVerifyConfig(answer_pattern=_ANSWER_PATTERN.value, timeout_s=_VERIFY_TIMEOUT.value,
                                  batch_budget_s=_VERIFY_BUDGET.value, num_workers=_VERIFY_WORKERS.value)
    except ValueError as e:
        raise cli.UsageError(f"verifier flags (--answer_pattern, --verify_*): {e}") from None
    check_out(_OUT.value or default_out(_POLICY.value, expected_step(_POLICY.value, _STEP.value)),
              _OVERWRITE.value)  # before any work
    model, params, spec, step = evaluate.load_policy_at(_POLICY.value, _STEP.value)
    out = _OUT.value or default_out(_POLICY.value, step)
    check_out(out, _OVERWRITE.value)  # again: an unreadable newest checkpoint falls back to an older step
    rng = jax.random.PRNGKey(_SEED.value)
    rows, info, greedy = [], {}, {}
    if _BUILTIN.value:
        if spec is None or not spec.task.capabilities.device_reward:
            raise cli.UsageError("--builtin_problems needs a workdir of a run on the built-in task")
        builtin = evaluate.heldout_rewards(spec, params, _BUILTIN.value, _N.value, rng, _TEMPERATURE.value,
                                           _BATCH.value)
        rows = passk.summarize({"builtin_heldout": builtin}, ks)[:-1]
        greedy["builtin_heldout"] = evaluate.greedy_heldout_accuracy(spec, params, _BUILTIN.value, rng)
    if _BENCHMARKS.value:
        tok_dir = tokenizer_path(_POLICY.value, spec, _TOKENIZER.value)
        tokenizer = load_tokenizer(tok_dir)
        thinking = None if _THINKING.value == "template" else _THINKING.value == "true"
        prompt_config = PromptConfig(style=_STYLE.value, instruction=_INSTRUCTION.value, enable_thinking=thinking,
                                     max_prompt_tokens=_MAX_PROMPT.value)
        benchmarks = {}
        for item in _BENCHMARKS.value:
            name, _, path = item.partition("=")
            benchmarks[name] = evaluate.load_math_benchmark(SourceConfig(
                path, format=_FORMAT.value, prompt_field=_PROMPT_FIELD.value, answer_field=_ANSWER_FIELD.value))
        with MathVerifier(verify) as verifier:
            bench_rows, info = evaluate.math_benchmarks(
                model, params, tokenizer, benchmarks, prompt_config, verifier, _N.value, ks,
                jax.random.fold_in(rng, 1),
                SamplingParams(max_new_tokens=_MAX_NEW.value, temperature=_TEMPERATURE.value,
                               stop_token_ids=tuple(stop_token_ids(tokenizer, tok_dir)),
                               pad_id=pad_token_id(tokenizer)),
                batch_size=_BATCH.value)
        rows = rows + bench_rows
    print(passk.format_table(rows, greedy))  # fractions (0-1), as the trainer logs them
    for name, i in info.items():
        print(f"{name}: {i['problems']} problems, {i['dropped']} prompts dropped as too long, {i['unscored']} "
              "responses unscored (past --verify_batch_budget_s, scored 0)")
    record = {"written_by": WRITTEN_BY, "policy": os.path.abspath(_POLICY.value), "checkpoint_step": step,
              "n": _N.value, "ks": ks, "temperature": _TEMPERATURE.value, "seed": _SEED.value,
              "benchmarks": dict(item.partition("=")[::2] for item in _BENCHMARKS.value),
              "builtin_problems": _BUILTIN.value, "unscored": {name: i["unscored"] for name, i in info.items()},
              "results": passk.to_json(rows), "provenance": provenance.record()}
    for name, accuracy in greedy.items():  # the same problems decoded greedily (the trainer's heldout_accuracy)
        record["results"][name]["greedy_accuracy"] = accuracy
    write_record(out, record)
    print(f"wrote {out} (checkpoint step {step})" if step is not None else f"wrote {out}")


if __name__ == "__main__":
    cli.run(main)
