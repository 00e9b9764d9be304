"""`train(run, workdir)`: the main job of a typed run config (`config/sections.py:RunConfig`). Base model
(HF weights, or the built-in task's supervised warm-up), then RL iterations in jitted `lax.scan` chunks
(or the host loop), with held-out evaluation, metrics, orbax checkpoints / exact resume and a final HF
export.
On several devices or processes the same job runs sharded over `config.mesh`
(`pipo_jax.run.placement`). `TrainingRun` is one run as the loop reads it (config, spec, placement,
workdir); the ml-collections config stays with the entry point that parsed it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import sys
import time
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from pipo_jax.data.sources import SourceConfig
from pipo_jax.models import hf, qwen3
from pipo_jax.parallel import mesh_batch_shards
from pipo_jax.parallel.distributed import initialize_distributed
from pipo_jax.rl import loop, rollout, steps
from pipo_jax.config import schema
from pipo_jax.config.sections import RunConfig
from pipo_jax.rl.spec import ConfigError, TrainSpec, eval_benchmarks, run_iterations_of, spec_from_config
from pipo_jax.rl.state import TrainState
from pipo_jax.run import atomic, compile_cache, evaluate
from pipo_jax.run import export as export_lib
from pipo_jax.run import memory, metric_keys, observe, sharded_steps, teacher_forcing, warmup
from pipo_jax.run import workdir as workdir_lib
from pipo_jax.run.checkpoint import Checkpointer, kept_checkpoints, saved_steps
from pipo_jax.run.heartbeat import Heartbeat
from pipo_jax.run.placement import Placement, placement_from_config
from pipo_jax.run.preemption import RunInterrupted, StopRequests
from pipo_jax.run.setup import train_spec
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.tasks.protocol import HostScorer

log = logging.getLogger(__name__)

EVAL_SEED = 1234  # the held-out problems are the same at every evaluation
PASS_SEED = 4321  # the responses sampled for heldout_pass_at_1: a key of their own, not the training stream


def device_sampled_rewards(spec: TrainSpec, params, n: int, samples: int) -> jax.Array:
    """Rewards `[m, samples]` by the task's JAX reward (`device_reward`): `samples` responses to each of
    the `n` held-out problems of the greedy accuracy (`EVAL_SEED`; m < n where the held-out split is
    smaller), sampled as the rollout samples (`rollout.temperature` / `top_k` / `top_p` /
    `max_new_tokens`) with `PASS_SEED`. Traceable: experiments/compare.py vmaps it over seeds."""
    r = spec.rollout
    sampling = SamplingParams(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p, max_new_tokens=r.max_new_tokens)
    return teacher_forcing.sampled_rewards(spec.model, params, spec.task, rollout.prompt_table(spec), n, samples,
                                           jax.random.PRNGKey(EVAL_SEED), jax.random.PRNGKey(PASS_SEED), sampling)


@dataclasses.dataclass(frozen=True)
class EvalBenchmarks:
    """`config.eval.benchmarks` loaded (math tasks): {name: its rows} and the pass@k's `ks`; read before
    the run writes anything, so a missing or malformed file is one line naming it."""

    rows: dict[str, list]
    ks: tuple[int, ...]

    @classmethod
    def load(cls, config: RunConfig) -> EvalBenchmarks:
        if not config.eval.benchmarks:
            return cls({}, ())
        paths, ks = eval_benchmarks(config.eval)
        tc = config.task
        return cls({name: evaluate.load_math_benchmark(
            SourceConfig(path, prompt_field=tc.dataset.prompt_field, answer_field=tc.math.answer_field))
                    for name, path in paths.items()}, ks)


class Evaluation:
    """The trainer's evaluation: held-out greedy accuracy and sampled pass@1 on `eval.n` fixed
    problems, plus `config.eval.benchmarks` (math tasks: pass@1 / pass@k through
    `evaluate.math_benchmarks`, as experiments/eval.py). `scorer`: the task's host scorer (what a task
    without `device_reward` is scored by; the trainer's `TaskReward.scorer`)."""

    def __init__(self, spec: TrainSpec, config: RunConfig, where: Placement, scorer: HostScorer,
                 benchmarks: EvalBenchmarks):
        self.spec, self.config, self.where, self.scorer = spec, config, where, scorer
        self.problems = heldout_count(spec, config.eval.n)  # eval.n, or a smaller held-out split's size
        self.benchmarks, self.ks = benchmarks.rows, benchmarks.ks

    def __call__(self, params, step: int) -> dict[str, float]:
        """Greedy accuracy on `eval.n` fixed held-out problems: teacher-forced for a task with
        exact answers (`run/teacher_forcing.py`), decoded and scored by the JAX reward in one
        program for another `device_reward` task, else decoded and scored on host-gathered params.
        SDPO / VPD: also the accuracy on the same problems shown each of the task's teacher
        contexts (`teacher_accuracy_<kind>`, e.g. a correct sibling's solution or the feedback on
        a wrong response). With `eval.heldout_samples > 0`, `heldout_pass_at_1`: that many responses per
        problem sampled as the rollout samples (`pass_at_1`). Then the benchmarks' pass@k. Nothing
        here reads or advances the training state's key."""
        spec, ec = self.spec, self.config.eval
        key = jax.random.PRNGKey(EVAL_SEED)
        if spec.task.capabilities.exact_answers or spec.task.capabilities.device_reward:
            out = {"heldout_accuracy": self.where.reference_accuracy(spec, params, ec.n, key)}
            if spec.uses_teacher:
                kinds = jax.eval_shape(lambda: spec.task.teacher_eval_problems(spec.task.prompt_table(), ec.n, key))
                for kind in kinds:
                    out[f"teacher_accuracy_{kind}"] = self.where.reference_accuracy(spec, params, ec.n, key, kind)
            if ec.heldout_samples and spec.task.capabilities.device_reward:
                out["heldout_pass_at_1"] = self.pass_at_1(params)
            return out
        params = self.where.to_host(params)  # gathered once for every evaluation below
        out = {"heldout_accuracy": evaluate.decoded_heldout_accuracy(spec, params, self.scorer, ec.n)}
        if ec.heldout_samples:
            out["heldout_pass_at_1"] = self.pass_at_1(params)
        if self.benchmarks:
            tokenizer, prompt_config, verifier = self.scorer.benchmark_inputs()
            rows, info = evaluate.math_benchmarks(
                spec.model, params, tokenizer, self.benchmarks, prompt_config, verifier, ec.samples, self.ks,
                jax.random.fold_in(jax.random.PRNGKey(EVAL_SEED), step),
                evaluate.task_sampling(spec, temperature=ec.temperature), batch_size=ec.batch_size)
            for row in rows:
                out.update({f"{row.name}_pass_at_{k}": v for k, v in row.pass_at.items()})
            out.update({f"{name}_unscored_count": i["unscored"] for name, i in info.items()})  # past the verify budget
        return out

    def sampled_rewards(self, params) -> np.ndarray:
        """Rewards `[eval.n, eval.heldout_samples]` of responses sampled as the rollout samples
        (`rollout.temperature` / `top_k` / `top_p` / `max_new_tokens`, key `PASS_SEED`) to the same
        held-out problems as the greedy accuracy: in one program by the JAX reward for a
        `device_reward` task, else decoded in batches of `eval.batch_size` rows and scored by the
        host scorer (on the problems `decoded_heldout_accuracy` draws)."""
        spec, ec = self.spec, self.config.eval
        if spec.task.capabilities.device_reward:
            host = self.where.mesh is not None  # one device: the program is small (eval.n x samples rows)
            return np.asarray(device_sampled_rewards(spec, self.where.to_host(params) if host else params, ec.n,
                                                     ec.heldout_samples))
        return evaluate.sampled_heldout_rewards(spec, params, self.scorer, ec.n, ec.heldout_samples,
                                                jax.random.PRNGKey(PASS_SEED), batch_size=ec.batch_size)

    def pass_at_1(self, params) -> float:
        """`heldout_pass_at_1`: the unbiased pass@1 (mean success, reward >= 1) of `sampled_rewards`."""
        return teacher_forcing.pass_and_mixed(self.sampled_rewards(params))[0]


WARMUP_CHECKPOINTS = workdir_lib.WARMUP_CHECKPOINTS_NAME


class WarmupCheckpoints:
    """The warm-up's own checkpoints (`<workdir>/warmup_checkpoints`): its progress every
    `checkpoint.warmup_every` steps and on a stop request, so a run killed in the warm-up
    continues it exactly; removed once the RL state of step 0 is saved."""

    def __init__(self, workdir: str, spec: TrainSpec, config: RunConfig, stop: StopRequests):
        self.directory = os.path.join(workdir, WARMUP_CHECKPOINTS)
        self.every, self.stop = config.checkpoint.warmup_every, stop
        self.settings = warmup.WarmupSettings.from_config(config, spec.task)
        self.template = warmup.abstract_progress(spec.model, self.settings)
        self.template_model = spec.model
        self._ckpt: Checkpointer | None = None
        self._last = 0

    def restore(self) -> warmup.WarmupProgress | None:
        """The newest readable progress (None: none saved, or none that fits this warm-up)."""
        if not saved_steps(self.directory):
            return None
        try:
            progress = self._checkpointer().restore(self.template)
        except Exception as e:  # noqa: BLE001 - any read failure: the warm-up starts over, said in one line
            progress = self._restore_legacy()
            if progress is None:
                log.warning("warm-up checkpoints in %s unreadable (%s): the warm-up starts over", self.directory,
                            str(e).splitlines()[0][:200])
                return None
        self._last = int(progress.done)
        log.info("warm-up resumed at step %d from %s", self._last, self.directory)
        return progress

    def _restore_legacy(self) -> warmup.WarmupProgress | None:
        """A progress saved before the sampled check (`evals_4e`), in the current layout; None if none reads."""
        legacy = warmup.abstract_progress(self.template_model, self.settings, legacy=True)
        try:
            progress = warmup.from_legacy(self._checkpointer().restore(legacy))
        except Exception:  # noqa: BLE001 - unreadable in either layout: the caller says why
            return None
        log.warning("warm-up checkpoint in %s predates the sampled check: its earlier checks have no pass@1 "
                    "(NaN), the next check measures it", self.directory)
        return progress

    def _checkpointer(self) -> Checkpointer:
        if self._ckpt is None:
            self._ckpt = Checkpointer(self.directory, keep=1)
        return self._ckpt

    def after_chunk(self, progress: warmup.WarmupProgress) -> None:
        done = int(progress.done)
        if self.stop.requested or (self.every and done // self.every > self._last // self.every):
            self._checkpointer().save(done, progress)
            self._last = done
        if self.stop.requested:
            self._checkpointer().wait()
            raise RunInterrupted(self.stop.requested, f"warm-up step {done}", self.directory)

    def remove(self) -> None:
        """Drops the warm-up checkpoints (the RL checkpoint of step 0 holds their result)."""
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def close(self) -> None:
        if self._ckpt is not None:
            self._ckpt.close()
            self._ckpt = None


def base_params(spec: TrainSpec, config: RunConfig, logger_rows: list,
                warmup_checkpoints: WarmupCheckpoints | None = None, hb: Heartbeat | None = None) -> Any:
    """The RL starting point: HF weights, the supervised warm-up, or a random init."""
    hb = hb or Heartbeat(0, quiet=True)
    if spec.model_path:
        with hb.phase("loading the model", announce=f"loading the model's weights from {spec.model_path}"):
            _, params = hf.load(spec.model_path, dtype=spec.model.param_dtype, compute_dtype=spec.model.dtype)
        return params
    if config.warmup.enabled:
        wc = warmup_checkpoints
        settings = warmup.WarmupSettings.from_config(config, spec.task) if wc is None else wc.settings
        with hb.phase("in the warm-up", announce=f"warm-up: up to {settings.steps} supervised steps, a check every "
                      f"{settings.eval_every} (its programs compile first)", report_builds=True):
            params, m = warmup.warmup(spec.model, spec.task, settings, seed=config.seed,
                                      resume=None if wc is None else wc.restore(),
                                      after_chunk=None if wc is None else wc.after_chunk)
        row = {"warmup_steps": m["steps_run"], "warmup_accuracy": m["final_accuracy"],
               **_warmup_target_row(m),
               "warmup_teacher_solution_accuracy": m["final_teacher_solution_accuracy"],
               "warmup_teacher_feedback_accuracy": m["final_teacher_feedback_accuracy"],
               "warmup_time_s": m["wall_time_s"]}
        sampled = ""
        if m["check_prompts"]:
            row.update({"warmup_pass_at_1": m["final_pass_at_1"], "warmup_mixed_groups_frac": m["final_mixed_groups"]})
            sampled = (f", sampled pass@1 {m['final_pass_at_1']:.3f} and mixed groups {m['final_mixed_groups']:.3f} "
                       f"({m['check_prompts']} of its held-out prompts x {m['check_samples']})")
        logger_rows.append(row)
        log.info("warm-up: %d steps, greedy held-out accuracy %.3f on the warm-up's own %d seed-drawn problems "
                 "(not the trainer's eval set)%s (teacher with a solution %.3f, with feedback %.3f), %.1fs",
                 m["steps_run"], m["final_accuracy"], m["check_problems"], sampled,
                 m["final_teacher_solution_accuracy"], m["final_teacher_feedback_accuracy"], m["wall_time_s"])
        missed = warmup.miss_line(m, spec.task.name)
        if missed:
            log.warning("%s", missed)
        return params
    return qwen3.init_params(spec.model, jax.random.PRNGKey(config.seed))


def _warmup_target_row(m: dict[str, Any]) -> dict[str, float]:
    """The warm-up's targets for metrics.jsonl's row 0: `warmup_target_met` (1 / 0) and each target set
    (`warmup_target_accuracy`, ...); nothing when no target was set."""
    if m["target_met"] is None:
        return {}
    return {"warmup_target_met": float(m["target_met"]),
            **{WARMUP_TARGET_KEYS[name]: target for name, (target, _) in m["targets"].items()}}


def _chunk_length(step: int, config: RunConfig) -> int:
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


def _abstract_state(tree: dict[str, Any], spec: TrainSpec, keys: Any) -> Any:
    """Shapes and dtypes of the `TrainState` of the config `tree` (`workdir.stored_form`; built like
    `spec`, but loading the model / task again when one of `keys` is theirs); None if it is not valid."""
    try:
        run = RunConfig.from_config(tree)
        if any(k.startswith(("model.", "task.")) for k in keys):
            other = train_spec(run)
        else:
            other = spec_from_config(run, spec.model, spec.task)
        state = sharded_steps.abstract_train_state(other)
    except Exception:  # noqa: BLE001 - an invalid combination tells nothing about shapes
        return None
    return jax.tree.structure(state), [(x.shape, x.dtype) for x in jax.tree.leaves(state)]


def _with_values(tree: dict[str, Any], values: dict[str, Any]) -> dict[str, Any] | None:
    """A copy of the config `tree` with `values` (`{"pipo.window": 8}`) set; None where one cannot be set."""
    out = schema.json_copy(tree)
    for key, value in values.items():
        node, leaf = schema.holder_of(out, key)
        if node is None:
            return None
        node[leaf] = value
    return out


def check_resume_config(run: RunConfig, spec: TrainSpec, stored: dict[str, Any],
                        checkpoint_dir: str) -> dict[str, tuple[Any, Any]]:
    """Compares `run` with the `stored` config of the run it resumes (flat); returns the changes.

    A change of the saved state's shapes is refused naming the keys that cause it; any other
    change of a key outside `workdir.FREE_PREFIXES` needs `checkpoint.allow_config_change`.
    """
    tree = workdir_lib.stored_form(run)
    flat = workdir_lib.flat_config(tree)
    added, removed = workdir_lib.schema_drift(stored, flat)
    if added or removed:
        log.warning("the stored config predates this code: keys added %s (their values apply from now), "
                    "removed %s", added or "none", removed or "none")
    changes = workdir_lib.config_changes(stored, flat)
    if not changes:
        return changes
    new_shapes = _abstract_state(tree, spec, ())
    old_shapes = _abstract_state(_with_values(tree, {k: v[0] for k, v in changes.items()}) or tree, spec, changes)
    if old_shapes is not None and old_shapes != new_shapes:
        shape_keys = []
        for key in changes:
            single = _with_values(tree, {key: changes[key][0]})
            if single is not None and _abstract_state(single, spec, (key,)) not in (None, new_shapes):
                shape_keys.append(key)
        workdir_lib.refuse_shape_changes(shape_keys or [k for k in changes if not workdir_lib.is_free(k)],
                                         changes, checkpoint_dir)
    bound = [k for k in changes if not workdir_lib.is_free(k)]
    if bound and not run.checkpoint.allow_config_change:
        raise ConfigError(f"config.checkpoint.allow_config_change: resuming with changed settings "
                          f"({workdir_lib.describe_changes(changes, bound)}); set them back, or continue with them "
                          "by --config.checkpoint.allow_config_change=true (the old config is kept)")
    log.warning("resuming with a changed config: %s", workdir_lib.describe_changes(changes, changes))
    return changes


def _write_config(workdir: str, run: RunConfig, stored: dict[str, Any] | None, kept_as: str) -> None:
    """Writes config.json (`workdir.stored_form(run)`, atomically: a full disk keeps the old one); a
    stored one that differs is copied first to `config.<kept_as>.json`."""
    tree = workdir_lib.stored_form(run)
    if stored is not None:
        flat = workdir_lib.flat_config(tree)
        if not workdir_lib.config_changes(stored, flat) and not any(workdir_lib.schema_drift(stored, flat)):
            return
        log.warning("the earlier config.json kept as %s", workdir_lib.keep_config(workdir, kept_as))
    workdir_lib.write_config(workdir, json.dumps(tree, indent=2))


def _any_process(flag: bool) -> bool:
    """Whether `flag` holds on any process (every process takes the same decision)."""
    if jax.process_count() == 1:
        return flag
    return bool(np.any(multihost_utils.process_allgather(np.int32(flag))))


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """One training run as `_train` runs it: its typed config (`iterations` resolved from `task.epochs`;
    what config.json stores), the `TrainSpec` built from it, where it runs, its directory, and the
    process's stop requests and console heartbeat it answers to."""

    config: RunConfig
    spec: TrainSpec
    where: Placement
    workdir: str
    stop: StopRequests
    hb: Heartbeat


def train(run: RunConfig, workdir: str) -> dict[str, Any]:
    """Runs the typed config `run` (an entry point's `RunConfig.from_config(c)`) in `workdir`; returns a
    summary (initial/final held-out accuracy, paths).

    One run at a time holds `workdir` (`workdir.WorkdirLock`). SIGTERM / SIGINT stop the run
    after the iteration chunk (or warm-up chunk) in flight with a checkpoint on disk
    (`preemption.RunInterrupted`); checkpoints are also saved every `checkpoint.every`
    iterations and, after a warm-up, at iteration 0.

    Multi-process: `initialize_distributed(run.distributed)` joins the processes first
    (a no-op for a single process); every process runs this function on the same
    (shared) `workdir`, and only process 0 writes logs, plots, the summary and the export.
    """
    initialize_distributed(run.distributed)
    # The console's lines: process 0's, with log.progress (a run without them says only its errors).
    with Heartbeat(run.log.heartbeat_s, quiet=not (run.log.progress and jax.process_index() == 0)) as hb:
        return _train_with(run, workdir, hb)


def _train_with(run: RunConfig, workdir: str, hb: Heartbeat) -> dict[str, Any]:
    """`train` after the distributed start, with `hb` saying what runs (a refused config or workdir
    prints its one error line and nothing before it: the phases until then announce nothing)."""
    with hb.phase(f"building the {run.task.name} task and the {run.model.preset} model"):
        spec = train_spec(run)
    if run.task.epochs:
        run = dataclasses.replace(run, iterations=run_iterations_of(spec, run))
        log.info("task.epochs=%g over %d training rows: %d iterations", run.task.epochs,
                 spec.task.train_size, run.iterations)
    where = placement_from_config(run.mesh)
    if where.mesh is not None:  # every device computes whole micro-batches of its own rows
        steps.check_micro_batching(spec, mesh_batch_shards(where.mesh, where.rules))
    if not spec.generator.in_program and where.mesh is not None:
        raise ConfigError("config.rollout.engine: the slots engine runs on one device; use rollout.engine=sampler "
                          "on a mesh (or --config.mesh.enabled=false)")
    if not spec.task.capabilities.device_reward and spec.uses_teacher and where.mesh is not None:
        raise ConfigError(f"config.mesh.enabled: SDPO / VPD on the {spec.task.name} task build teacher prompts on "
                          "one host; run them on one device (--config.mesh.enabled=false)")
    memory.check_batch_memory(spec)  # before the workdir gets any file
    lock = workdir_lib.WorkdirLock(workdir) if where.is_main_process else None
    try:
        if lock is not None:
            lock.acquire()  # writes the holder's record at once
        try:
            with StopRequests() as stop:
                return _train(TrainingRun(run, spec, where, workdir, stop, hb))
        finally:
            if lock is not None:
                lock.release()  # a refused run leaves no directory it created
    except Exception as e:  # a full / read-only disk: one line naming the path and what was kept
        if atomic.storage_error(e) is None:
            raise
        raise atomic.storage_failure(e, workdir, kept_checkpoints(os.path.join(workdir, "checkpoints"))) from e


def _train(job: TrainingRun) -> dict[str, Any]:
    """The run `job` in its (locked) workdir: resume or start, the RL loop, evaluations, checkpoints, export."""
    run, spec, where, workdir, stop, hb = job.config, job.spec, job.where, job.workdir, job.stop, job.hb
    main = where.is_main_process
    # Nothing is written into the workdir before the config is validated, the
    # evaluation files are read and the resume decision is made: a refused run leaves it as it was.
    workdir_lib.check_run_files(workdir)  # a FIFO in a run file's place: one line now, not a hang later
    ckpt_dir = os.path.join(workdir, "checkpoints")
    existing = saved_steps(ckpt_dir)
    if not run.checkpoint.resume and existing:
        raise ConfigError(f"config.checkpoint.resume: false, but {os.path.abspath(ckpt_dir)} holds checkpoints "
                          f"{existing}: use a new --workdir, delete them, or resume")
    stored = workdir_lib.read_stored_config(workdir)
    resuming_warmup = not existing and bool(saved_steps(os.path.join(workdir, WARMUP_CHECKPOINTS)))
    if (existing or resuming_warmup) and stored is None:
        log.warning("%s holds no config.json: the resumed run's config cannot be compared with the earlier one",
                    workdir)
    elif existing or resuming_warmup:
        check_resume_config(run, spec, stored, os.path.abspath(ckpt_dir))
    cache = compile_cache.current_dir()
    hb.say(f"JAX compilation cache: {cache} ({compile_cache.describe_contents(cache)})" if cache else
           "JAX compilation cache off: every run compiles its programs (experiments' commands turn it on)")
    benchmarks = EvalBenchmarks.load(run)
    ckpt = Checkpointer(ckpt_dir, keep=run.checkpoint.keep)
    warmup_ckpts = WarmupCheckpoints(workdir, spec, run, stop) if not spec.model_path else None

    pre_rows: list[dict] = []
    resume_step = None
    try:
        if existing:
            with hb.phase("restoring the checkpoint", announce=f"resuming: restoring the newest readable checkpoint "
                          f"of {ckpt.directory} (of {existing})"):
                state = where.restore(ckpt, spec)  # the newest checkpoint that reads
            resume_step = int(state.step)
            log.info("resumed from %s at iteration %d", ckpt.directory, resume_step)
        if main:
            _write_config(workdir, run, stored, str(resume_step) if resume_step is not None else "superseded")
        if not existing:
            params = base_params(spec, run, pre_rows, warmup_ckpts, hb)
            with hb.phase("setting up the RL state"):
                state = where.init_state(spec, params, run.seed)
    except BaseException:
        ckpt.close()
        if warmup_ckpts is not None:
            warmup_ckpts.close()
        raise
    step = int(state.step)

    reward = host_task_reward(spec)
    logger = None
    summary: dict[str, Any] = {"workdir": workdir, "resumed_from": resume_step, "devices": where.describe()}
    try:
        evaluation = Evaluation(spec, run, where, reward.scorer, benchmarks)
        summary["heldout_problems"] = evaluation.problems
        logger = observe.RunLogger(workdir, total=run.iterations, tensorboard=run.log.tensorboard,
                                   wandb=run.log.wandb, wandb_project=run.log.wandb_project,
                                   progress=run.log.progress, run_config=workdir_lib.stored_form(run),
                                   start_step=resume_step, enabled=main)
        if resume_step is None:
            with hb.phase("evaluating the base model", announce=f"evaluating the base model (iteration 0) on "
                          f"{describe_heldout(evaluation.problems, run.eval.n)}", report_builds=True):
                scores = evaluation(state.params, 0)
            logger.log(0, dict(pre_rows[0] if pre_rows else {}, **scores))
            summary.update(_initial_figures(dict(pre_rows[0] if pre_rows else {}, **scores)))
            if run.log.progress:  # beside the progress bar; the figures are in metrics.jsonl either way
                log.info("iteration 0 evaluation on %s (EVAL_SEED): %s",
                         describe_heldout(evaluation.problems, run.eval.n), _describe_scores(scores, run))
            if run.warmup.enabled and not spec.model_path:  # the warm-up is not redone after a kill
                with hb.phase("saving checkpoint 0"):
                    ckpt.save(0, state)
                    ckpt.wait()
                    warmup_ckpts.remove()
        elif resume_step == 0 and main:
            row0 = next((r for r in observe.read_metrics(logger.jsonl_path) if r.get("step") == 0), {})
            summary.update(_initial_figures(row0))
        first_chunk = True
        while step < run.iterations:
            if _any_process(stop.requested is not None):
                _save_and_stop(ckpt, step, state, stop)
            n = _chunk_length(step, run)
            t0 = time.perf_counter()
            span = f"iteration {step + 1}" if n == 1 else f"iterations {step + 1}-{step + n}"
            with hb.phase(f"running RL {span}", announce=f"RL: {span}, the first chunk builds the iteration program"
                          if first_chunk else None, report_builds=first_chunk):
                state, metrics = run_iterations(spec, state, n, run.log.jit_loop, reward, where=where)
                jax.block_until_ready(state.params)
            first_chunk = False
            dt = time.perf_counter() - t0
            # One chunk is timed as a whole: each iteration gets the chunk's mean time.
            metrics["tokens_per_s"] = np.asarray(metrics["tokens"], np.float64) / (dt / n)
            extra = {"iteration_time_s": dt / n}
            step += n
            if run.eval.every and step % run.eval.every == 0 or step == run.iterations:
                with hb.phase(f"evaluating iteration {step}"):
                    extra.update(evaluation(state.params, step))
            logger.log_many(step - n, metrics, extra)
            if run.checkpoint.every and step % run.checkpoint.every == 0 and step < run.iterations:
                ckpt.save(step, state)
        # A finished run resumed again has its last checkpoint already, unless it was unreadable.
        if step not in ckpt.all_steps() or step in ckpt.unreadable:
            ckpt.save(step, state)
        with hb.phase("saving the final checkpoint"):
            ckpt.wait()
        with hb.phase("the final evaluation"):
            final = evaluation(state.params, step)
        summary["final_accuracy"] = final["heldout_accuracy"]
        if "heldout_pass_at_1" in final:
            summary["final_pass_at_1"] = final["heldout_pass_at_1"]
        summary["final_eval"] = final
        if run.log.progress:
            log.info("final evaluation (iteration %d) on %s: %s", step,
                     describe_heldout(evaluation.problems, run.eval.n), _describe_scores(final, run))
        if run.checkpoint.export_hf:
            export = os.path.join(workdir, "hf_export")
            params = where.to_host(state.params)  # every process takes part in the gather
            with hb.phase("writing the Hugging Face export", announce=f"writing the Hugging Face export to {export}"
                          if main else None):
                if main and _written_or_warned("hf_export", export, ckpt.step_path(step), lambda: _export_whole(
                        export, lambda out: export_lib.write_export(
                            out, spec.model, params, spec=spec, run_config=run, step=step,
                            metrics=export_lib.metrics_at(workdir, step), source=os.path.abspath(workdir),
                            tokenizer_dir=export_lib.run_tokenizer_dir(run)))):
                    summary["hf_export"] = export  # weights, tokenizer, generation config, model card (`run/export.py`)
    finally:
        ckpt.close()
        if warmup_ckpts is not None:
            warmup_ckpts.close()
        reward.close()
        # A run the disk stopped draws no plots (its stop is the one line to read).
        plots = run.log.plots and atomic.storage_error(sys.exc_info()[1]) is None
        summary["plots"] = logger.close(plots=plots) if logger is not None else []
    summary["state"] = state
    if main:
        _written_or_warned("summary.json", os.path.join(workdir, "summary.json"), ckpt.step_path(step),
                           lambda: atomic.write_json_atomic(os.path.join(workdir, "summary.json"),
                                                            {k: v for k, v in summary.items() if k != "state"}))
    return summary


def _export_whole(export: str, write_into) -> None:
    """`write_into(<export>.partial)`, then that directory renamed to `export` (replacing an earlier one):
    a failed export leaves no half-written directory that a server would load."""
    partial = export + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        write_into(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(export, ignore_errors=True)
    os.replace(partial, export)


def _written_or_warned(what: str, path: str, checkpoint: str, write) -> bool:
    """`write()` of a finished run's output; True when it wrote. A storage refusal (a full disk) is one
    warning line instead: the run's state is in `checkpoint`, so the run ends as finished."""
    try:
        write()
        return True
    except Exception as e:  # noqa: BLE001 - only a storage refusal is the disk's; anything else is raised
        if atomic.storage_error(e) is None:
            raise
        log.warning("%s: not written (%s); the run's final state is in the checkpoint %s", what,
                    atomic.storage_refusal(e, path), checkpoint)
        return False


WARMUP_SUMMARY = {"warmup_steps": "steps", "warmup_accuracy": "greedy_accuracy_on_its_check_set",
                  "warmup_pass_at_1": "pass_at_1_on_its_check_set",
                  "warmup_mixed_groups_frac": "mixed_groups_on_its_check_set"}
# metrics.jsonl's key of each warm-up target (`warmup.TARGET_CURVES`' names)
WARMUP_TARGET_KEYS = {"target_accuracy": "warmup_target_accuracy", "target_pass_rate": "warmup_target_pass_rate",
                      "target_mixed_groups": "warmup_target_mixed_groups_frac"}


def _initial_figures(row0: dict[str, Any]) -> dict[str, Any]:
    """summary.json's figures of iteration 0 (docs/results.md "summary.json"): the trainer's evaluation of
    the base model and, after a warm-up, the warm-up's last check on its own check set."""
    row0 = {metric_keys.current_name(k): v for k, v in row0.items()}  # a row an earlier run wrote
    out = {}
    if "heldout_accuracy" in row0:
        out["initial_accuracy"] = row0["heldout_accuracy"]
    if "heldout_pass_at_1" in row0:
        out["initial_pass_at_1"] = row0["heldout_pass_at_1"]
    warm = {name: row0[k] for k, name in WARMUP_SUMMARY.items() if k in row0}
    if "warmup_target_met" in row0:  # each target set, and what the last check reached of it
        targets = {name: row0[WARMUP_TARGET_KEYS[name]] for name, _ in warmup.TARGET_CURVES
                   if WARMUP_TARGET_KEYS[name] in row0}
        reached = {"target_accuracy": "warmup_accuracy", "target_pass_rate": "warmup_pass_at_1",
                   "target_mixed_groups": "warmup_mixed_groups_frac"}
        warm.update(target_met=bool(row0["warmup_target_met"]), target=targets,
                    reached={name: row0.get(reached[name]) for name in targets})
    if warm:
        out["warmup"] = warm
    return out


def _describe_scores(scores: dict[str, float], run: RunConfig) -> str:
    text = f"greedy heldout_accuracy {scores['heldout_accuracy']:.3f}"
    if "heldout_pass_at_1" in scores:
        text += (f", sampled heldout_pass_at_1 {scores['heldout_pass_at_1']:.3f} ({run.eval.heldout_samples} per "
                 f"problem at rollout.temperature={run.rollout.temperature:g})")
    return text


def heldout_count(spec: TrainSpec, n: int) -> int:
    """How many held-out problems the evaluation scores: `n` (`eval.n`), or all of a held-out split that
    has fewer (`Task.heldout_problems`' leading dimension)."""
    problems = jax.eval_shape(lambda: spec.task.heldout_problems(spec.task.prompt_table(), n,
                                                                 jax.random.PRNGKey(EVAL_SEED)))
    return int(jax.tree.leaves(problems)[0].shape[0])


def describe_heldout(problems: int, n: int) -> str:
    """The evaluation's problems for the log: "the trainer's 73 fixed held-out problems (the whole held-out
    split: eval.n=512 asks for more)", or "... 512 fixed held-out problems (eval.n)"."""
    if problems < n:
        return (f"the trainer's {problems} fixed held-out problems (the whole held-out split: eval.n={n} asks for "
                "more)")
    return f"the trainer's {problems} fixed held-out problems (eval.n)"


def _save_and_stop(ckpt: Checkpointer, step: int, state: TrainState, stop: StopRequests) -> None:
    """On a stop request: the state of `step` saved (unless it is already) and on disk, then `RunInterrupted`."""
    if step not in ckpt.all_steps() or step in ckpt.unreadable:
        ckpt.save(step, state)
    ckpt.wait()
    raise RunInterrupted(stop.requested or signal.SIGTERM, f"iteration {step}", ckpt.directory)
