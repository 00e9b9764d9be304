"""The persistent XLA compilation cache the test processes share (tests/conftest.py), and its repair.

JAX's size-capped cache (`jax._src.lru_cache.LRUCache`) stores each program as `<key>-cache` and
its last use as `<key>-atime`, written one after the other under the cache's file lock. Before
every write it reads the `-atime` of every entry to decide what to evict, so one entry without
its `-atime` makes every later write fail (a `FileNotFoundError` warning): from then on no new
program is stored, and every run compiles again whatever changed since. A process killed
between the two writes leaves such an entry; the suite kills trainer subprocesses on purpose
(tests/test_preemption.py). `repair` removes the half-written entries; the session start and
every test that kills a JAX process using the cache call it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import filelock

CACHE_SUFFIX, ATIME_SUFFIX = "-cache", "-atime"
LOCK_NAME = ".lockfile"  # the lock JAX's LRUCache takes around every read and write

# Where the caches live when pytest has no cache folder (`-p no:cacheprovider`).
FALLBACK_DIR = os.path.join(tempfile.gettempdir(), "pipo_jax_test_compilation_cache")

SETTINGS = {
    "jax_persistent_cache_min_compile_time_secs": 0.1,  # skip the many tiny eager-op programs
    "jax_compilation_cache_max_size": 2 * 1024**3,  # bytes
}


def shared_dir() -> str | None:
    """The cache directory the test processes and their subprocesses use (set by conftest)."""
    return os.environ.get("JAX_COMPILATION_CACHE_DIR")


def repair(path: str | os.PathLike | None, lock_timeout_s: float = 60.0) -> int:
    """Removes the entries of the cache at `path` that lack their `-cache` or `-atime` half, under
    the cache's lock (a killed holder's lock is released by the kernel). Returns how many files
    it removed (0 for a missing directory or `path=None`)."""
    if path is None or not os.path.isdir(path):
        return 0
    root = Path(path)
    with filelock.FileLock(root / LOCK_NAME, timeout=lock_timeout_s):
        names = {p.name for p in root.iterdir()}
        orphans = [n for own, other in ((CACHE_SUFFIX, ATIME_SUFFIX), (ATIME_SUFFIX, CACHE_SUFFIX))
                   for n in names if n.endswith(own) and n[: -len(own)] + other not in names]
        for name in orphans:
            (root / name).unlink(missing_ok=True)
    return len(orphans)


def private_dir(name: str) -> str:
    """A cache directory beside the shared one, for the subprocesses of one test file only (kept
    between runs like the shared one; repaired now, as the session start repairs the shared one)."""
    path = f"{(shared_dir() or FALLBACK_DIR).rstrip(os.sep)}_{name}"
    os.makedirs(path, exist_ok=True)
    repair(path)
    return path
