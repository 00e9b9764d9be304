"""Many runs of one jit-static spec as ONE program: their `TrainState`s stacked on a leading axis and
`loop.scan_chunk` advancing them together, evaluated the same way (`run_group`).

The runs of a group differ only in what the state holds (the seed's RNG and base model today; every
value the train state carries): `train_spec` of every member's typed config (`RunConfig`) must be equal.
How the members share the program (`MEMBERS`, `over_members`): "vmap" batches them (`jax.vmap`: one
batched matmul for all members, the accelerators' form), each member equal to its separate run up to the
float32 order of batched sums, which over a long run can flip a sampled token and part the curves;
"map" runs them one after another inside the program (`lax.map`), each computed as its separate run
computes it, bit for bit (tests/test_compare.py, tests/test_study.py).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from experiments import overfit
from pipo_jax.rl import loop
from pipo_jax.config.sections import RunConfig
from pipo_jax.rl.spec import TrainSpec
from pipo_jax.rl.state import TrainState, init_train_state
from pipo_jax.run import teacher_forcing
from pipo_jax.run.heartbeat import Heartbeat
from pipo_jax.run.setup import train_spec
from pipo_jax.run.trainer import EVAL_SEED, device_sampled_rewards


MEMBERS = ("vmap", "map")  # how a group's members share its program (module docstring)


def stack(trees: list) -> Any:
    """Stacks equal-structure pytrees along a new leading (member) axis."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def over_members(members: str, fn: Callable, stacked: Any) -> Any:
    """`fn` of each member of `stacked` (a pytree with a leading member axis), results stacked the same way:
    `jax.vmap(fn)` ("vmap") or `lax.map(fn)` ("map": one member after another, each as `fn` alone computes it)."""
    if members == "vmap":
        return jax.vmap(fn)(stacked)
    if members == "map":
        return jax.lax.map(fn, stacked)
    raise ValueError(f"members={members!r}: expected one of {MEMBERS}")


@functools.partial(jax.jit, static_argnums=(0, 2, 3), donate_argnums=1)
def vmapped_chunk(spec: TrainSpec, states: TrainState, length: int, members: str = "vmap"
                  ) -> tuple[TrainState, dict]:
    """`length` iterations of every member: `loop.scan_chunk` over the stacked states as `members` says
    (metrics `[S, length]`)."""
    return over_members(members, lambda s: loop.scan_chunk(spec, s, length), states)


@functools.partial(jax.jit, static_argnums=(0, 2, 3, 4))
def vmapped_accuracy(spec: TrainSpec, params, n: int, kind: str = "none", members: str = "vmap") -> jax.Array:
    """Greedy accuracy `[S]` of stacked params on the trainer's `n` fixed held-out problems
    (kind: 'none' = the student; 'solution' / 'feedback' = shown a teacher context)."""
    key, table = jax.random.PRNGKey(EVAL_SEED), spec.task.prompt_table()
    return over_members(members, lambda p: teacher_forcing.heldout_accuracy(spec.model, p, spec.task, table, n, key,
                                                                            kind), params)


@functools.partial(jax.jit, static_argnums=(0, 2, 3, 4))
def vmapped_sampled_rewards(spec: TrainSpec, params, n: int, samples: int, members: str = "vmap") -> jax.Array:
    """Rewards `[S, m, samples]` of stacked params: per member what the trainer's `heldout_pass_at_1` scores
    (`run/trainer.py:device_sampled_rewards`: the greedy accuracy's held-out problems, sampled as the
    rollout samples, the trainer's keys)."""
    return over_members(members, lambda p: device_sampled_rewards(spec, p, n, samples), params)


class CompiledPrograms:
    """The group's programs compiled ahead of time (`jit(...).lower(...).compile()`), once per static
    arguments, so the time spent compiling is measured apart from running (`compile_s`, seconds)."""

    def __init__(self):
        self._compiled: dict[tuple, Any] = {}
        self.compile_s = 0.0

    def get(self, key: tuple, lower: Callable[[], Any]) -> Any:
        if key not in self._compiled:
            t0 = time.perf_counter()
            self._compiled[key] = lower().compile()
            self.compile_s += time.perf_counter() - t0
        return self._compiled[key]


def group_spec(configs: list[RunConfig]) -> TrainSpec:
    """The one `TrainSpec` of `configs`; ValueError if two members differ in it (or in the loop's length
    and evaluation, which the group shares)."""
    spec = train_spec(configs[0])
    shared = lambda c: (c.iterations, c.eval.n, c.eval.every, c.eval.heldout_samples)  # noqa: E731
    for c in configs[1:]:
        if train_spec(c) != spec or shared(c) != shared(configs[0]):
            raise ValueError("vmapped.run_group: the members' jit-static specs (or iterations / eval settings) "
                             "differ; they cannot run as one program")
    if not spec.task.capabilities.device_reward:
        raise ValueError(f"vmapped.run_group: the {spec.task.name} task is scored on the host; the vmapped scan "
                         "and evaluation need a JAX reward (the built-in task, reasoning-gym)")
    return spec


def member_state(config: RunConfig, params) -> TrainState:
    """One member's fresh state, built from its own config: its own spec's values (whatever the state
    carries of them) and its seed's RNG, around its base params."""
    return init_train_state(train_spec(config), params, config.seed)


def run_group(configs: list[RunConfig], base_params: list, eval_every: int, members: str = "vmap"
              ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Runs every typed config of `configs` (member i from base_params[i]) as one program, its members
    sharing it as `members` says (module docstring).

    Returns per member: steps / reward (batch reward per iteration), acc_steps / accuracy (held-out
    greedy accuracy at 0 and every `eval_every`), teacher accuracies (SDPO / VPD), initial / final
    accuracy, reward_auc (mean batch reward), heldout_auc and gap_flag (`overfit.run_figures`), pi_steps;
    with `eval.heldout_samples` > 0 also
    pass_at_1 / initial_pass_at_1 / final_pass_at_1 (the same problems, that many responses each sampled
    at the rollout's temperature: the trainer's `heldout_pass_at_1`). And the group's timing:
    {wall_s, compile_s} (seconds; compile_s = lowering and compiling its programs).
    """
    t_start = time.perf_counter()
    spec = group_spec(configs)
    config = configs[0]
    states = stack([member_state(c, p) for c, p in zip(configs, base_params)])
    n_eval, total, samples = config.eval.n, config.iterations, config.eval.heldout_samples
    kinds = ("none", "solution", "feedback") if spec.uses_teacher else ("none",)
    programs = CompiledPrograms()

    def evaluate(params):
        out = {k: np.asarray(programs.get(("accuracy", k), lambda k=k: vmapped_accuracy.lower(
            spec, params, n_eval, k, members))(params)) for k in kinds}
        if samples:
            run = programs.get(("rewards",), lambda: vmapped_sampled_rewards.lower(spec, params, n_eval, samples,
                                                                                   members))
            out["pass_at_1"] = np.array([teacher_forcing.pass_and_mixed(r)[0] for r in np.asarray(run(params))])
        return out

    points = f"{len(configs)} points in one program" + (" (one after another: --members=map)" if members == "map"
                                                         else "")
    with Heartbeat() as hb:  # never silent long: a chunk of a large group runs minutes on a CPU
        with hb.phase("evaluating the group's bases", announce=f"{points}: evaluating iteration 0",
                      report_builds=True):
            evals, acc_steps, chunks = [evaluate(states.params)], [0], []
        step = 0
        while step < total:
            n = min(eval_every or total, total - step)
            span = (f"iterations {step + 1}-{step + n}" if n > 1 else f"iteration {step + 1}") + f" of {total}"
            with hb.phase(f"running {span}", announce=f"{points}: {span}", report_builds=True):
                chunk = programs.get(("chunk", n), lambda n=n: vmapped_chunk.lower(spec, states, n, members))
                states, metrics = chunk(states)
                chunks.append(jax.device_get({k: metrics[k] for k in ("reward_mean", "pi_step_applied")
                                              if k in metrics}))
                step += n
                evals.append(evaluate(states.params))
                acc_steps.append(step)
    reward = np.concatenate([c["reward_mean"] for c in chunks], axis=1)  # [S, total]
    pi = np.concatenate([c.get("pi_step_applied", np.zeros_like(c["reward_mean"])) for c in chunks], axis=1)
    out = []
    for i, c in enumerate(configs):
        acc = [float(e["none"][i]) for e in evals]
        row = {"seed": c.seed, "steps": list(range(1, total + 1)), "reward": reward[i].tolist(),
               "acc_steps": acc_steps, "accuracy": acc, "initial_accuracy": acc[0], "final_accuracy": acc[-1],
               "reward_auc": float(reward[i].mean()), "pi_steps": int(pi[i].sum())}
        for kind in kinds[1:]:
            row[f"teacher_accuracy_{kind}"] = [float(e[kind][i]) for e in evals]
        if samples:
            row["pass_at_1"] = [float(e["pass_at_1"][i]) for e in evals]
            row["initial_pass_at_1"], row["final_pass_at_1"] = row["pass_at_1"][0], row["pass_at_1"][-1]
        row.update(overfit.run_figures(row))  # held-out AUC beside reward_auc; the train / held-out gap
        out.append(row)
    return out, {"wall_s": time.perf_counter() - t_start, "compile_s": programs.compile_s}
