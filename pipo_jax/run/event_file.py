"""A TensorBoard event file of scalars, written synchronously on the caller's thread.

tensorboardX's `SummaryWriter` writes through a background thread and a bounded queue: when a
write fails (a full disk) the thread dies and the next `add_scalar` blocks forever on the full
queue. Here each `write` appends one iteration's events (TFRecord framing, the events as
tensorboardX makes them) in one `atomic.append_bytes`: it returns or raises, and a failed write
cuts the file back, so the file never holds a torn record and a later write can succeed.
"""

from __future__ import annotations

import os
import socket
import struct
import time

from pipo_jax.run import atomic

FILE_VERSION = "brain.Event:2"


def _record(event) -> bytes:
    """One TFRecord of an `event_pb2.Event`: length, its masked crc32c, the serialized event, its masked crc32c."""
    from tensorboardX.record_writer import masked_crc32c  # optional: only a run that logs to TensorBoard

    data = event.SerializeToString()
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


class ScalarEventFile:
    """`write(step, {tag: value})` into `<logdir>/events.out.tfevents.<time>.<host><suffix>`.

    `purge_step`: the file opens with a SessionLog START at that step, which makes TensorBoard drop
    the events earlier files logged at steps >= it (a resumed run's redone iterations), as
    tensorboardX's `purge_step` does. The file and its opening events are written with the first
    `write` that succeeds."""

    def __init__(self, logdir: str, purge_step: int | None = None, filename_suffix: str = ""):
        self.logdir = logdir
        self.path = os.path.join(logdir, f"events.out.tfevents.{str(time.time())[:10]}.{socket.gethostname()}"
                                         f"{filename_suffix}")
        self.purge_step = purge_step
        self._opened = False

    def _opening(self) -> bytes:
        from tensorboardX.proto import event_pb2

        events = [event_pb2.Event(wall_time=time.time(), file_version=FILE_VERSION)]
        if self.purge_step is not None:
            events += [event_pb2.Event(step=self.purge_step, file_version=FILE_VERSION),
                       event_pb2.Event(step=self.purge_step,
                                       session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START))]
        return b"".join(_record(e) for e in events)

    def write(self, step: int, values: dict[str, float]) -> None:
        """Appends one event per tag at `step` (the tags cleaned as tensorboardX cleans them), all in one
        write; raises the write's `OSError` with the file as it was."""
        from tensorboardX.proto import event_pb2
        from tensorboardX.summary import scalar

        now = time.time()
        data = b"".join(_record(event_pb2.Event(wall_time=now, step=int(step), summary=scalar(tag, value)))
                        for tag, value in values.items())
        if not self._opened:
            os.makedirs(self.logdir, exist_ok=True)
            data = self._opening() + data
        atomic.append_bytes(self.path, data)
        self._opened = True
