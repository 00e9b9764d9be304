"""A full or read-only disk never corrupts a run's files: writes are atomic (the old file stays
readable, no temporary is left), a failed append leaves no torn row, a refused checkpoint save
leaves no partial step, and the failure is a `StorageError` naming the path."""

import errno
import os

import numpy as np
import pytest

from pipo_jax.run import atomic
from pipo_jax.run.checkpoint import Checkpointer, saved_steps
from tests import disk


def _enospc_after(limit):
    """An `os.write` that writes at most `limit` bytes in all, then fails with ENOSPC."""
    real, written = os.write, [0]

    def write(fd, data):
        room = limit - written[0]
        if room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real(fd, bytes(data[:room]))
        written[0] += n
        return n
    return write


def test_a_failed_atomic_write_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_text('{"old": true}\n')
    with monkeypatch.context() as m:
        m.setattr(os, "write", _enospc_after(4096))
        with pytest.raises(OSError) as raised:
            atomic.write_json_atomic(str(path), {"new": "x" * 10_000})
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)  # the target, not a temporary
    assert path.read_text() == '{"old": true}\n'
    assert sorted(os.listdir(tmp_path)) == ["config.json"]
    atomic.write_json_atomic(str(path), {"new": 1})  # space back: replaced whole
    assert path.read_text() == '{\n  "new": 1\n}\n'


def test_a_failed_append_leaves_no_torn_row(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n')
    with monkeypatch.context() as m:
        m.setattr(os, "write", _enospc_after(10))
        with pytest.raises(OSError, match="No space left"):
            atomic.append_line(str(path), '{"step": 1, "reward": 0.123456789}')
    assert path.read_text() == '{"step": 0}\n'


def test_a_checkpoint_save_the_disk_refuses_leaves_no_partial_step(tmp_path):
    with disk.tmpfs(tmp_path / "fs", "64k") as fs:
        ckpt = Checkpointer(str(fs / "checkpoints"), keep=2)
        state = {"w": np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)}  # 256 KB
        with pytest.raises(OSError) as raised:
            ckpt.save(0, state)
            ckpt.wait()
        ckpt.close()
        assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(fs / "checkpoints" / "0")
        assert os.listdir(fs / "checkpoints") == []  # no `0.orbax-checkpoint-tmp` left
        assert saved_steps(str(fs / "checkpoints")) == []
        failure = atomic.storage_failure(raised.value, str(fs), "no checkpoint yet")
        assert str(failure).startswith(f"{fs / 'checkpoints' / '0'}: no space left on device (no checkpoint yet;")
