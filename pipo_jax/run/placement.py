"""Where the trainer's state lives and which programs advance it: one device, or a mesh.

`placement_from_config(config.mesh)` reads the typed mesh section (sizes `data` / `fsdp` / `tensor`,
`-1` fills, `dcn_*`, `rules`). With one device (or `mesh.enabled=false`) the trainer
runs the plain single-device programs (`loop.scan_chunk`, `loop.host_iteration`). With
several devices, of one process or many, it builds the mesh over all of them and runs
the same step functions jitted with explicit shardings (`pipo_jax.run.sharded_steps`):
the state is created, restored (orbax resharding) and advanced directly on the mesh,
host rewards are computed by each process on its own rows, and everything the host
reads (metrics, evaluation, the HF export) is gathered first.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from pipo_jax import parallel
from pipo_jax.parallel import shardings
from pipo_jax.parallel.rules import Rules, make_rules
from pipo_jax.rl import loop, rollout
from pipo_jax.rl.hyper import hyperparameters_of
from pipo_jax.config.sections import MeshConfig
from pipo_jax.rl.spec import ConfigError, TrainSpec
from pipo_jax.rl.state import TrainState, init_train_state
from pipo_jax.run import sharded_steps, teacher_forcing
from pipo_jax.run.checkpoint import Checkpointer

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Placement:
    """`mesh` None: the default device. Otherwise the mesh and the logical-axis rules. A
    placement keeps the host loop's programs it made (`host_programs`) for its lifetime."""

    mesh: Mesh | None = None
    rules: Rules | None = None
    _host: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)  # spec -> HostPrograms

    @property
    def is_main_process(self) -> bool:
        """Process 0 writes logs, plots, summaries and the HF export."""
        return jax.process_index() == 0

    def describe(self) -> str:
        return "1 device" if self.mesh is None else parallel.describe(self.mesh)

    def init_state(self, spec: TrainSpec, params: Any, seed: int) -> TrainState:
        """`init_train_state` on this placement (params: host or device arrays, the same on every process)."""
        if self.mesh is None:
            return shardings.on_default_device(init_train_state(spec, params, seed))
        return sharded_steps.init_sharded_train_state(spec, self.mesh, params, seed, self.rules)

    def restore(self, ckpt: Checkpointer, spec: TrainSpec, step: int | None = None) -> TrainState:
        """The state saved at `step` (None: the newest that reads, see `Checkpointer.restore`),
        laid out on this placement (whatever mesh it was saved from).

        The template is abstract (shapes, dtypes, shardings), so nothing is initialised first. The
        hyperparameters (`TrainState.hyper`) are `spec`'s, this run's config's, whatever the checkpoint
        holds (one saved before they were part of the state has none): a resume with `train.lr` or
        `pipo.lam` changed (`checkpoint.allow_config_change`) trains with the new values.
        """
        abstract = sharded_steps.abstract_train_state(spec)
        if self.mesh is None:
            device = shardings.default_device_sharding()
            layout = jax.tree.map(lambda _: device, abstract)
        else:
            layout = sharded_steps.state_shardings(spec, self.mesh, self.rules)
        state = ckpt.restore(parallel.with_shardings(abstract, layout), step)
        return state.replace(hyper=jax.tree.map(sharded_steps.place, hyperparameters_of(spec), layout.hyper))

    def run(self, spec: TrainSpec, state: TrainState, n: int, jit_loop: bool,
            reward_fn: loop.HostReward | None) -> tuple[TrainState, dict[str, np.ndarray]]:
        """`n` iterations (one scan chunk, or the host loop with `reward_fn`: None only with `jit_loop`);
        metrics `[n]` on host."""
        if jit_loop:
            chunk = (lambda s: loop.scan_chunk(spec, s, n)) if self.mesh is None else \
                sharded_steps.sharded_scan_chunk(spec, self.mesh, n, self.rules)
            first = int(self.to_host(state.step))
            state, metrics = chunk(state)
            metrics = self.to_host(metrics)
            loop.check_dynamic_sampling(spec, metrics)
            loop.check_finite_updates(spec, metrics, first)
            return state, metrics
        programs = self.host_programs(spec)
        rows = []
        for _ in range(n):
            first = int(self.to_host(state.step))
            state, m = loop.host_iteration(spec, state, reward_fn, programs)
            rows.append(self.to_host(m))
            loop.check_finite_updates(spec, {k: np.asarray(v)[None] for k, v in rows[-1].items()}, first)
        return state, {k: np.stack([np.asarray(r[k]) for r in rows]) for k in rows[0]}

    def host_programs(self, spec: TrainSpec) -> loop.HostPrograms:
        """The host loop's programs for `spec` on this placement, made on first use and kept, so
        their jits (and a host-driven generator's slot engines) compile once for a run."""
        if spec not in self._host:
            self._host[spec] = loop.single_device_programs(spec) if self.mesh is None else \
                sharded_steps.mesh_host_programs(spec, self.mesh, self.rules)
        return self._host[spec]

    def reference_accuracy(self, spec: TrainSpec, params, n: int, rng, kind: str = "none") -> float:
        """Greedy accuracy on the task's `n` held-out problems drawn with `rng` (shown teacher
        context `kind`, see `teacher_forcing.heldout_accuracy`); `exact_answers` or `device_reward` tasks."""
        if self.mesh is None:
            table = rollout.prompt_table(spec)
            return float(teacher_forcing.heldout_accuracy(spec.model, params, spec.task, table, n, rng, kind))
        table = sharded_steps.mesh_prompt_table(spec, self.mesh)
        with parallel.sharding_context(self.mesh, self.rules):
            return float(self.to_host(teacher_forcing.heldout_accuracy(spec.model, params, spec.task, table, n, rng,
                                                                       kind)))

    def to_host(self, tree: Any) -> Any:
        """numpy copies of `tree` (gathered across processes on a mesh)."""
        return jax.device_get(tree) if self.mesh is None else sharded_steps.to_host(tree)


def placement_from_config(cfg: MeshConfig) -> Placement:
    """The placement of the `config.mesh` section over all devices (see the module doc)."""
    if not cfg.enabled or jax.device_count() == 1:
        return Placement()
    try:
        rules = make_rules(cfg.rules or None)
        mesh = parallel.mesh_from_config(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    placement = Placement(mesh, rules)
    log.info("mesh: %s", placement.describe())
    return placement
