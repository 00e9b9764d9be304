"""Wall-clock limits inside the children: the per-test timer and the judge's SIGTERM."""
from __future__ import annotations

import signal


class _TestTimeout(BaseException):
    """Raised by the per-test timer; BaseException so `except Exception` misses it."""


class _Terminate(BaseException):
    """SIGTERM to the judge: the parent's deadline passed."""


def _on_terminate(signum, frame):
    raise _Terminate()


def _timed(fn, timeout_s: float):
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _on_alarm(signum, frame):
    raise _TestTimeout()
