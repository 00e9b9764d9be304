"""Orbax checkpoints of the whole `TrainState` (params, optimizer, PIPO state, RNG).

Saves are asynchronous and keep the last `keep` steps. Orbax writes each step into a
temporary directory and renames it only once complete, so a half-written checkpoint is
never picked up as the latest: a crash mid-save leaves the previous good one in place.
A checkpoint damaged after the fact (a truncated or deleted file, garbage bytes) is
skipped on restore: the newest one that reads is used, each skipped one is named in one
log line and left on disk (moved aside into `<directory>.unreadable/` only when a new
save needs its step number). A checkpoint written by older code under names since renamed
(`LEGACY_NAMES`) is read by its stored names and laid out like the template.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import sys

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class NoReadableCheckpoint(RuntimeError):
    """No checkpoint of a directory could be read."""


# Names a field of the saved state had before a rename (new -> old), so a run saved by older
# code still resumes: PIPO's stored batch (`PipoState.prev`) was a `StoredBatch` of
# `_bt`-named fields until it became the `TrainBatch` cut to `batch.STORED_FIELDS`.
LEGACY_NAMES = {"mask_bl": "attention_mask_bl", "mask_br": "mask_bt", "logp_old_br": "logp_old_bt",
                "logp_ref_br": "logp_ref_bt", "attr_br": "attr_bt"}


def _key_name(k) -> str:
    for attr in ("name", "key", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    raise TypeError(f"unexpected pytree key {k!r}")


def _flat_by_path(tree) -> dict[tuple[str, ...], object]:
    return {tuple(_key_name(k) for k in path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _reason(e: BaseException, limit: int = 300) -> str:
    """`Type: first line` of the innermost cause, clipped: orbax wraps tensorstore's precise
    error (which names the file) in a many-line one."""
    while (e.__cause__ or e.__context__) is not None:
        e = e.__cause__ or e.__context__
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    text = f"{type(e).__name__}: {first}" if first else type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def saved_steps(directory: str) -> list[int]:
    """Steps of the complete (finalized) checkpoints in `directory`, oldest first, read without
    creating or writing anything."""
    if not os.path.isdir(directory):
        return []
    return sorted(ocp.step.checkpoint_steps(os.path.abspath(directory)))


@contextlib.contextmanager
def _quiet_abandoned_reads():
    """When one array of a damaged checkpoint fails, orbax abandons its other pending read
    coroutines; closing them raises again, and Python would print each (a many-line
    tensorstore spec) as "Exception ignored in <coroutine ...>". They are collected here,
    silently: the failure is already reported in one line."""
    previous = sys.unraisablehook

    def hook(unraisable):
        if not (unraisable.object is not None and type(unraisable.object).__name__ == "coroutine"):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        gc.collect()
        sys.unraisablehook = previous


class Checkpointer:
    """`save(step, state)`, `latest_step()`, `restore(template, step=None)` over a directory."""

    def __init__(self, directory: str, keep: int = 3, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save,
                                               create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self.unreadable: dict[int, str] = {}  # step -> reason, filled by `restore`

    def save(self, step: int, state) -> None:
        step = int(step)
        if step in self.unreadable:  # the damaged checkpoint of this step goes aside, not away
            aside = os.path.join(self.directory + ".unreadable", str(step))
            os.makedirs(os.path.dirname(aside), exist_ok=True)
            shutil.move(self.step_path(step), aside)
            self._manager.reload()
            log.warning("checkpoint step %d: the unreadable one moved to %s before saving a new one", step, aside)
            del self.unreadable[step]
        self._manager.save(step, args=ocp.args.StandardSave(state), force=True)

    def step_path(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def restore(self, template, step: int | None = None):
        """The state saved at `step`, laid out like `template`.

        `step=None`: the newest checkpoint that reads. Each newer one that does not is
        logged (step, path, reason) and left in place; raises `NoReadableCheckpoint` when none
        reads, `FileNotFoundError` when there is none.
        """
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        if step is not None:
            return self._restore_step(step, abstract)
        steps = sorted(self.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        for s in steps:
            try:
                with _quiet_abandoned_reads():
                    return self._restore_step(s, abstract)
            except Exception as e:  # noqa: BLE001 - any read failure means: try the next older one
                self.unreadable[s] = _reason(e)
                log.warning("checkpoint step %d at %s is unreadable (%s): skipped, left in place",
                            s, self.step_path(s), self.unreadable[s])
        raise NoReadableCheckpoint(f"{self.directory}: none of the checkpoints {sorted(steps)} is readable "
                                   f"(newest, step {steps[0]}: {self.unreadable[steps[0]]})")

    def _restore_step(self, step: int, abstract):
        # Without the tree metadata orbax fails with a pytree-structure error that hides the cause.
        metadata = os.path.join(self.step_path(step), "default", "_METADATA")
        if not os.path.exists(metadata):
            raise FileNotFoundError(f"{metadata} is missing")
        try:
            return self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
        except Exception as e:  # noqa: BLE001 - a renamed field? then read it by its stored name
            try:
                restored = self._restore_legacy(step, abstract)
            except Exception:  # noqa: BLE001 - unreadable either way: the template's error says why
                restored = None
            if restored is None:
                raise e
            log.info("checkpoint step %d at %s holds fields under their former names: read and renamed",
                     step, self.step_path(step))
            return restored

    def _restore_legacy(self, step: int, abstract):
        """The state of a checkpoint that stored some fields under their `LEGACY_NAMES`, laid out
        like `abstract` (each leaf by its path, renamed where the new path is absent); None when
        it has no such field or a leaf of `abstract` is missing or of another shape / dtype."""
        stored = _flat_by_path(self._manager.restore(step, args=ocp.args.StandardRestore()))
        paths, treedef = jax.tree_util.tree_flatten_with_path(abstract)
        leaves, renamed = [], False
        for path, want in paths:
            key = tuple(_key_name(k) for k in path)
            if key not in stored and key[-1] in LEGACY_NAMES:
                key, renamed = key[:-1] + (LEGACY_NAMES[key[-1]],), True
            have = stored.get(key)
            if have is None or have.shape != want.shape or have.dtype != want.dtype:
                return None
            sharding = getattr(want, "sharding", None)
            leaves.append(jax.device_put(have, sharding) if sharding is not None else jax.numpy.asarray(have))
        return jax.tree_util.tree_unflatten(treedef, leaves) if renamed else None

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
