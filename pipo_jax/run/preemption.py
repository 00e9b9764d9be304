"""SIGTERM / SIGINT as a request to stop at the next safe point, not a kill.

A cluster preempting a job (SLURM, Kubernetes, a TPU VM) sends SIGTERM and waits a grace
period before SIGKILL; Ctrl-C sends SIGINT. Inside `StopRequests()` the first of either
only records itself: the trainer finishes the iteration chunk in flight, saves a
checkpoint, waits for it to be on disk and raises `RunInterrupted`. A second signal of
the same kind acts as it would without this (SIGINT: `KeyboardInterrupt`; SIGTERM: the
process ends), for a user who does not want to wait.
"""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunInterrupted(Exception):
    """The run stopped on signal `signum` with its state `at` (e.g. "iteration 40") saved in `checkpoint`."""

    def __init__(self, signum: int, at: str, checkpoint: str):
        self.signum, self.at = int(signum), at
        super().__init__(f"stopped by {signal.Signals(signum).name} at {at}, checkpoint saved in {checkpoint}: "
                         "run the same command again to resume")


class StopRequests:
    """Records SIGTERM / SIGINT while active (`requested`: the first signal's number, or None).

    Handlers can only be installed from the main thread; elsewhere (a run started from a
    worker thread) this does nothing and signals keep their default effect.
    """

    def __init__(self):
        self.requested: int | None = None
        self._previous: dict[int, object] = {}

    def _handler(self, signum, frame) -> None:
        if self.requested is None:
            self.requested = signum
            log.warning("%s received: stopping after the iteration in flight and saving a checkpoint "
                        "(send it again to stop at once)", signal.Signals(signum).name)
            previous = self._previous.get(signum)
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()
