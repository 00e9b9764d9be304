"""Evaluate a policy: `n` samples per problem, pass@1 (mean over n) and unbiased pass@k per
benchmark, printed as a table and written as JSON.

Built-in task (a training run's workdir, latest orbax checkpoint):
    python -m experiments.eval --policy=runs/tiny --builtin_problems=512 --n=8 --out=runs/tiny/eval.json

Math benchmarks (a Hugging Face model directory with its tokenizer, JSONL/parquet files):
    python -m experiments.eval --policy=/models/Qwen3-4B --n=8 --max_new_tokens=4096 \
        --benchmark=MATH500=data/math500.jsonl --benchmark=AIME25=data/aime25.jsonl --out=runs/qwen3_4b_eval.json

A run workdir trained on a math task takes its tokenizer from the run's config
(`task.tokenizer_path` or `model.path`); `--tokenizer` overrides it. The trainer's
periodic evaluation (`config.eval.benchmarks`) scores benchmarks with the same
`pipo_jax.rl.evaluate.math_benchmarks`.
"""

from __future__ import annotations

import logging
import os

import jax
from absl import app, flags

from experiments import cli
from pipo_jax.data.prompts import DEFAULT_INSTRUCTION, PromptConfig
from pipo_jax.data.sources import SourceConfig, load_examples
from pipo_jax.data.tokenizer import load_tokenizer, pad_token_id, stop_token_ids
from pipo_jax.rl import evaluate
from pipo_jax.tasks import passk
from pipo_jax.tasks.math import MathVerifier, MathVerifyConfig

_POLICY = flags.DEFINE_string("policy", None, "HF model directory or training-run workdir", required=True)
_STEP = flags.DEFINE_integer("step", None, "checkpoint step of a run workdir (default: latest)")
_N = flags.DEFINE_integer("n", 8, "samples per problem")
_KS = flags.DEFINE_list("ks", ["1", "8"], "k values of pass@k (each <= n)")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "sampling temperature")
_SEED = flags.DEFINE_integer("seed", 0, "sampling seed")
_BATCH = flags.DEFINE_integer("batch_size", 64, "sequences per generate call")
_OUT = flags.DEFINE_string("out", None, "JSON output path (default: eval.json in the --policy directory)")
_BUILTIN = flags.DEFINE_integer("builtin_problems", 0, "held-out problems of the built-in task (run workdirs)")
_BENCHMARKS = flags.DEFINE_multi_string("benchmark", [], "NAME=PATH of a JSONL/parquet file (repeatable)")
_FORMAT = flags.DEFINE_enum("format", "auto", ["auto", "jsonl", "parquet"], "benchmark file format")
_PROMPT_FIELD = flags.DEFINE_string("prompt_field", "problem", "dotted field of the question")
_ANSWER_FIELD = flags.DEFINE_string("answer_field", "answer", "dotted field of the reference answer")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "tokenizer directory (default: the HF policy directory, or "
                                 "a run's task.tokenizer_path / model.path)")
_STYLE = flags.DEFINE_enum("prompt_style", "instruct", ["instruct", "base"], "chat-template style")
_INSTRUCTION = flags.DEFINE_string("instruction", DEFAULT_INSTRUCTION, "text added after the question")
_THINKING = flags.DEFINE_enum("enable_thinking", "template", ["template", "true", "false"],
                              "Qwen3 chat template switch (template = its default)")
_ANSWER_PATTERN = flags.DEFINE_string("answer_pattern", None, "regex for the final answer instead of \\boxed{}")
_MAX_PROMPT = flags.DEFINE_integer("max_prompt_tokens", 512, "longer prompts are dropped (counted)")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 4096, "response budget (math benchmarks)")


def tokenizer_path(policy: str, spec, explicit: str | None) -> str:
    """The tokenizer directory: explicit, the run's dataset task / model, or the HF policy dir."""
    if explicit:
        return explicit
    if spec is None:
        return policy
    run = evaluate.load_run_config(policy)
    path = run.task.get("tokenizer_path", "") or run.model.path
    if not path:
        raise app.UsageError(f"{policy}: the run trained the built-in task's model, which has no tokenizer; "
                             "math benchmarks need --tokenizer=DIR (and a model that uses it)")
    return path


def main(argv):
    del argv
    logging.basicConfig(level=logging.INFO)
    ks = [int(k) for k in _KS.value]
    model, params, spec = evaluate.load_policy(_POLICY.value, _STEP.value)
    rng = jax.random.PRNGKey(_SEED.value)
    rows, info = [], {}
    if _BUILTIN.value:
        if spec is None or not spec.task.device_reward:
            raise app.UsageError("--builtin_problems needs a workdir of a run on the built-in task")
        builtin = evaluate.heldout_rewards(spec, params, _BUILTIN.value, _N.value, rng, _TEMPERATURE.value,
                                           _BATCH.value)
        rows = passk.summarize({"builtin_heldout": builtin}, ks)[:-1]
    if _BENCHMARKS.value:
        tok_dir = tokenizer_path(_POLICY.value, spec, _TOKENIZER.value)
        tokenizer = load_tokenizer(tok_dir)
        thinking = None if _THINKING.value == "template" else _THINKING.value == "true"
        prompt_config = PromptConfig(style=_STYLE.value, instruction=_INSTRUCTION.value, enable_thinking=thinking,
                                     max_prompt_tokens=_MAX_PROMPT.value)
        benchmarks = {}
        for item in _BENCHMARKS.value:
            name, sep, path = item.partition("=")
            if not sep:
                raise app.UsageError(f"--benchmark={item!r}: expected NAME=PATH")
            benchmarks[name] = load_examples(SourceConfig(path, format=_FORMAT.value, prompt_field=_PROMPT_FIELD.value,
                                                          answer_field=_ANSWER_FIELD.value))
        with MathVerifier(MathVerifyConfig(answer_pattern=_ANSWER_PATTERN.value)) as verifier:
            bench_rows, info = evaluate.math_benchmarks(
                model, params, tokenizer, benchmarks, prompt_config, verifier, _N.value, ks,
                jax.random.fold_in(rng, 1), max_new_tokens=_MAX_NEW.value, temperature=_TEMPERATURE.value,
                stop_token_ids=stop_token_ids(tokenizer, tok_dir), pad_id=pad_token_id(tokenizer),
                batch_size=_BATCH.value)
        rows = rows + bench_rows
    if not rows:
        raise app.UsageError("nothing to evaluate: give --builtin_problems and/or --benchmark")
    print(passk.format_table(rows))
    for name, i in info.items():
        print(f"{name}: {i['problems']} problems, {i['dropped']} prompts dropped as too long")
    out = _OUT.value or os.path.join(_POLICY.value, "eval.json")
    passk.write_json(out, rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    cli.run(main)
