"""The run's file writes, safe on a full or read-only disk, and its storage errors in one line.

`write_text_atomic` / `write_json_atomic`: the text goes to a temporary file in the target's
directory, is fsynced and renamed over the target, so a reader sees the old file or the new
one, never a cut one; a failed write removes its temporary and leaves the old file as it was.
`append_line`: one whole line appended, or (a failed write) the file cut back to its old size,
never a torn row. `storage_error` recognises a full disk, a read-only file system, a refused
permission or an exhausted quota (an `OSError`, or tensorstore's error text inside orbax's),
which the run reports as a `StorageError`: one line naming the path and what was kept.
"""

from __future__ import annotations

import errno
import json
import os
import re
import tempfile
from typing import Any

STORAGE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                  errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                  errno.EPERM: "operation not permitted"}
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")  # tensorstore's text for the errno
_TS_PATH = re.compile(r'(?:Failed writing|local file): "([^"]+)"')


class StorageError(RuntimeError):
    """The disk refused a write (full, read-only, no permission, quota): one line, exit status 2."""


def _fsync_dir(directory: str) -> None:
    """Makes a rename in `directory` durable (best effort: some file systems refuse a dir fsync)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _naming(e: OSError, path: str) -> OSError:
    """`e` (same type and errno) naming `path`, the file the caller asked for, not a temporary."""
    return type(e)(e.errno, e.strerror, path) if e.errno else e


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _umask() -> int:
    """The process's umask, read without changing it (Linux; else the usual 022)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return 0o022


def _mode_for(path: str) -> int:
    """The mode a rewritten `path` keeps: its own, or a new file's (0666 less the umask)."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def write_text_atomic(path: str, text: str) -> None:
    """Replaces `path` by `text` (UTF-8) all at once: temporary file, fsync, rename. On failure the
    temporary is removed, the old file is unchanged, and the error propagates."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    except OSError as e:
        raise _naming(e, path) from e
    try:
        try:
            os.fchmod(fd, _mode_for(path))
            _write_all(fd, text.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise _naming(e, path) from e
        raise
    _fsync_dir(directory)


def write_json_atomic(path: str, obj: Any, indent: int | None = 2) -> None:
    """`write_text_atomic` of `obj` as JSON, with a final newline."""
    write_text_atomic(path, json.dumps(obj, indent=indent) + "\n")


def append_line(path: str, line: str) -> None:
    """Appends `line` and a newline to `path` (created if missing) in one write, flushed to the
    kernel; a failed write cuts the file back to its old length, so no torn row is left."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            _write_all(fd, (line.rstrip("\n") + "\n").encode("utf-8"))
        except BaseException as e:
            os.ftruncate(fd, size)
            if isinstance(e, OSError):
                raise _naming(e, path) from e
            raise
    finally:
        os.close(fd)


def storage_error(e: BaseException) -> tuple[int, str | None] | None:
    """(errno, path) when `e` or an exception it was raised from is a storage refusal (a full
    disk, a read-only file system, a permission, a quota: `STORAGE_ERRNOS`); None for anything else."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
            return e.errno, e.filename
        code = _OS_ERROR_CODE.search(str(e))
        if code and int(code.group(1)) in STORAGE_ERRNOS:
            path = _TS_PATH.search(str(e))
            return int(code.group(1)), path.group(1) if path else None
        e = e.__cause__ or e.__context__
    return None


def storage_failure(e: BaseException, where: str, kept: str) -> StorageError:
    """The one-line `StorageError` of a storage refusal found in `e` (`storage_error`): the path
    (`where` when the error names none), the reason, and `kept`, what is left to resume from."""
    code, path = storage_error(e) or (errno.ENOSPC, None)
    return StorageError(f"{path or where}: {STORAGE_ERRNOS[code]} ({kept}; the files written before are "
                        "unchanged); free space or make it writable, then rerun the same command to resume")
