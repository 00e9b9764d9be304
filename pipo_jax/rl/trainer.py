"""`train(config, workdir)`: the main job. Base model (HF weights, or the built-in task's
supervised warm-up), then RL iterations in jitted `lax.scan` chunks (or the host loop),
with held-out evaluation, metrics, orbax checkpoints / exact resume and a final HF export.
On several devices or processes the same job runs sharded over `config.mesh`
(`pipo_jax.rl.placement`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from pipo_jax.models import hf, qwen3
from pipo_jax.parallel.distributed import initialize_distributed
from pipo_jax.rl import loop, observe, rollout, warmup
from pipo_jax.rl.checkpoint import Checkpointer
from pipo_jax.rl.placement import Placement, placement_from_config
from pipo_jax.rl.spec import TrainSpec, train_spec
from pipo_jax.rl.state import TrainState

log = logging.getLogger(__name__)

EVAL_SEED = 1234  # the held-out problems are the same at every evaluation


def heldout_accuracy(spec: TrainSpec, params, n: int, where: Placement | None = None) -> float:
    """Greedy exact-match accuracy on `n` fixed held-out problems."""
    return (where or Placement()).heldout_accuracy(spec, params, n, jax.random.PRNGKey(EVAL_SEED))


def base_params(spec: TrainSpec, config: ml_collections.ConfigDict, logger_rows: list) -> Any:
    """The RL starting point: HF weights, the supervised warm-up, or a random init."""
    if spec.model_path:
        _, params = hf.load(spec.model_path, dtype=spec.model.param_dtype, compute_dtype=spec.model.dtype)
        return params
    if config.warmup.enabled:
        params, m = warmup.warmup(spec.model, spec.task, steps=config.warmup.steps, batch=config.warmup.batch,
                                  lr=config.warmup.lr, seed=config.seed, target_accuracy=config.warmup.target_accuracy,
                                  eval_n=config.eval.n)
        logger_rows.append({"warmup_steps": m["steps_run"], "warmup_accuracy": m["final_accuracy"],
                            "warmup_time_s": m["wall_time_s"]})
        log.info("warm-up: %d steps, held-out accuracy %.3f, %.1fs", m["steps_run"], m["final_accuracy"],
                 m["wall_time_s"])
        return params
    return qwen3.init_params(spec.model, jax.random.PRNGKey(config.seed))


def _chunk_length(step: int, config: ml_collections.ConfigDict) -> int:
    """Iterations until the next logging, evaluation or checkpoint point."""
    stops = [config.iterations, (step // config.log.every + 1) * config.log.every]
    for every in (config.eval.every, config.checkpoint.every):
        if every:
            stops.append((step // every + 1) * every)
    return min(s for s in stops if s > step) - step


def run_iterations(spec: TrainSpec, state: TrainState, n: int, jit_loop: bool,
                   reward_fn: loop.HostReward | None = None,
                   where: Placement | None = None) -> tuple[TrainState, dict[str, np.ndarray]]:
    """`n` iterations: one jitted scan chunk, or the host loop; metrics stacked `[n]`."""
    return (where or Placement()).run(spec, state, n, jit_loop, reward_fn or host_task_reward(spec))


def host_task_reward(spec: TrainSpec) -> loop.HostReward:
    """The built-in task's reward as a host (numpy) function, for the host loop."""
    return lambda r: np.asarray(rollout.task_rewards(spec, r))


def train(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Runs `config` in `workdir`; returns a summary (initial/final held-out accuracy, paths).

    Multi-process: `initialize_distributed(config.distributed)` joins the processes first
    (a no-op for a single process); every process runs this function on the same
    (shared) `workdir`, and only process 0 writes logs, plots, the summary and the export.
    """
    initialize_distributed(config.get("distributed"))
    spec = train_spec(config)
    where = placement_from_config(config)
    main = where.is_main_process
    if main:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "config.json"), "w") as f:
            f.write(config.to_json_best_effort(indent=2))
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), keep=config.checkpoint.keep)
    resume_step = ckpt.latest_step() if config.checkpoint.resume else None

    pre_rows: list[dict] = []
    if resume_step is not None:
        state = where.restore(ckpt, spec, resume_step)
        log.info("resumed from %s at iteration %d", ckpt.directory, resume_step)
    else:
        state = where.init_state(spec, base_params(spec, config, pre_rows), config.seed)
    step = int(state.step)

    logger = observe.RunLogger(workdir, total=config.iterations, tensorboard=config.log.tensorboard,
                               wandb=config.log.wandb, wandb_project=config.log.wandb_project,
                               progress=config.log.progress, run_config=config.to_dict(), start_step=step,
                               enabled=main)
    summary: dict[str, Any] = {"workdir": workdir, "resumed_from": resume_step, "devices": where.describe()}
    if step == 0:
        acc0 = heldout_accuracy(spec, state.params, config.eval.n, where)
        logger.log(0, dict(pre_rows[0] if pre_rows else {}, heldout_accuracy=acc0))
        summary["initial_accuracy"] = acc0
    try:
        while step < config.iterations:
            n = _chunk_length(step, config)
            t0 = time.perf_counter()
            state, metrics = run_iterations(spec, state, n, config.log.jit_loop, where=where)
            jax.block_until_ready(state.params)
            dt = time.perf_counter() - t0
            extra = {"tokens_per_s": float(np.sum(metrics["tokens"])) / dt, "iteration_time_s": dt / n}
            step += n
            if config.eval.every and step % config.eval.every == 0 or step == config.iterations:
                extra["heldout_accuracy"] = heldout_accuracy(spec, state.params, config.eval.n, where)
            logger.log_many(step - n, metrics, extra)
            if config.checkpoint.every and step % config.checkpoint.every == 0 and step < config.iterations:
                ckpt.save(step, state)
        ckpt.save(step, state)
        ckpt.wait()
        summary["final_accuracy"] = heldout_accuracy(spec, state.params, config.eval.n, where)
        if config.checkpoint.export_hf:
            export = os.path.join(workdir, "hf_export")
            params = where.to_host(state.params)  # every process takes part in the gather
            if main:
                hf.save(export, spec.model, params)
            summary["hf_export"] = export
    finally:
        ckpt.close()
        summary["plots"] = logger.close(plots=config.log.plots)
    summary["state"] = state
    if main:
        with open(os.path.join(workdir, "summary.json"), "w") as f:
            json.dump({k: v for k, v in summary.items() if k != "state"}, f, indent=2)
    return summary


def spec_summary(spec: TrainSpec) -> dict:
    """The spec as plain data (for logs)."""
    d = dataclasses.asdict(spec)
    d["model"] = dataclasses.asdict(spec.model)
    d["task"] = dataclasses.asdict(spec.task)
    return d
