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
from tests.typed import spec_of


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


def test_a_full_disk_never_blocks_or_stops_the_run_logger(tmp_path, caplog):
    """On a real full tmpfs: every sink's write fails at once (no thread to die, no queue to block on), each
    says so in one warning line until it writes again, the files stay whole (no torn row or record), and
    the rows after space is back are written, the gap named in one line."""
    import logging
    import threading

    from pipo_jax.run import observe
    from tests.rl.test_observe import read_events, scalars

    with disk.tmpfs(tmp_path / "fs", "256k") as fs:
        logger = observe.RunLogger(str(fs / "run"), total=40, progress=False, tensorboard=True)
        for s in range(3):
            logger.log(s, {"xi": float(s), "reward_mean": 0.5})
        filler = disk.fill(fs)
        logged = threading.Event()

        def log_while_full():  # rows of 400 values (> 4 KiB): none fits in what is left of a file's last page
            for s in range(3, 31):
                logger.log(s, {"xi": float(s), **{f"reward_component/c{i}": 0.5 for i in range(400)}})
            logged.set()

        with caplog.at_level(logging.WARNING, logger="pipo_jax.run.observe"):
            worker = threading.Thread(target=log_while_full, daemon=True)
            worker.start()
            assert logged.wait(timeout=60), "logging blocked on a full disk"
            full = [r.getMessage() for r in caplog.records]
            filler.unlink()
            logger.log(31, {"xi": 31.0})
            logger.close(plots=False)
        again = [r.getMessage() for r in caplog.records][len(full):]
        metrics, tb = str(fs / "run" / "metrics.jsonl"), logger._tb.path
        enospc = "OSError: [Errno 28] No space left on device"
        assert full == [f"{metrics}: a write failed ({enospc}: '{metrics}'): training goes on; its rows are dropped "
                        "until it writes again",
                        f"{tb}: a write failed ({enospc}: '{tb}'): training goes on; its rows are dropped until it "
                        "writes again"]
        assert again == [f"{metrics}: written again; 28 rows of iterations 3-30 were dropped",
                         f"{tb}: written again; 28 rows of iterations 3-30 were dropped"]
        assert [r["step"] for r in observe.read_metrics(metrics)] == [0, 1, 2, 31]
        assert sorted(s for (tag, s) in scalars(read_events(fs / "run")) if tag == "xi") == [0, 1, 2, 31]


def test_a_fifo_put_in_a_sinks_place_is_one_warning_not_a_hang(tmp_path, caplog):
    import logging

    from pipo_jax.run import observe

    logger = observe.RunLogger(str(tmp_path), total=4, progress=False, tensorboard=False)
    logger.log(0, {"xi": 0.0})
    os.remove(tmp_path / "metrics.jsonl")
    os.mkfifo(tmp_path / "metrics.jsonl")  # nobody reads it: a blocking open would wait forever
    with caplog.at_level(logging.WARNING, logger="pipo_jax.run.observe"):
        for s in (1, 2):
            logger.log(s, {"xi": float(s)})
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'metrics.jsonl'}: a write failed (NotRegularFile: {tmp_path / 'metrics.jsonl'}: a FIFO, not a "
        "regular file (the run reads and writes only regular files there): move it aside): training goes on; its "
        "rows are dropped until it writes again"]


def test_an_export_the_full_disk_refuses_is_one_warning_and_leaves_no_half_directory(tmp_path, caplog):
    """The trainer's end-of-run export on a real full tmpfs: one warning naming the checkpoint that holds
    the state; neither `hf_export/` nor its `.partial` is left (a server would load a half-written one)."""
    import logging

    import jax

    from configs import grpo
    from pipo_jax.models import qwen3
    from pipo_jax.run import export as export_lib
    from pipo_jax.run import trainer

    spec = spec_of(grpo.get_config("micro"))
    params = qwen3.init_params(spec.model, jax.random.PRNGKey(0))
    with disk.tmpfs(tmp_path / "fs", "64k") as fs:  # the weights (~0.7 MB) do not fit
        export = str(fs / "hf_export")
        with caplog.at_level(logging.WARNING, logger="pipo_jax.run.trainer"):
            written = trainer._written_or_warned(
                "hf_export", export, "/run/checkpoints/2",
                lambda: trainer._export_whole(export, lambda out: export_lib.write_export(out, spec.model, params,
                                                                                          spec=spec)))
        assert written is False and os.listdir(fs) == []
        lines = [r.getMessage() for r in caplog.records]
        assert lines == [f"hf_export: not written ({export}: no space left on device); the run's final state is in "
                         "the checkpoint /run/checkpoints/2"]  # safetensors' error names no file
