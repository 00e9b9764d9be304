"""Orbax checkpoints of the whole `TrainState` (params, optimizer, PIPO state, RNG).

Saves are asynchronous and keep the last `keep` of the run's own whole steps (`_rotate`: a foreign,
an older code's, a cut or an unreadable numbered directory is never removed). Orbax writes each step
into a temporary directory and renames it only once complete, so a half-written checkpoint is
never picked up as the latest: a crash mid-save leaves the previous good one in place. Before that
rename the step gets its integrity record (`integrity.py`: each saved file's size and sha256).
A checkpoint damaged after the fact (a truncated or deleted file, garbage bytes, even ones orbax
would read back as other values) is skipped on restore: its record is checked first, the newest one
that reads is used, each skipped one is named in one log line and left on disk (moved aside into
`<directory>.unreadable/` only when a new save needs its step number); a step saved by older code
(no record) is read unchecked. A checkpoint written by older code under names since renamed
(`LEGACY_NAMES`) is read by its stored names and laid out like the template; one written before a
field of `ADDED_FIELDS` existed restores with that field fresh (zeros, its initial value), said in
one log line (nothing said for `SET_FROM_CONFIG`: `TrainState.hyper` is set from the run's config on
every restore, so one saved with other hyperparameter fields restores too).

A save the disk refuses (full, read-only, quota) leaves no partial step behind: its
`<step>.orbax-checkpoint-tmp` directory is removed, and the failure is raised once, without orbax's
per-thread tracebacks in the log; the run reports it in one line (`atomic.StorageError`). What a
killed run left (a partial save, a half-removed rotated-out step: `remove_partial_saves`) is removed
by the next run before its first save, by this code alone (orbax's own clean-up of temporary
directories is off: it ran in a background thread over the same directories and failed when an entry
was already gone). `saved_steps` never counts a partial save. A `Checkpointer` that only reads (eval,
export, serve, chat on a run's workdir) removes nothing: neither a live run's save in flight nor,
beyond its own `keep`, the run's checkpoints.
"""

from __future__ import annotations

import contextlib
import gc
import glob
import logging
import os
import re
import shutil
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from pipo_jax.run import atomic, integrity
from pipo_jax.run.integrity import CheckpointDamaged  # noqa: F401 - raised by `restore`, caught by callers
from pipo_jax.run.workdir import WorkdirError

log = logging.getLogger(__name__)

TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax's name for a step still being written
REMOVING_SUFFIX = ".removing"  # `.<step>.removing`: a rotated-out step being removed
# The leftovers of this code's saves: `<step>.orbax-checkpoint-tmp` (orbax versions that stamp it:
# `-<timestamp>` after) and `.<step>.removing`; any other name is not the run's own.
_PARTIAL_SAVE_NAME = re.compile(rf"\d+{re.escape(TMP_SUFFIX)}(-\d+)?|\.\d+{re.escape(REMOVING_SUFFIX)}")


class NoReadableCheckpoint(RuntimeError):
    """No checkpoint of a directory could be read."""


# Names a field of the saved state had before a rename (new -> old), so a run saved by older
# code still resumes: PIPO's stored batch (`PipoState.prev`) was a `StoredBatch` of
# `_bt`-named fields until it became the `TrainBatch` cut to `batch.STORED_FIELDS`.
LEGACY_NAMES = {"mask_bl": "attention_mask_bl", "mask_br": "mask_bt", "logp_old_br": "logp_old_bt",
                "logp_ref_br": "logp_ref_bt", "attr_br": "attr_bt"}

# Fields of the saved state added since checkpoints were first written (name -> what it holds), each
# with an initial value of zeros (None where unused): a checkpoint saved before one existed restores
# with it so, and a log line says so (a fresh start of that state, the rest exactly as saved).
ADDED_FIELDS = {"estimator_state": "the advantage estimator's carried state (BNPO's pool of success rates)",
                "hyper": "the hyperparameters read as data (`rl/hyper.py`)"}
# Of those, the fields the caller sets from the run's config after every restore (`Placement.restore`):
# a checkpoint without one loses nothing, and nothing is said.
SET_FROM_CONFIG = ("hyper",)


def _key_name(k) -> str:
    for attr in ("name", "key", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    raise TypeError(f"unexpected pytree key {k!r}")


def _flat_by_path(tree) -> dict[tuple[str, ...], object]:
    return {tuple(_key_name(k) for k in path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _reason(e: BaseException, limit: int = 600) -> str:
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


def kept_checkpoints(directory: str) -> str:
    """What a failed run leaves to resume from, in words: the complete checkpoints of `directory`."""
    steps = saved_steps(directory)
    return f"checkpoints {steps} in {directory} kept" if steps else f"no checkpoint in {directory} yet"


def remove_tree(path: str) -> None:
    """Removes the directory tree at `path`; an entry already gone (or the whole tree) is fine, as when
    another clean-up got there first. Any other failure raises, the rest of the tree removed."""
    failures: list[OSError] = []

    def gone_is_fine(_func, _path, exc) -> None:
        e = exc[1] if isinstance(exc, tuple) else exc  # onerror's exc_info (3.11), onexc's exception (3.12+)
        if not isinstance(e, FileNotFoundError):
            failures.append(e)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=gone_is_fine)
    else:
        shutil.rmtree(path, onerror=gone_is_fine)
    if failures:
        raise failures[0]


def remove_partial_saves(directory: str) -> tuple[list[str], dict[str, str]]:
    """Removes the `<step>.orbax-checkpoint-tmp` directories (saves that never finished) and the
    `.<step>.removing` ones (rotated-out steps whose removal a kill cut short) of `directory`, nothing
    else (`remove_tree`: one already gone is fine); returns (their paths removed, {path: reason} of
    those that could not be)."""
    if not os.path.isdir(directory):
        return [], {}
    removed, left = [], {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not (_PARTIAL_SAVE_NAME.fullmatch(name) and os.path.isdir(path) and not os.path.islink(path)):
            continue
        try:
            remove_tree(path)
            removed.append(path)
        except OSError as e:
            left[path] = _reason(e)
    return removed, left


class _StorageFailuresReported(logging.Filter):
    """Drops orbax's log records (one traceback per thread) of a save the disk refused: the
    `Checkpointer` raises that failure itself, once."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not ((exc is not None and atomic.storage_error(exc)) or atomic.storage_error(
            RuntimeError(record.getMessage())))


_QUIET_LOGGERS = ("absl", "asyncio")  # orbax logs through absl's logger; asyncio reports unretrieved futures
_quieted = False


def _drop_loop_closed(previous):
    def hook(unraisable) -> None:
        e = unraisable.exc_value
        if not (isinstance(e, RuntimeError) and str(e) == "Event loop is closed"):
            previous(unraisable)
    return hook


def _quiet_failed_saves() -> None:
    """From the first `Checkpointer` on, for the rest of the process (idempotent): the log records
    of a save the disk refused (one traceback per orbax thread, then asyncio's "Future exception
    was never retrieved" as the save's futures are collected) are dropped
    (`_StorageFailuresReported`), and so are the unraisable "Event loop is closed" errors its other
    pending tensorstore writes raise once orbax has abandoned it. The `Checkpointer` raises the
    failure itself, once."""
    global _quieted
    if _quieted:
        return
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).addFilter(_StorageFailuresReported())
    sys.unraisablehook = _drop_loop_closed(sys.unraisablehook)
    _quieted = True


class _Reads:
    """`failed`: an orbax read failed during the restore (`Checkpointer._restore_step` sets it), or it raised."""

    failed = False


@contextlib.contextmanager
def _quiet_abandoned_reads():
    """One restore, with all its attempts (yields its `_Reads`). When one array of a damaged checkpoint
    fails, orbax abandons its other pending read coroutines; closing them raises again, and Python would
    print each (a many-line tensorstore spec) as "Exception ignored in <coroutine ...>". Within the restore
    they are dropped silently (the failure is reported in one line), and a restore that raised, or where a
    read failed, collects them at its end, once the reads still in flight at the failure have ended too
    (during the next attempt). A restore where every read succeeded abandoned none and skips that
    collection, which walks every object of the process (about a second in a process holding many
    compiled programs)."""
    previous = sys.unraisablehook

    def hook(unraisable):
        if not (unraisable.object is not None and type(unraisable.object).__name__ == "coroutine"):
            previous(unraisable)

    sys.unraisablehook = hook
    reads = _Reads()
    try:
        yield reads
    except BaseException:
        reads.failed = True
        raise
    finally:
        if reads.failed:
            gc.collect()
        sys.unraisablehook = previous


class Checkpointer:
    """`save(step, state)`, `latest_step()`, `restore(template, step=None)` over a directory."""

    def __init__(self, directory: str, keep: int = 3, async_save: bool = True):
        """`keep`: the newest complete checkpoints of this run kept (`_rotate`); `async_save=False`:
        `save` returns once the step is on disk."""
        self.directory = os.path.abspath(directory)
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise WorkdirError(f"{self.directory}: {atomic.file_kind(os.stat(self.directory).st_mode)}, not a "
                               "directory of checkpoints: move it aside")
        # Orbax keeps every step (max_to_keep=None): its rotation would remove any numbered directory,
        # a foreign or an unreadable one too; `_rotate` removes only this code's complete steps. Orbax's
        # clean-up of temporary directories is off (`_remove_killed_runs_leftovers` does it, at the first
        # save). Saves are always asynchronous in orbax (its finalization hook writes the integrity record).
        options = ocp.CheckpointManagerOptions(max_to_keep=None, enable_async_checkpointing=True, create=True,
                                               cleanup_tmp_directories=False,
                                               async_options=ocp.AsyncOptions(
                                                   post_finalization_callback=self._record_integrity))
        _quiet_failed_saves()
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self.keep, self.async_save = keep, async_save
        self.unreadable: dict[int, str] = {}  # step -> reason, filled by `restore`
        self.failed: BaseException | None = None  # a save that did not finish
        self._saving: int | None = None  # the step of the newest save; None: this Checkpointer has only read
        self._told_unrecorded: set[int] = set()  # steps without a record already named in a log line

    def _record_integrity(self) -> None:
        """Orbax's hook after the step's data is complete, before its temporary directory is renamed
        (in orbax's save thread): process 0 writes the integrity record into that directory, so the
        step is finalized with it. A failure here fails the save (no step without a record)."""
        if jax.process_index() != 0:
            return
        pending = glob.glob(os.path.join(glob.escape(self.directory), f"{self._saving}{TMP_SUFFIX}*"))
        if len(pending) != 1:
            raise RuntimeError(f"checkpoint step {self._saving}: expected one temporary directory "
                               f"{self._saving}{TMP_SUFFIX} in {self.directory}, found {pending}")
        integrity.write_record(pending[0], self._saving)

    def _remove_killed_runs_leftovers(self) -> None:
        """Before this Checkpointer's first save (process 0): what a killed run left (`remove_partial_saves`)
        goes, each path it could not remove named in one log line (left in place). Not when opened: a
        reader of a live run's directory would remove that run's save in flight."""
        if jax.process_index() != 0:
            return
        removed, left = remove_partial_saves(self.directory)
        for path in removed:
            log.info("checkpoint: %s, left by a run that was stopped while saving or rotating, removed", path)
        for path, reason in left.items():
            log.warning("checkpoint: %s, left by a run that was stopped while saving or rotating, could not be "
                        "removed (%s): left in place", path, reason)

    def save(self, step: int, state) -> None:
        step = int(step)
        if self._saving is None:
            self._remove_killed_runs_leftovers()
        with self._cleaning_up():  # the previous save ends first: its failure is its own step's
            self._manager.wait_until_finished()
        self._rotate()
        if step in self.unreadable:  # the damaged checkpoint of this step goes aside, not away
            aside = os.path.join(self.directory + ".unreadable", str(step))
            os.makedirs(os.path.dirname(aside), exist_ok=True)
            shutil.move(self.step_path(step), aside)
            self._manager.reload()
            log.warning("checkpoint step %d: the unreadable one moved to %s before saving a new one", step, aside)
            del self.unreadable[step]
        self._saving = step
        with self._cleaning_up():
            self._manager.save(step, args=ocp.args.StandardSave(state), force=True)
        if not self.async_save:
            self.wait()

    def own_steps(self) -> list[int]:
        """Steps this code saved, whole (`integrity.is_complete`: its record, every file listed there at
        its size), oldest first; a step `restore` found unreadable is not counted."""
        return [s for s in sorted(self.all_steps())
                if s not in self.unreadable and integrity.is_complete(self.step_path(s), s)]

    def _rotate(self) -> None:
        """Removes this run's oldest complete checkpoints beyond the newest `keep` (`own_steps`); a
        numbered directory that is not one (foreign, an older code's, or with a file missing or cut) is left
        in place and not counted, named once in a log line; one `restore` found unreadable likewise. A
        Checkpointer that has not saved (a reader, whose `keep` is not the run's) removes nothing."""
        if not self.keep or self._saving is None:
            return
        own = self.own_steps()
        others = sorted(set(self.all_steps()) - set(own) - set(self.unreadable) - self._told_unrecorded)
        if others and jax.process_index() == 0:
            log.warning("checkpoints %s in %s are not whole checkpoints of this run (no integrity record of this "
                        "code, or a file missing or cut): left in place, not counted by checkpoint.keep", others,
                        self.directory)
        self._told_unrecorded.update(others)
        if jax.process_index() != 0 or len(own) <= self.keep:
            return  # process 0 alone decides and removes (a shared directory): no barrier to miss
        for s in own[:-self.keep]:
            removing = os.path.join(self.directory, f".{s}{REMOVING_SUFFIX}")  # no longer a step, even half-removed
            os.rename(self.step_path(s), removing)
            shutil.rmtree(removing, ignore_errors=True)
        self._manager.reload()

    @contextlib.contextmanager
    def _cleaning_up(self):
        """A save that fails (now, or an earlier asynchronous one surfacing) leaves no partial step;
        a storage refusal is raised as an `OSError` naming the step's directory."""
        try:
            yield
        except BaseException as e:
            self.failed = e
            if jax.process_index() == 0:  # writes still in flight may recreate it: `close` removes it again
                removed, left = remove_partial_saves(self.directory)
                for path in removed:
                    log.debug("checkpoint: the partial save %s removed", path)
                for path, reason in left.items():
                    log.debug("checkpoint: the partial save %s not yet removed (%s)", path, reason)
            found = atomic.storage_error(e)
            if found is None:
                raise
            where = self.directory if self._saving is None else self.step_path(self._saving)
            raise OSError(found[0], os.strerror(found[0]), where) from e

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
        with _quiet_abandoned_reads() as reads:
            if step is not None:
                return self._restore_step(step, abstract, reads)
            steps = sorted(self.all_steps(), reverse=True)
            if not steps:
                raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
            for s in steps:
                try:
                    return self._restore_step(s, abstract, reads)
                except Exception as e:  # noqa: BLE001 - any read failure means: try the next older one
                    self.unreadable[s] = _reason(e)
                    log.warning("checkpoint step %d at %s is unreadable (%s): skipped, left in place",
                                s, self.step_path(s), self.unreadable[s])
            raise NoReadableCheckpoint(f"{self.directory}: none of the checkpoints {sorted(steps)} is readable "
                                       f"(newest, step {steps[0]}: {self.unreadable[steps[0]]})")

    def _restore_step(self, step: int, abstract, reads: _Reads):
        # Without the tree metadata orbax fails with a pytree-structure error that hides the cause.
        metadata = os.path.join(self.step_path(step), "default", "_METADATA")
        if not os.path.exists(metadata):
            raise FileNotFoundError(f"{metadata} is missing")
        if not integrity.verify(self.step_path(step), step) and step not in self._told_unrecorded:
            self._told_unrecorded.add(step)
            log.info("checkpoint step %d at %s has no integrity record (saved by older code): read unchecked",
                     step, self.step_path(step))
        try:
            return self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
        except Exception as e:  # noqa: BLE001 - a renamed field? then read it by its stored name
            reads.failed = True
            try:
                restored = self._restore_legacy(step, abstract)
            except Exception:  # noqa: BLE001 - unreadable either way: the template's error says why
                restored = None
            if restored is None:
                raise e
            restored, renamed, added = restored
            if renamed:
                log.info("checkpoint step %d at %s holds fields under their former names: read and renamed",
                         step, self.step_path(step))
            for name in added:  # a field this run does not use (None) starts as None: nothing to say
                if jax.tree.leaves(getattr(abstract, name)) and name not in SET_FROM_CONFIG:
                    log.info("checkpoint step %d at %s was saved before TrainState.%s (%s) existed: it starts "
                             "fresh", step, self.step_path(step), name, ADDED_FIELDS[name])
            return restored

    def _restore_legacy(self, step: int, abstract):
        """(state, renamed, added fields) of a checkpoint that stored some fields under their
        `LEGACY_NAMES`, lacks some `ADDED_FIELDS` of `abstract` or holds a `SET_FROM_CONFIG` field with
        other leaves (older code's `TrainState.hyper`), laid out like `abstract` (each leaf by its path,
        renamed where the new path is absent; a missing added field's leaves, and the leaves of a
        `SET_FROM_CONFIG` field that the checkpoint lacks, zeros); None when it has none of these or
        another leaf of `abstract` is missing or of another shape / dtype."""
        raw = self._manager.restore(step, args=ocp.args.StandardRestore())
        stored = _flat_by_path(raw)
        added = tuple(f for f in ADDED_FIELDS if hasattr(abstract, f) and isinstance(raw, dict) and f not in raw)
        paths, treedef = jax.tree_util.tree_flatten_with_path(abstract)
        leaves, renamed, replaced = [], False, False
        for path, want in paths:
            key = tuple(_key_name(k) for k in path)
            sharding = getattr(want, "sharding", None)
            have = None
            if key[0] not in added:
                if key not in stored and key[-1] in LEGACY_NAMES:
                    key, renamed = key[:-1] + (LEGACY_NAMES[key[-1]],), True
                have = stored.get(key)
            if have is None or have.shape != want.shape or have.dtype != want.dtype:
                if key[0] not in added and key[0] not in SET_FROM_CONFIG:
                    return None
                # an added field, or one the caller sets from the config (saved with other leaves): zeros
                replaced = replaced or key[0] not in added
                have = np.zeros(want.shape, want.dtype)
            leaves.append(jax.device_put(have, sharding) if sharding is not None else jax.numpy.asarray(have))
        if not (renamed or added or replaced):
            return None
        return jax.tree_util.tree_unflatten(treedef, leaves), renamed, added

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are on disk (then rotates, `_rotate`); raises a save's
        failure (its partial step removed)."""
        with self._cleaning_up():
            self._manager.wait_until_finished()
        self._rotate()

    def close(self) -> None:
        """Waits for the pending save and closes; after a failed save (already raised) it closes and
        removes the partial step again (writes still in flight at the failure may have recreated it)."""
        if self.failed is None:
            self.wait()
            self._manager.close()
            return
        with contextlib.suppress(Exception):  # the failure was raised once already
            self._manager.close()
        if jax.process_index() == 0:  # what its last writes left after the failure
            for path, reason in remove_partial_saves(self.directory)[1].items():
                log.warning("checkpoint: the partial save %s could not be removed (%s): left in place", path, reason)
