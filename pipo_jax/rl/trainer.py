"""`train(config, workdir)`: the main job. Base model (HF weights, or the built-in task's
supervised warm-up), then RL iterations in jitted `lax.scan` chunks (or the host loop),
with held-out evaluation, metrics, orbax checkpoints / exact resume and a final HF export.
On several devices or processes the same job runs sharded over `config.mesh`
(`pipo_jax.rl.placement`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from pipo_jax.data.sources import SourceConfig, load_examples
from pipo_jax.models import hf, qwen3
from pipo_jax.parallel import mesh_batch_shards
from pipo_jax.parallel.distributed import initialize_distributed
from pipo_jax.rl import evaluate, loop, observe, rollout, steps, warmup
from pipo_jax.rl.checkpoint import Checkpointer, saved_steps
from pipo_jax.rl.placement import Placement, placement_from_config
from pipo_jax.rl.spec import ConfigError, TrainSpec, eval_benchmarks, run_iterations_of, train_spec
from pipo_jax.rl.state import TrainState

log = logging.getLogger(__name__)

EVAL_SEED = 1234  # the held-out problems are the same at every evaluation


class Evaluation:
    """The trainer's evaluation: held-out greedy accuracy, plus `config.eval.benchmarks`
    (math tasks: pass@1 / pass@k through `evaluate.math_benchmarks`, as experiments/eval.py)."""

    def __init__(self, spec: TrainSpec, config: ml_collections.ConfigDict, where: Placement,
                 reward: rollout.TaskReward | None):
        self.spec, self.config, self.where, self.reward = spec, config, where, reward
        self.benchmarks, self.ks = {}, ()
        if config.eval.benchmarks:
            paths, self.ks = eval_benchmarks(config.eval)
            tc = config.task
            self.benchmarks = {name: load_examples(SourceConfig(path, prompt_field=tc.prompt_field,
                                                                answer_field=tc.answer_field))
                               for name, path in paths.items()}

    def __call__(self, params, step: int) -> dict[str, float]:
        """Greedy accuracy on `eval.n` fixed held-out problems: teacher-forced for a task with
        exact answers (`rl/teacher_forcing.py`), else decoded and scored on host-gathered params.
        SDPO / VPD: also the accuracy on the same problems shown each of the task's teacher
        contexts (`teacher_accuracy_<kind>`, e.g. a correct sibling's solution or the feedback on
        a wrong response). Then the benchmarks' pass@k."""
        spec, ec = self.spec, self.config.eval
        key = jax.random.PRNGKey(EVAL_SEED)
        if spec.task.exact_answers:
            out = {"heldout_accuracy": self.where.reference_accuracy(spec, params, ec.n, key)}
            if spec.uses_teacher:
                kinds = jax.eval_shape(lambda: spec.task.teacher_eval_problems(spec.task.prompt_table(), ec.n, key))
                for kind in kinds:
                    out[f"teacher_accuracy_{kind}"] = self.where.reference_accuracy(spec, params, ec.n, key, kind)
            return out
        params = self.where.to_host(params)  # gathered once for every evaluation below
        out = {"heldout_accuracy": evaluate.decoded_heldout_accuracy(spec, params, self.reward.scorer, ec.n)}
        if self.benchmarks:
            rows, _ = evaluate.math_benchmarks(
                spec.model, params, spec.task.tokenizer, self.benchmarks,
                spec.task.prompt_config, self.reward.scorer.verifier, ec.samples, self.ks,
                jax.random.fold_in(jax.random.PRNGKey(EVAL_SEED), step), max_new_tokens=spec.rollout.response_len,
                temperature=ec.temperature, stop_token_ids=spec.task.stop_token_ids, pad_id=spec.task.pad_id,
                batch_size=ec.batch_size)
            for row in rows:
                out.update({f"{row.name}_pass@{k}": v for k, v in row.pass_at.items()})
        return out


def warmup_kwargs(config: ml_collections.ConfigDict, seed: int) -> dict[str, Any]:
    """`warmup.warmup` keyword arguments of `config.warmup` for `seed`."""
    w = config.warmup
    return dict(steps=w.steps, batch=w.batch, lr=w.lr, seed=seed, target_accuracy=w.target_accuracy,
                eval_n=config.eval.n, mistake_rate=w.mistake_rate, context_fraction=w.context_fraction)


def base_params(spec: TrainSpec, config: ml_collections.ConfigDict, logger_rows: list) -> Any:
    """The RL starting point: HF weights, the supervised warm-up, or a random init."""
    if spec.model_path:
        _, params = hf.load(spec.model_path, dtype=spec.model.param_dtype, compute_dtype=spec.model.dtype)
        return params
    if config.warmup.enabled:
        params, m = warmup.warmup(spec.model, spec.task, **warmup_kwargs(config, config.seed))
        logger_rows.append({"warmup_steps": m["steps_run"], "warmup_accuracy": m["final_accuracy"],
                            "warmup_teacher_solution_accuracy": m["final_teacher_solution_accuracy"],
                            "warmup_teacher_feedback_accuracy": m["final_teacher_feedback_accuracy"],
                            "warmup_time_s": m["wall_time_s"]})
        log.info("warm-up: %d steps, held-out accuracy %.3f (teacher with a solution %.3f, with feedback %.3f), "
                 "%.1fs", m["steps_run"], m["final_accuracy"], m["final_teacher_solution_accuracy"],
                 m["final_teacher_feedback_accuracy"], m["wall_time_s"])
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
    if reward_fn is not None or jit_loop:
        return (where or Placement()).run(spec, state, n, jit_loop, reward_fn)
    reward_fn = host_task_reward(spec)
    try:
        return (where or Placement()).run(spec, state, n, jit_loop, reward_fn)
    finally:
        reward_fn.close()


def host_task_reward(spec: TrainSpec) -> rollout.TaskReward:
    """The task's reward on the host, for the host loop (`Task.scorer()`: the built-in task's
    JAX reward, a math verifier's worker processes, a code sandbox; with SDPO / VPD on a
    host-reward task it also builds the teacher prompts). `close()` it."""
    return rollout.TaskReward(spec, spec.task.scorer())


def export_tokenizer(spec: TrainSpec, config: ml_collections.ConfigDict, export: str) -> None:
    """A dataset run's tokenizer files (and the source's generation_config.json, whose eos ids
    end responses) into the HF export, so it loads as a model and tokenizer directory."""
    spec.task.tokenizer.save_pretrained(export)
    source = os.path.join(config.task.tokenizer_path or config.model.path, "generation_config.json")
    if os.path.exists(source):
        shutil.copyfile(source, os.path.join(export, "generation_config.json"))


def train(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Runs `config` in `workdir`; returns a summary (initial/final held-out accuracy, paths).

    Multi-process: `initialize_distributed(config.distributed)` joins the processes first
    (a no-op for a single process); every process runs this function on the same
    (shared) `workdir`, and only process 0 writes logs, plots, the summary and the export.
    """
    initialize_distributed(config.get("distributed"))
    spec = train_spec(config)
    if config.task.epochs:
        config = config.copy_and_resolve_references()
        config.iterations = run_iterations_of(spec, config)
        log.info("task.epochs=%g over %d training rows: %d iterations", config.task.epochs,
                 len(spec.task.train_rows_np), config.iterations)
    where = placement_from_config(config)
    if where.mesh is not None:  # every device computes whole micro-batches of its own rows
        steps.check_micro_batching(spec, mesh_batch_shards(where.mesh, where.rules))
    if not spec.generator.in_program and where.mesh is not None:
        raise ConfigError("config.rollout.engine: the slots engine runs on one device; use rollout.engine=sampler "
                          "on a mesh (or --config.mesh.enabled=false)")
    if not spec.task.device_reward and spec.uses_teacher and where.mesh is not None:
        raise ConfigError(f"config.mesh.enabled: SDPO / VPD on the {spec.task.name} task build teacher prompts on "
                          "one host; run them on one device (--config.mesh.enabled=false)")
    main = where.is_main_process
    # Nothing is written into the workdir before the config is validated, the evaluation
    # files are read and the resume decision is made: a refused run leaves it as it was.
    ckpt_dir = os.path.join(workdir, "checkpoints")
    existing = saved_steps(ckpt_dir)
    if not config.checkpoint.resume and existing:
        raise ConfigError(f"config.checkpoint.resume: false, but {os.path.abspath(ckpt_dir)} holds checkpoints "
                          f"{existing}: use a new --workdir, delete them, or resume")
    evaluation = Evaluation(spec, config, where, None)
    if main:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "config.json"), "w") as f:
            f.write(config.to_json_best_effort(indent=2))
    ckpt = Checkpointer(ckpt_dir, keep=config.checkpoint.keep)

    pre_rows: list[dict] = []
    resume_step = None
    try:
        if existing:
            state = where.restore(ckpt, spec)  # the newest checkpoint that reads
            resume_step = int(state.step)
            log.info("resumed from %s at iteration %d", ckpt.directory, resume_step)
        else:
            state = where.init_state(spec, base_params(spec, config, pre_rows), config.seed)
    except BaseException:
        ckpt.close()
        raise
    step = int(state.step)

    reward = host_task_reward(spec)
    evaluation.reward = reward
    logger = None
    summary: dict[str, Any] = {"workdir": workdir, "resumed_from": resume_step, "devices": where.describe()}
    try:
        logger = observe.RunLogger(workdir, total=config.iterations, tensorboard=config.log.tensorboard,
                                   wandb=config.log.wandb, wandb_project=config.log.wandb_project,
                                   progress=config.log.progress, run_config=config.to_dict(), start_step=step,
                                   enabled=main)
        if step == 0:
            scores = evaluation(state.params, 0)
            logger.log(0, dict(pre_rows[0] if pre_rows else {}, **scores))
            summary["initial_accuracy"] = scores["heldout_accuracy"]
        while step < config.iterations:
            n = _chunk_length(step, config)
            t0 = time.perf_counter()
            state, metrics = run_iterations(spec, state, n, config.log.jit_loop, reward, where=where)
            jax.block_until_ready(state.params)
            dt = time.perf_counter() - t0
            # One chunk is timed as a whole: each iteration gets the chunk's mean time.
            metrics["tokens_per_s"] = np.asarray(metrics["tokens"], np.float64) / (dt / n)
            extra = {"iteration_time_s": dt / n}
            step += n
            if config.eval.every and step % config.eval.every == 0 or step == config.iterations:
                extra.update(evaluation(state.params, step))
            logger.log_many(step - n, metrics, extra)
            if config.checkpoint.every and step % config.checkpoint.every == 0 and step < config.iterations:
                ckpt.save(step, state)
        if step not in ckpt.all_steps():  # a finished run resumed again has it already
            ckpt.save(step, state)
        ckpt.wait()
        final = evaluation(state.params, step)
        summary["final_accuracy"] = final["heldout_accuracy"]
        summary["final_eval"] = final
        if config.checkpoint.export_hf:
            export = os.path.join(workdir, "hf_export")
            params = where.to_host(state.params)  # every process takes part in the gather
            if main:
                hf.save(export, spec.model, params)
                if spec.task.tokenizer is not None:
                    export_tokenizer(spec, config, export)
            summary["hf_export"] = export
    finally:
        ckpt.close()
        reward.close()
        summary["plots"] = logger.close(plots=config.log.plots) if logger is not None else []
    summary["state"] = state
    if main:
        with open(os.path.join(workdir, "summary.json"), "w") as f:
            json.dump({k: v for k, v in summary.items() if k != "state"}, f, indent=2)
    return summary

