"""A dataset path that is no regular file (a FIFO, a link to /dev/zero), a runaway line or an
empty file is a `DataError` naming the file, returned at once: no hang, no exhausted memory."""

import concurrent.futures
import os

import pytest

from pipo_jax.data import sources
from pipo_jax.data.sources import DataError, SourceConfig, load_examples


def _load_promptly(path, unblock=None, **kw):
    """`load_examples` of `path`, failing the test (after `unblock()`) if it takes over 20 s."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(load_examples, SourceConfig(str(path), **kw))
    try:
        return future.result(timeout=20)
    except concurrent.futures.TimeoutError:
        if unblock is not None:
            unblock()
        pytest.fail(f"load_examples({path}) still running after 20 s")
    finally:
        pool.shutdown(wait=False)


def test_a_fifo_is_refused_at_once_naming_it(tmp_path):
    fifo = tmp_path / "train.jsonl"
    os.mkfifo(fifo)

    def unblock():  # a writer end releases a reader blocked in open()
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    with pytest.raises(DataError, match=rf"^{fifo}: a FIFO, not a regular file"):
        _load_promptly(fifo, unblock)


@pytest.mark.parametrize("name", ["train.jsonl", "train.parquet"])
def test_a_link_to_dev_zero_is_refused_naming_it_and_its_target(tmp_path, name):
    link = tmp_path / name
    link.symlink_to("/dev/zero")
    with pytest.raises(DataError, match=rf"^{link} \(a link to /dev/zero\): a character device, not a regular file"):
        _load_promptly(link)


def test_a_line_past_the_cap_is_refused_naming_the_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "MAX_LINE_BYTES", 1000)
    path = tmp_path / "d.jsonl"
    path.write_text('{"problem": "1+1", "answer": "2"}\n' + '{"problem": "' + "9" * 5000 + '", "answer": "1"}\n')
    with pytest.raises(DataError, match=rf"^{path}:2: a line longer than 1000 bytes, not a JSONL row"):
        load_examples(SourceConfig(str(path)))
    path.write_text('{"problem": "1+1", "answer": "2"}\n' * 3)  # lines under the cap read as before
    assert len(load_examples(SourceConfig(str(path)))) == 3


def test_an_empty_file_says_no_rows_naming_it(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(DataError, match=rf"^{path}: no rows \(an empty jsonl source\)"):
        load_examples(SourceConfig(str(path)))
    path.write_text("\n\n")  # blank lines only: no rows either
    with pytest.raises(DataError, match="no rows"):
        load_examples(SourceConfig(str(path)))
    assert load_examples(SourceConfig(str(path), limit=0)) == []  # none asked for: none is right
