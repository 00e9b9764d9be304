"""Real storage faults for tests: a tiny tmpfs (full, or remounted read-only), mounted where the
test runs as root with mount rights; elsewhere the test is skipped."""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess

import pytest


@contextlib.contextmanager
def tmpfs(path: pathlib.Path, size: str = "64k"):
    """A tmpfs of `size` mounted at `path` (created) for the block; skips the test where mount is refused."""
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                         text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or res.returncode})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def read_only(path: pathlib.Path) -> None:
    """Remounts the tmpfs at `path` read-only."""
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True, capture_output=True)


def fill(path: pathlib.Path, leave: int = 0) -> pathlib.Path:
    """Fills the file system of `path` up to `leave` free bytes with a file `path/filler`; returns it."""
    st = os.statvfs(path)
    filler = path / "filler"
    with contextlib.suppress(OSError), open(filler, "wb") as f:
        f.write(b"\1" * max(0, st.f_bavail * st.f_frsize - leave))
    return filler
