"""The run directory's guards: one run at a time (`WorkdirLock`), and a resumed run's
config compared with the one its checkpoints were trained under (`config_changes`,
`keep_config`).

The lock is an advisory `flock` on the workdir; `<workdir>/.lock` holds the holder's pid,
host, start time and command line. The kernel releases a `flock` when its process dies,
SIGKILL included, so a `.lock` file whose directory nobody has locked is stale: it is taken
over with a warning naming the dead holder. The holder's record is written as soon as the
lock is taken, before any check of the run, so a second run started at the same moment
names the holder's pid. A held lock refuses the second run with one line naming its holder.
(`flock` holds across processes of one host and on local and cluster file systems that
implement it; on NFS it depends on the server.)
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import logging
import os
import socket
import sys
from typing import Any, Iterable

from pipo_jax.config.sections import ConfigError, RunConfig
from pipo_jax.run import atomic
from pipo_jax.config.schema import moved_keys, to_config

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"
CONFIG_NAME = "config.json"
# The run's own files and directories in its workdir: each must be a regular file / a directory
# where it exists (`check_run_files`), so that nothing the run opens can block it (a FIFO) or be
# mistaken for its own (a file where checkpoints/ belongs).
WARMUP_CHECKPOINTS_NAME = "warmup_checkpoints"
RUN_FILES = (CONFIG_NAME, "metrics.jsonl", "metrics.superseded.jsonl", "summary.json")
RUN_DIRS = ("checkpoints", WARMUP_CHECKPOINTS_NAME, "tensorboard")

# Keys a resumed run may change freely (each change is still logged and the old config kept):
# they decide how long the run goes, where it runs, what it logs and evaluates and how it
# checkpoints, never what an iteration computes.
FREE_PREFIXES = ("iterations", "log.", "eval.", "mesh.", "distributed.", "checkpoint.")


class WorkdirError(RuntimeError):
    """The workdir cannot be used as asked (locked by a live run, not a directory, a damaged file)."""


def _describe(holder: dict[str, Any]) -> str:
    return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} since {holder.get('started', '?')} "
            f"({holder.get('command', '?')})")


class WorkdirLock:
    """`acquire()` / `release()`: the one run allowed in `workdir`.

    `acquire` takes an exclusive `flock` on the directory itself and at once writes the
    holder's pid, host, start time and command to `.lock` (`record`) for a second run's
    message; `release` removes it, so a refused run (a config error, a resume refused)
    leaves the workdir as it was. Raises
    `WorkdirError` when another live process holds the directory. A `.lock` found while
    the flock is free is a dead run's: taken over with a warning. A workdir `acquire`
    created is removed again by `release` if nothing was written into it.
    """

    def __init__(self, workdir: str):
        self.workdir = os.path.abspath(workdir)
        self.path = os.path.join(self.workdir, LOCK_NAME)
        self._fd: int | None = None
        self._recorded = False
        self._untouched: tuple[list[str], int, int] = ([], 0, 0)  # entries and times before the record
        self.created_dir = False

    def acquire(self) -> "WorkdirLock":
        if os.path.exists(self.workdir) and not os.path.isdir(self.workdir):
            raise WorkdirError(f"--workdir {self.workdir} is a file, not a directory")
        if not os.path.exists(self.workdir):
            os.makedirs(self.workdir)
            self.created_dir = True
        fd = os.open(self.workdir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise WorkdirError(f"{self.workdir} is in use by another run: {_describe(self._read_holder())}; wait "
                               "for it to end or use another --workdir") from None
        self._fd = fd
        try:
            atomic.check_regular(self.path)  # a FIFO there would block the holder's read below
        except atomic.NotRegularFile:
            self.release()
            raise
        stale = self._read_holder()
        if stale:
            log.warning("%s: taking over the stale lock of %s, which is no longer running", self.workdir,
                        _describe(stale))
        st = os.stat(self.workdir)
        self._untouched = (sorted(os.listdir(self.workdir)), st.st_atime_ns, st.st_mtime_ns)
        try:
            self.record()
        except BaseException:
            self.release()  # e.g. a read-only or full disk: the flock goes, the caller reports why
            raise
        return self

    def record(self) -> None:
        """Writes the holder's description into `.lock` (atomically; `acquire` calls it)."""
        me = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": datetime.datetime.now().isoformat(timespec="seconds"), "command": " ".join(sys.argv)}
        atomic.write_json_atomic(self.path, me, indent=None)
        self._recorded = True

    def _restore_mtime(self) -> None:
        """A run that wrote nothing but its lock record (a refused one) leaves the workdir's times as
        they were: its entries are those `acquire` found."""
        names, atime, mtime = self._untouched
        try:
            if sorted(os.listdir(self.workdir)) == names:
                os.utime(self.workdir, ns=(atime, mtime))
        except OSError:
            pass

    def _read_holder(self) -> dict[str, Any]:
        try:
            with atomic.open_regular(self.path, errors="replace") as f:  # never blocks on a FIFO
                text = f.read()
        except (OSError, atomic.NotRegularFile):
            return {}
        try:
            holder = json.loads(text) if text.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return {"command": f"unparsable lock file {text[:80]!r}"}
        return holder if isinstance(holder, dict) else {}

    def release(self) -> None:
        if self._fd is None:
            return
        if self._recorded:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self._restore_mtime()
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
        self._recorded = False
        if self.created_dir and not os.listdir(self.workdir):
            os.rmdir(self.workdir)

    def __enter__(self) -> "WorkdirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def stored_form(run: RunConfig) -> dict[str, Any]:
    """The typed run config as its config.json holds it: nested dicts of JSON values, in the schema's
    key order (`schema.to_config`; `RunConfig.from_config` reads it back)."""
    return json.loads(json.dumps(to_config(run)))


def flat_config(tree: dict[str, Any]) -> dict[str, Any]:
    """`{"pipo.window": 8, ...}`: the leaves of a nested config `tree` (a config.json's, `stored_form`)."""
    out: dict[str, Any] = {}

    def walk(node: dict, prefix: str) -> None:
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = v

    walk(tree, "")
    return out


def check_run_files(workdir: str) -> None:
    """Refuses, in one line, a run file of `workdir` (`RUN_FILES`) that is no regular file (a FIFO, a
    device: `atomic.NotRegularFile`) or a run directory (`RUN_DIRS`) that is no directory
    (`WorkdirError`); `stat` only, which never blocks."""
    for name in RUN_FILES:
        atomic.check_regular(os.path.join(workdir, name))
    for name in RUN_DIRS:
        path = os.path.join(workdir, name)
        if os.path.exists(path) and not os.path.isdir(path):
            raise WorkdirError(f"{path}: {atomic.file_kind(os.stat(path).st_mode)}, not a directory (the run keeps "
                               f"its {name} there): move it aside")


def read_config_json(path: str) -> dict[str, Any]:
    """The config a run stored at `path` (a JSON object; keys a release moved, at their new place).
    Raises `WorkdirError` for a file that does not parse or holds no JSON object, `NotRegularFile`
    for a FIFO or a device, `FileNotFoundError` when there is none."""
    try:
        with atomic.open_regular(path) as f:
            tree = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WorkdirError(f"{path}: not a config JSON ({e}); move it aside to resume") from None
    except RecursionError:
        raise WorkdirError(f"{path}: not a config JSON (nested too deep to parse); move it aside to resume") from None
    if not isinstance(tree, dict):
        raise WorkdirError(f"{path}: not a config JSON (a JSON {type(tree).__name__ if tree is not None else 'null'}, "
                           "not an object); move it aside to resume")
    return moved_keys(tree)


def read_stored_config(workdir: str) -> dict[str, Any] | None:
    """The flat config a run in `workdir` stored (None if there is none). Raises `WorkdirError`
    for a file that does not parse or is no JSON object (`read_config_json`)."""
    path = os.path.join(workdir, CONFIG_NAME)
    if not os.path.lexists(path):
        return None
    return flat_config(read_config_json(path))


def config_changes(stored: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """`{key: (stored value, new value)}` for every key both configs hold with different values."""
    return {k: (stored[k], new[k]) for k in sorted(set(stored) & set(new)) if stored[k] != new[k]}


def schema_drift(stored: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(keys only `new` holds, keys only `stored` holds): keys the code added or removed since
    the run was stored. Not a change of the user's settings (the code's own behaviour is not
    gated either); the trainer logs them and rewrites config.json, keeping the old one."""
    return sorted(set(new) - set(stored)), sorted(set(stored) - set(new))


def is_free(key: str) -> bool:
    """Whether `key` is a run-control key (`FREE_PREFIXES`) a resumed run may change without asking."""
    return any(key == p or key.startswith(p) for p in FREE_PREFIXES)


def describe_changes(changes: dict[str, tuple[Any, Any]], keys: Iterable[str]) -> str:
    return ", ".join(f"{k}: {changes[k][0]!r} -> {changes[k][1]!r}" for k in keys)


def keep_config(workdir: str, step: int | str) -> str:
    """Copies the stored config aside as `config.<step>.json` (the config in force up to `step`;
    `config.<step>.<n>.json` if that exists) and returns its path. A copy, not a move: until the
    new config.json replaces it (`write_config`), config.json stays the stored one."""
    with atomic.open_regular(os.path.join(workdir, CONFIG_NAME)) as f:
        text = f.read()
    path = os.path.join(workdir, f"config.{step}.json")
    n = 1
    while os.path.lexists(path):
        with atomic.open_regular(path) as f:
            if f.read() == text:  # kept already by an attempt that failed before replacing config.json
                return path
        path = os.path.join(workdir, f"config.{step}.{n}.json")
        n += 1
    atomic.write_text_atomic(path, text)
    return path


def write_config(workdir: str, text: str) -> None:
    """Replaces config.json by `text` atomically: a failed write (a full disk) keeps the old one."""
    atomic.write_text_atomic(os.path.join(workdir, CONFIG_NAME), text)


def refuse_shape_changes(shape_keys: list[str], changes: dict[str, tuple[Any, Any]], checkpoint_dir: str) -> None:
    """The one-line error for a resume whose config changes the shapes of the saved state."""
    raise ConfigError(f"resume: the checkpoints in {checkpoint_dir} hold a state of another shape; these changed "
                      f"keys change it: {describe_changes(changes, shape_keys)} (use a new --workdir, or set them "
                      "back)")
