"""`train_spec(run)`: a typed run config's `TrainSpec`, after loading what it points at.

The one entry callers use: it reads the model's shapes (the HF directory's `config.json`, or the
built-in task model sized for the task's vocabulary) and builds the task (`task_config.make_task`:
the registered task's module imported only now), then validates everything with the pure
`rl/spec.py` (`check_run_config`, `spec_from_config`). Errors are `ConfigError`s naming the key.
"""

from __future__ import annotations

import json
import os

import jax

from pipo_jax import platforms
from pipo_jax.models import hf, qwen3
from pipo_jax.config.sections import ConfigError, ModelConfig, RunConfig
from pipo_jax.config.sections import need as _need
from pipo_jax.rl.spec import TrainSpec, check_run_config, eval_benchmarks, spec_from_config
from pipo_jax.run import warmup
from pipo_jax.run.task_config import make_task
from pipo_jax.tasks.protocol import Task

__all__ = ["ConfigError", "make_model_config", "train_spec"]


def make_model_config(mc: ModelConfig, task: Task | None = None) -> qwen3.Qwen3Config:
    """The model's shapes: the built-in task model (its vocabulary wide enough for `task`'s
    token ids), a preset, or the HF directory's config.json."""
    platform = platforms.of_devices(jax.devices()) if mc.platform == "auto" else mc.platform
    overrides = dict(param_dtype=mc.param_dtype, dtype=mc.dtype, remat=mc.remat, platform=platform,
                     attention_impl=mc.attention_impl, layer_loop=mc.layer_loop,
                     dense_form=mc.dense_form)
    try:
        if mc.path:
            _need(os.path.isdir(mc.path), "model.path", f"{mc.path!r} is not a directory")
            with open(os.path.join(mc.path, "config.json")) as f:
                return hf.config_from_hf(json.load(f), os.path.join(mc.path, "config.json"), **overrides)
        if mc.preset in warmup.TASK_MODEL_LAYERS:
            overrides["num_hidden_layers"] = warmup.TASK_MODEL_LAYERS[mc.preset]
            if task is None:
                return warmup.task_model_config(**overrides)
            return warmup.task_model_config(task.token_id_bound, **overrides)
        _need(False, "model.path", f"model.preset={mc.preset!r} needs the Hugging Face weights: set "
              f"--config.model.path=/path/to/{mc.preset} (no weights are downloaded at run time)")
    except (ValueError, FileNotFoundError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"config.model: {e}") from e


def train_spec(run: RunConfig) -> TrainSpec:
    """Loads the model config and the task the typed run config `run` (`RunConfig.from_config(c)`, the
    entry point's parse of its ml-collections config) points at, validates `run` and returns its
    `TrainSpec`; raises `ConfigError` naming the key. The task reads its own section (`run.task.<name>`)."""
    model = make_model_config(run.model)  # its errors first: a paper preset without model.path says so
    task = make_task(run)
    if not run.model.path and run.model.preset in warmup.TASK_MODEL_LAYERS:
        model = make_model_config(run.model, task)  # the task model's vocabulary covers the task's tokens
    _need(task.token_id_bound <= model.vocab_size, "task.dataset.tokenizer_path" if task.tokenizer is not None else "task",
          f"token ids up to {task.token_id_bound - 1} do not fit the model's vocab_size {model.vocab_size}")
    check_run_config(run, task)
    if run.eval.benchmarks:
        eval_benchmarks(run.eval)  # raises naming the key
    return spec_from_config(run, model, task)
