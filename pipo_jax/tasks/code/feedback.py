"""Feedback text: clipped messages, safe reprs, an exception's one line."""
from __future__ import annotations

import errno
import signal
import traceback
from typing import Any


_FEEDBACK_CHARS = 300


def _clip(text: str, n: int = 100) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _clip_text(s: str) -> str:
    return s if len(s) <= _FEEDBACK_CHARS else s[: _FEEDBACK_CHARS - 3] + "..."


def _error_message(e: BaseException) -> str:
    line = ""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if frame.filename == "<solution>":
            line = f" (solution line {frame.lineno})"
            break
    if isinstance(e, OSError) and e.errno == errno.EFBIG:  # RLIMIT_FSIZE (Python ignores SIGXFSZ)
        return f"output limit exceeded: {e.strerror}{line}"
    try:
        detail = str(e)
    except Exception:  # a solution's exception whose __str__ fails
        detail = "<unprintable>"
    text = f"{type(e).__name__}: {detail}" if detail else type(e).__name__
    return _clip_text(text + line)


def _safe_repr(x: Any) -> str:
    try:
        return repr(x)
    except Exception as e:  # a user __repr__ may itself fail
        return f"<unprintable {type(x).__name__}: {type(e).__name__}>"


def _ended_badly(rc: int | None, killed: bool, timeout_s: float, max_output_bytes: int) -> tuple[str, str]:
    """(outcome, message) for a process that stopped before reporting a test."""
    if killed:
        return "timeout", f"limit {timeout_s:g} s"
    if rc is not None and rc < 0:
        if -rc == signal.SIGXCPU:
            return "timeout", "CPU time limit"
        if -rc == signal.SIGXFSZ:
            return "crash", f"output limit of {max_output_bytes} bytes exceeded"
        try:
            return "crash", signal.Signals(-rc).name
        except ValueError:
            return "crash", f"signal {-rc}"
    return "crash", f"exited with status {rc}"

