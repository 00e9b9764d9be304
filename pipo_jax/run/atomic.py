"""The run's file writes, safe on a full or read-only disk, and its storage errors in one line.

`write_text_atomic` / `write_json_atomic`: the text goes to a temporary file in the target's
directory, is fsynced and renamed over the target, so a reader sees the old file or the new
one, never a cut one; a failed write removes its temporary and leaves the old file as it was.
`append_line`: one whole line appended, or (a failed write) the file cut back to its old size,
never a torn row. `storage_error` recognises a full disk, a read-only file system, a refused
permission or an exhausted quota (an `OSError`, tensorstore's error text inside orbax's, or a
Rust library's `(os error N)` such as safetensors'), which the run reports as a `StorageError`:
one line naming the path and what was kept.
`open_regular` opens a run's own file without blocking on a FIFO or a device found in its place
and refuses anything but a regular file (`NotRegularFile`, one line).
"""

from __future__ import annotations

import errno
import json
import os
import fcntl
import re
import stat
import tempfile
from typing import Any

STORAGE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                  errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                  errno.EPERM: "operation not permitted"}
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)|\(os error (\d+)\)")  # tensorstore's / Rust's (safetensors) errno
_TS_PATH = re.compile(r'(?:Failed writing|local file): "([^"]+)"')


class StorageError(RuntimeError):
    """The disk refused a write (full, read-only, no permission, quota): one line, exit status 2."""


class NotRegularFile(RuntimeError):
    """A run's own file is a FIFO, a device, a socket or a directory: one line, exit status 2."""


_KINDS = ((stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """'a FIFO', 'a directory', 'a regular file', ... for a `st_mode` (what a file is, in words)."""
    return next((name for test, name in _KINDS if test(mode)), "a file of another kind")


def not_regular(path: str, mode: int) -> NotRegularFile:
    return NotRegularFile(f"{path}: {file_kind(mode)}, not a regular file (the run reads and writes only regular "
                          "files there): move it aside")


def check_regular(path: str) -> None:
    """Raises `NotRegularFile` when `path` exists (its links followed) and is no regular file; `stat`
    never blocks, whatever the file is."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise not_regular(path, st.st_mode)


def _stat_or_none(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def open_regular_fd(path: str, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """`os.open(path, flags)` that never blocks on a FIFO (opened `O_NONBLOCK`, the flag cleared once the
    file is known to be regular) and refuses anything but a regular file (`NotRegularFile`)."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:  # ENXIO: a FIFO opened for writing with no reader; ENODEV etc.: a device
        st = _stat_or_none(path)
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise not_regular(path, st.st_mode) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(path, st.st_mode)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: str, encoding: str = "utf-8", errors: str = "strict"):
    """The regular file `path` opened for reading as text (`open_regular_fd`: never blocks, refuses a
    FIFO or a device with `NotRegularFile`)."""
    return os.fdopen(open_regular_fd(path), "r", encoding=encoding, errors=errors)


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
    append_bytes(path, (line.rstrip("\n") + "\n").encode("utf-8"))


def append_bytes(path: str, data: bytes) -> None:
    """Appends `data` to the regular file `path` (created if missing; `NotRegularFile` for a FIFO or a
    device) in one write; a failed write cuts the file back to its old length."""
    try:
        fd = open_regular_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except OSError as e:
        raise _naming(e, path) from e
    try:
        size = os.fstat(fd).st_size
        try:
            _write_all(fd, data)
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
        number = int(code.group(1) or code.group(2)) if code else None
        if number in STORAGE_ERRNOS:
            path = _TS_PATH.search(str(e))
            return number, path.group(1) if path else None
        e = e.__cause__ or e.__context__
    return None


def storage_failure(e: BaseException, where: str, kept: str) -> StorageError:
    """The one-line `StorageError` of a storage refusal found in `e` (`storage_error`): the path
    (`where` when the error names none), the reason, and `kept`, what is left to resume from."""
    return StorageError(f"{storage_refusal(e, where)} ({kept}; the files written before are "
                        "unchanged); free space or make it writable, then rerun the same command to resume")


def storage_refusal(e: BaseException, where: str) -> str:
    """`<path>: no space left on device` (the reason of the storage refusal found in `e`; `where` when
    the error names no path)."""
    code, path = storage_error(e) or (errno.ENOSPC, None)
    return f"{path or where}: {STORAGE_ERRNOS[code]}"
