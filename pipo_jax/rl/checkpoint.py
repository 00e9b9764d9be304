"""Orbax checkpoints of the whole `TrainState` (params, optimizer, PIPO state, RNG).

Saves are asynchronous and keep the last `keep` steps. Orbax writes each step into a
temporary directory and renames it only once complete, so a half-written checkpoint is
never picked up as the latest: a crash mid-save leaves the previous good one in place.
"""

from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp


class Checkpointer:
    """`save(step, state)`, `latest_step()`, `restore(template, step=None)` over a directory."""

    def __init__(self, directory: str, keep: int = 3, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save,
                                               create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, step: int, state) -> None:
        self._manager.save(int(step), args=ocp.args.StandardSave(state), force=True)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def restore(self, template, step: int | None = None):
        """The state saved at `step` (default: the latest), laid out like `template`."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        return self._manager.restore(step, args=ocp.args.StandardRestore(abstract))

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
