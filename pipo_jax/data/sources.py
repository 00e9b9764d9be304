"""Dataset sources: JSONL (optionally gzipped), parquet and tensorflow-datasets.

Each row becomes an `Example` (prompt, answer, extra fields, origin). Field names are
configurable and may be dotted paths into nested objects (``reward_model.ground_truth``).
A prompt is either the question text or a list of chat messages
``[{"role": ..., "content": ...}]``. Any malformed row raises `DataError` naming the
file and line (JSONL, 1-based) or row (parquet / tfds, 0-based).

A file is read only when it is a regular file once its symlinks are resolved (a FIFO would
block the read forever, a device such as /dev/zero never ends), a JSONL line only up to
`MAX_LINE_BYTES`, and a source with no row at all is an error naming it.
"""
from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import logging
import os
import stat
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from pipo_jax import native_banners

logger = logging.getLogger(__name__)

FORMATS = ("auto", "jsonl", "parquet", "tfds")
MAX_LINE_BYTES = 64 * 2**20  # one JSONL row; longer is not a dataset row (a runaway file)


class DataError(ValueError):
    """A dataset file or row that cannot be used; the message names where."""


@dataclasses.dataclass(frozen=True)
class Example:
    """One problem: prompt text or chat messages, reference answer, extras, origin."""

    prompt: str | list[dict[str, str]]
    answer: Any
    extra: dict[str, Any]
    origin: str  # "file.jsonl:12", "file.parquet row 3", "tfds name/split row 3"


@dataclasses.dataclass(frozen=True)
class SourceConfig:
    """Where the data is and which fields to read.

    path: file path (jsonl / jsonl.gz / parquet) or the tfds dataset name.
    format: "auto" picks by extension; "tfds" must be explicit.
    prompt_field / answer_field: dotted field paths; answer_field None = no answer.
    extra_fields: further dotted fields kept in ``Example.extra`` (e.g. tests).
    split, data_dir, tfds_download: tensorflow-datasets only.
    limit: keep the first ``limit`` rows (None = all).
    """

    path: str
    format: str = "auto"
    prompt_field: str = "problem"
    answer_field: str | None = "answer"
    extra_fields: tuple[str, ...] = ()
    split: str = "train"
    data_dir: str | None = None
    tfds_download: bool = False
    limit: int | None = None

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ValueError(f"SourceConfig.format must be one of {FORMATS}, got {self.format!r}")
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"SourceConfig.limit must be >= 0 or None, got {self.limit}")
        if not self.prompt_field:
            raise ValueError("SourceConfig.prompt_field must be a field name")


def resolve_format(config: SourceConfig) -> str:
    """The concrete format of a source ("jsonl", "parquet" or "tfds")."""
    if config.format != "auto":
        return config.format
    name = config.path.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".json.gz", ".ndjson")):
        return "jsonl"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    raise DataError(f"cannot tell the format of {config.path!r} from its extension; set SourceConfig.format "
                    "('jsonl', 'parquet' or 'tfds')")


def get_field(row: dict, dotted: str, where: str) -> Any:
    """``row["a"]["b"]`` for ``dotted="a.b"``; DataError naming ``where`` if missing."""
    value: Any = row
    for depth, key in enumerate(dotted.split(".")):
        if not isinstance(value, dict) or key not in value:
            inside = ".".join(dotted.split(".")[:depth]) or "the row"
            keys = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise DataError(f"{where}: missing field {dotted!r} ({inside} has {keys})")
        value = value[key]
    return value


def _check_prompt(prompt: Any, field: str, where: str) -> str | list[dict[str, str]]:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DataError(f"{where}: field {field!r} is an empty string")
        return prompt
    if isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt):
        return [{"role": m["role"], "content": m["content"]} for m in prompt]
    raise DataError(f"{where}: field {field!r} must be a string or a list of {{'role', 'content'}} messages, "
                    f"got {type(prompt).__name__}: {str(prompt)[:80]!r}")


def example_from_row(row: Any, config: SourceConfig, where: str) -> Example:
    """Map one decoded row to an `Example`, validating the fields."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object, got {type(row).__name__}")
    prompt = _check_prompt(get_field(row, config.prompt_field, where), config.prompt_field, where)
    answer = None
    if config.answer_field is not None:
        answer = get_field(row, config.answer_field, where)
        if answer is None:
            raise DataError(f"{where}: field {config.answer_field!r} is null")
    extra = {f: get_field(row, f, where) for f in config.extra_fields}
    return Example(prompt, answer, extra, where)


_FILE_KINDS = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
               (stat.S_ISSOCK, "socket"), (stat.S_ISDIR, "directory"))


def check_regular_file(path: str) -> None:
    """Raises `FileNotFoundError` for a missing `path` and `DataError` naming it unless it is, its
    symlinks resolved, a regular file (checked with `stat`, which never blocks on a FIFO)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"dataset file not found: {path}")
    real = os.path.realpath(path)
    mode = os.stat(real).st_mode
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _FILE_KINDS if test(mode)), "special file")
        target = f" (a link to {real})" if real != os.path.abspath(path) else ""
        raise DataError(f"{path}{target}: a {kind}, not a regular file; give a dataset file")


def _lines(f, path: str) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of a binary file, each line at most `MAX_LINE_BYTES` (else `DataError`); a
    damaged gzip stream (bad header, bad data, cut short) is a `DataError` naming the line it reached."""
    for lineno in itertools.count(1):
        try:
            raw = f.readline(MAX_LINE_BYTES + 1)
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise DataError(f"{path}:{lineno}: not a readable gzip file ({type(e).__name__}: {e})") from None
        if not raw:
            return
        if len(raw.rstrip(b"\r\n")) > MAX_LINE_BYTES:
            raise DataError(f"{path}:{lineno}: a line longer than {MAX_LINE_BYTES} bytes, not a JSONL row")
        yield lineno, raw


def iter_jsonl(config: SourceConfig) -> Iterator[Example]:
    """Examples from a JSONL file (``.gz`` is decompressed); blank lines are skipped."""
    opener = gzip.open if config.path.endswith(".gz") else open
    check_regular_file(config.path)
    with opener(config.path, "rb") as f:
        for lineno, raw in _lines(f, config.path):
            where = f"{config.path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{where}: not UTF-8 ({e.reason} at byte {e.start})") from e
            if not line.strip():
                continue
            try:
                # Without the trailing newline: an error at the end of the line is "column len + 1",
                # not "line 2 column 1".
                row = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from e
            except RecursionError:
                raise DataError(f"{where}: invalid JSON (nested too deep to parse)") from None
            yield example_from_row(row, config, where)


def iter_parquet(config: SourceConfig) -> Iterator[Example]:
    """Examples from a parquet file (needs pyarrow: ``pip install -e ".[data]"``)."""
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError("reading parquet needs pyarrow: pip install -e \".[data]\" (or pyarrow)") from e
    check_regular_file(config.path)
    try:
        pf = pq.ParquetFile(config.path)
    except Exception as e:  # pyarrow raises ArrowInvalid and friends
        raise DataError(f"{config.path}: not a readable parquet file ({e})") from e
    columns = set(pf.schema_arrow.names)
    for field in (config.prompt_field, config.answer_field, *config.extra_fields):
        if field is not None and field.split(".")[0] not in columns:
            raise DataError(f"{config.path}: missing column {field.split('.')[0]!r} (columns: {sorted(columns)})")
    index = 0
    for batch in pf.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            yield example_from_row(row, config, f"{config.path} row {index}")
            index += 1


def _decoded(value: Any) -> Any:
    """tfds/numpy values -> Python: bytes to str, arrays to lists, recursively."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return [_decoded(v) for v in value.tolist()] if value.ndim else _decoded(value.item())
    if isinstance(value, np.generic):
        return _decoded(value.item())
    if isinstance(value, dict):
        return {k: _decoded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_decoded(v) for v in value]
    return value


_NO_ROW = object()  # what an empty tfds split's first read returns


def iter_tfds(config: SourceConfig) -> Iterator[Example]:
    """Examples from tensorflow-datasets ``config.path`` / ``config.split``.

    Downloads only when ``tfds_download`` is set; otherwise the dataset must already
    be prepared in ``data_dir`` (or tfds's default directory).
    """
    try:
        with native_banners.banners_dropped():  # TensorFlow's load-time banners
            import tensorflow_datasets as tfds
    except ImportError as e:
        raise ImportError("format='tfds' needs tensorflow-datasets and tensorflow: "
                          "pip install -e \".[data]\"") from e
    try:
        with native_banners.banners_dropped():  # the runtime's banners, at the load and the first read
            ds = tfds.load(config.path, split=config.split, data_dir=config.data_dir, download=config.tfds_download)
            rows = iter(tfds.as_numpy(ds))
            first = next(rows, _NO_ROW)
    except Exception as e:  # tfds raises several types for a missing / unprepared dataset
        where = f"data_dir={config.data_dir}" if config.data_dir else "tfds's default data_dir"
        raise DataError(f"tfds {config.path}/{config.split}: cannot load ({type(e).__name__}: {e}) from {where}; "
                        "prepare it there first, or let tfds download it (config.task.dataset.tfds_download=true, "
                        "SourceConfig(tfds_download=True))") from e
    if first is _NO_ROW:
        return
    for index, row in enumerate(itertools.chain([first], rows)):
        yield example_from_row(_decoded(row), config, f"tfds {config.path}/{config.split} row {index}")


def load_examples(config: SourceConfig) -> list[Example]:
    """All examples of a source (the first ``config.limit`` when set); a source without a row
    (an empty file) is a `DataError` naming it."""
    fmt = resolve_format(config)
    rows = {"jsonl": iter_jsonl, "parquet": iter_parquet, "tfds": iter_tfds}[fmt](config)
    out = list(itertools.islice(rows, config.limit))  # rows past the limit are never parsed
    if not out and config.limit != 0:
        where = f"tfds {config.path}/{config.split}" if fmt == "tfds" else config.path
        raise DataError(f"{where}: no rows (an empty {fmt} source)")
    logger.info("loaded %d examples from %s (%s)", len(out), config.path, fmt)
    return out
