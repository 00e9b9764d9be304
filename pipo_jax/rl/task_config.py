"""The task a run config names (`config.task`), built through the Task protocol's implementations.

`make_task(config)`: the built-in arithmetic task, a dataset task (math / code) loaded from
`task.path` with its tokenizer and the host reward's settings, or a reasoning-gym dataset
(`task.rg_*`: in the character vocabulary, or with `model.path`'s tokenizer). The one module of the learner
that names concrete tasks (besides `warmup.py`, the built-in task's supervised warm-up); the
rest reach a task through `pipo_jax.tasks.protocol.Task`. Errors are `ConfigError`s naming the key.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from pipo_jax.data import tokenizer as tok_lib
from pipo_jax.data.prompts import DEFAULT_INSTRUCTION, PromptConfig
from pipo_jax.data.sources import DataError, SourceConfig, load_examples
from pipo_jax.rl.sections import ConfigError, choice as _choice
from pipo_jax.tasks import arithmetic, code, dataset
from pipo_jax.tasks import reasoning_gym as rg
from pipo_jax.tasks.math import MathVerifyConfig, resolve_workers
from pipo_jax.tasks.protocol import Task

TASKS = ("arithmetic",) + dataset.KINDS + ("reasoning_gym",)


def make_task(c: ml_collections.ConfigDict) -> Task:
    """The built-in arithmetic task, or a dataset task (math / code) loaded from `task.path`."""
    tc = c.task
    _choice(tc.name, "task.name", TASKS)
    if tc.name in dataset.KINDS:
        return make_dataset_task(c)
    if tc.name == "reasoning_gym":
        return make_reasoning_gym_task(c)
    try:
        return arithmetic.ArithmeticTask(
            min_digits=tc.min_digits, max_digits=tc.max_digits, ops=tuple(tc.ops), answer_format=tc.answer_format,
            reward_mode=tc.reward_mode, feedback_style=tc.feedback_style, heldout_fraction=tc.heldout_fraction,
            split_seed=tc.split_seed,
        )
    except ValueError as e:
        raise ConfigError(f"config.task: {e}") from e


def prompt_config(tc: ml_collections.ConfigDict) -> PromptConfig:
    """The dataset task's `PromptConfig` from `config.task`."""
    _choice(tc.enable_thinking, "task.enable_thinking", ("template", "true", "false"))
    instruction = tc.instruction
    if instruction == "auto":
        instruction = {"math": DEFAULT_INSTRUCTION, "code": dataset.CODE_INSTRUCTION,
                       "reasoning_gym": rg.TEXT_INSTRUCTION}[tc.name]
    thinking = None if tc.enable_thinking == "template" else tc.enable_thinking == "true"
    try:
        return PromptConfig(style=tc.prompt_style, instruction=instruction, enable_thinking=thinking,
                            max_prompt_tokens=tc.max_prompt_tokens, overlong=tc.overlong)
    except ValueError as e:
        raise ConfigError(f"config.task: {e}") from e


def dataset_task_settings_missing(c: ml_collections.ConfigDict) -> list[str]:
    """What a dataset task (math / code) needs and `c` lacks, one `--config...` hint each."""
    tc, out = c.task, []
    if not c.model.path:
        out.append("--config.model.path=/path/to/hf_model (a Hugging Face model and its tokenizer)")
    if not tc.path:
        out.append("--config.task.path=FILE (a JSONL / parquet file or tfds name)")
    if c.log.jit_loop:
        out.append("--config.log.jit_loop=false (the reward is computed on the host)")
    if c.rollout.max_new_tokens < 1:
        out.append("--config.rollout.max_new_tokens=N (the response budget; there is no task default)")
    if c.warmup.enabled:
        out.append("--config.warmup.enabled=false (the warm-up trains the built-in task's model)")
    return out


def make_dataset_task(c: ml_collections.ConfigDict) -> dataset.DatasetTask:
    """Loads `config.task.path` with the tokenizer of `task.tokenizer_path` (default `model.path`)."""
    tc = c.task
    missing = dataset_task_settings_missing(c)
    if missing:  # every one at once, not one per start
        raise ConfigError(f"config: task.name={tc.name!r} needs " + "; ".join(missing))
    if tc.name == "code":
        check_sandbox(tc)
    tok_path = tc.tokenizer_path or c.model.path
    prompts = prompt_config(tc)
    try:
        tokenizer = tok_lib.load_tokenizer(tok_path)
        source = SourceConfig(tc.path, format=tc.format, prompt_field=tc.prompt_field,
                              answer_field=tc.answer_field if tc.name == "math" else None,
                              extra_fields=(tc.tests_field,) if tc.name == "code" else (),
                              split=tc.tfds_split, limit=tc.limit or None,
                              # .get: runs saved before these keys existed load as before
                              data_dir=tc.get("data_dir", "") or None, tfds_download=bool(tc.get("tfds_download")))
        examples = load_examples(source)
        task = dataset.load_dataset_task(
            tc.name, examples, tokenizer, prompts, stop_token_ids=tok_lib.stop_token_ids(tokenizer, tok_path),
            pad_id=tok_lib.pad_token_id(tokenizer), heldout_fraction=tc.heldout_fraction,
            split_seed=tc.split_seed, tests_field=tc.tests_field)
    except (DataError, FileNotFoundError, ValueError, ImportError) as e:  # ImportError: format=tfds without tfds
        raise ConfigError(f"config.task (path={tc.path!r}, tokenizer={tok_path!r}): {e}") from e
    return dataclasses.replace(task, math_config=math_verify_config(tc), sandbox_config=sandbox_config(tc))


def check_verify_keys(tc: ml_collections.ConfigDict) -> None:
    """`task.verify_timeout_s`, `verify_batch_budget_s` > 0 and `verify_workers` >= 0, or a `ConfigError` naming the key."""
    for key in ("verify_timeout_s", "verify_batch_budget_s"):
        if not tc[key] > 0:
            raise ConfigError(f"config.task.{key}: {tc[key]} must be > 0 (seconds)")
    if tc.verify_workers < 0:
        raise ConfigError(f"config.task.verify_workers: {tc.verify_workers} must be >= 0 (0 = one per CPU core)")


def math_verify_config(tc: ml_collections.ConfigDict) -> MathVerifyConfig:
    """The math verifier's settings from `config.task`."""
    check_verify_keys(tc)
    try:
        return MathVerifyConfig(answer_pattern=tc.answer_pattern or None, timeout_s=tc.verify_timeout_s,
                                batch_budget_s=tc.verify_batch_budget_s, num_workers=tc.verify_workers)
    except ValueError as e:
        raise ConfigError(f"config.task: {e}") from e


def sandbox_config(tc: ml_collections.ConfigDict) -> code.SandboxConfig:
    """The code sandbox's settings from `config.task`."""
    check_verify_keys(tc)
    for key in ("sandbox_allow_unconfined", "sandbox_allow_network"):
        if not isinstance(tc[key], bool):
            raise ConfigError(f"config.task.{key}: {tc[key]!r} must be True or False")
    try:
        return code.SandboxConfig(timeout_s=tc.verify_timeout_s, memory_mb=tc.sandbox_memory_mb,
                                  allow_unconfined=tc.sandbox_allow_unconfined,
                                  allow_network=tc.sandbox_allow_network,
                                  max_workers=resolve_workers(tc.verify_workers))
    except ValueError as e:
        raise ConfigError(f"config.task: {e}") from e


def check_sandbox(tc: ml_collections.ConfigDict) -> None:
    """The code sandbox can run generated programs here under `config.task`'s settings; else a
    `ConfigError` naming the key that would allow it (before any file is read)."""
    config = sandbox_config(tc)
    for key, check in (("sandbox_allow_unconfined", code.check_confinement),
                       ("sandbox_allow_network", code.check_network_isolation)):
        try:
            check(config)
        except code.SandboxUnavailable as e:
            raise ConfigError(f"config.task.{key}: {e}") from e
    try:
        code.check_process_bound(config)
    except code.SandboxUnavailable as e:
        raise ConfigError(f"config.task: {e}") from e


def make_reasoning_gym_task(c: ml_collections.ConfigDict):
    """A reasoning-gym dataset (`task.rg_*`): in the character vocabulary for the task model, or
    rendered with `model.path`'s tokenizer and chat template (`task.tokenizer_path` overrides)."""
    tc = c.task
    if not tc.rg_dataset:
        raise ConfigError("config.task.rg_dataset: name a reasoning-gym dataset (e.g. chain_sum, gcd, spell_backward)")
    try:
        rg.import_reasoning_gym()
    except ImportError as e:
        raise ConfigError(f"config.task.name: {e}") from e
    try:
        source = rg.generate_entries(tc.rg_dataset, rg.parse_config(tc.rg_config), tc.rg_size, tc.split_seed,
                                     tc.heldout_fraction)
    except ValueError as e:
        raise ConfigError(f"config.task: {e}") from e
    if not c.model.path:
        if c.algorithm in ("sdpo", "vpd"):
            raise ConfigError(f"config.algorithm: {c.algorithm} needs teacher contexts, which the reasoning_gym task "
                              "has only with model.path (a tokenizer); use ppo, grpo, gspo or dapo")
        try:
            return rg.char_task(tc.rg_dataset, source, prompt_form=tc.rg_prompt, max_prompt_chars=tc.rg_max_prompt_chars,
                                max_answer_chars=tc.rg_max_answer_chars, overlong=tc.rg_overlong,
                                workers=resolve_workers(tc.verify_workers))
        except ValueError as e:
            raise ConfigError(f"config.task: {e}") from e
    missing = [hint for hint in dataset_task_settings_missing(c) if "task.path" not in hint]
    if missing:
        raise ConfigError(f"config: task.name='reasoning_gym' with model.path needs " + "; ".join(missing))
    tok_path = tc.tokenizer_path or c.model.path
    try:
        tokenizer = tok_lib.load_tokenizer(tok_path)
        return rg.text_task(tc.rg_dataset, source, tokenizer, prompt_config(tc),
                            stop_token_ids=tok_lib.stop_token_ids(tokenizer, tok_path),
                            pad_id=tok_lib.pad_token_id(tokenizer), workers=resolve_workers(tc.verify_workers))
    except (DataError, FileNotFoundError, ValueError) as e:
        raise ConfigError(f"config.task (rg_dataset={tc.rg_dataset!r}, tokenizer={tok_path!r}): {e}") from e
