"""JSONL / parquet / tfds sources with good and malformed files."""
import os
import gzip
import json
import sys
import types

import numpy as np
import pytest

from pipo_jax.data import sources as src

ROWS = [
    {"problem": "What is 1 + 2?", "answer": "3", "level": 1},
    {"problem": "Solve x^2 = 4.", "answer": "-2, 2", "level": 2},
]


def write_jsonl(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_jsonl_good_file_with_blank_lines_and_extras(tmp_path):
    p = write_jsonl(tmp_path / "d.jsonl", [json.dumps(ROWS[0]), "", "  ", json.dumps(ROWS[1])])
    out = src.load_examples(src.SourceConfig(p, extra_fields=("level",)))
    assert out == [src.Example("What is 1 + 2?", "3", {"level": 1}, f"{p}:1"),
                   src.Example("Solve x^2 = 4.", "-2, 2", {"level": 2}, f"{p}:4")]


def test_jsonl_gz_nested_fields_and_messages(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "Q1"}], "reward_model": {"ground_truth": "7"}},
            {"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q2"}],
             "reward_model": {"ground_truth": 8}}]
    p = tmp_path / "verl.jsonl.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(r) for r in rows))
    out = src.load_examples(src.SourceConfig(str(p), prompt_field="prompt", answer_field="reward_model.ground_truth"))
    assert [e.prompt for e in out] == [rows[0]["prompt"], rows[1]["prompt"]]
    assert [e.answer for e in out] == ["7", 8]


def test_jsonl_limit_stops_before_a_later_bad_line(tmp_path):
    p = write_jsonl(tmp_path / "d.jsonl", [json.dumps(ROWS[0]), json.dumps(ROWS[1]), "{broken"])
    assert len(src.load_examples(src.SourceConfig(p, limit=2))) == 2
    with pytest.raises(src.DataError):
        src.load_examples(src.SourceConfig(p))


@pytest.mark.parametrize("lines,message", [
    ([json.dumps(ROWS[0]), '{"problem": "x", "answer": }'],
     r"d\.jsonl:2: invalid JSON \(Expecting value at column 28\)"),
    ([json.dumps(ROWS[0]), json.dumps({"problem": "x", "solution": "1"})],
     r"d\.jsonl:2: missing field 'answer' \(the row has \['problem', 'solution'\]\)"),
    ([json.dumps({"problem": "x", "answer": None})], r"d\.jsonl:1: field 'answer' is null"),
    ([json.dumps({"problem": 5, "answer": "1"})], r"d\.jsonl:1: field 'problem' must be a string or a list"),
    ([json.dumps({"problem": "  ", "answer": "1"})], r"d\.jsonl:1: field 'problem' is an empty string"),
    ([json.dumps({"problem": [{"role": "user"}], "answer": "1"})], r"d\.jsonl:1: field 'problem' must be"),
    (["", json.dumps([1, 2])], r"d\.jsonl:2: expected an object, got list"),
])
def test_jsonl_malformed_rows_name_file_and_line(tmp_path, lines, message):
    p = write_jsonl(tmp_path / "d.jsonl", lines)
    with pytest.raises(src.DataError, match=message):
        src.load_examples(src.SourceConfig(p))


def test_jsonl_nested_missing_field_and_bad_bytes(tmp_path):
    p = write_jsonl(tmp_path / "d.jsonl", [json.dumps({"q": "x", "rm": {"gt": 1}})])
    with pytest.raises(src.DataError, match=r"d\.jsonl:1: missing field 'rm\.truth' \(rm has \['gt'\]\)"):
        src.load_examples(src.SourceConfig(p, prompt_field="q", answer_field="rm.truth"))
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(json.dumps(ROWS[0]).encode() + b"\n" + b'{"problem": "\xff"}\n')
    with pytest.raises(src.DataError, match=r"bad\.jsonl:2: not UTF-8"):
        src.load_examples(src.SourceConfig(str(bad)))


def test_format_resolution_and_missing_file(tmp_path):
    with pytest.raises(src.DataError, match="cannot tell the format of 'data.csv'"):
        src.load_examples(src.SourceConfig("data.csv"))
    with pytest.raises(FileNotFoundError, match="dataset file not found: .*missing.jsonl"):
        src.load_examples(src.SourceConfig(str(tmp_path / "missing.jsonl")))
    assert src.resolve_format(src.SourceConfig("a.pq")) == "parquet"
    assert src.resolve_format(src.SourceConfig("a.txt", format="jsonl")) == "jsonl"
    with pytest.raises(ValueError, match="format"):
        src.SourceConfig("a.jsonl", format="csv")


# ---------------------------------------------------------------- parquet

def write_parquet(path, rows):
    pa = pytest.importorskip("pyarrow")  # optional extra "data"
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.Table.from_pylist(rows), str(path), row_group_size=2)
    return str(path)


def test_parquet_good_file_with_nested_and_list_columns(tmp_path):
    rows = [{"question": f"Q{i}", "meta": {"answer": str(i), "tests": ["assert f() == 1"]}} for i in range(5)]
    p = write_parquet(tmp_path / "d.parquet", rows)
    out = src.load_examples(src.SourceConfig(p, prompt_field="question", answer_field="meta.answer",
                                             extra_fields=("meta.tests",)))
    assert [e.prompt for e in out] == [f"Q{i}" for i in range(5)]
    assert [e.answer for e in out] == [str(i) for i in range(5)]
    assert out[4].extra == {"meta.tests": ["assert f() == 1"]} and out[4].origin == f"{p} row 4"
    assert len(src.load_examples(src.SourceConfig(p, prompt_field="question", answer_field="meta.answer",
                                                  limit=3))) == 3


def test_parquet_malformed(tmp_path):
    p = write_parquet(tmp_path / "d.parquet", ROWS)
    msg = r"d\.parquet: missing column 'solution' \(columns: \['answer', 'level', 'problem'\]\)"
    with pytest.raises(src.DataError, match=msg):
        src.load_examples(src.SourceConfig(p, answer_field="solution"))
    rows = [dict(ROWS[0]), dict(ROWS[1]), {"problem": None, "answer": "1", "level": 3}]
    p2 = write_parquet(tmp_path / "nulls.parquet", rows)
    with pytest.raises(src.DataError, match=r"nulls\.parquet row 2: field 'problem' must be a string"):
        src.load_examples(src.SourceConfig(p2))
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(src.DataError, match=r"junk\.parquet: not a readable parquet file"):
        src.load_examples(src.SourceConfig(str(junk)))


# ---------------------------------------------------------------- tensorflow-datasets

def test_tfds_missing_package_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ImportError, match="tensorflow-datasets"):
        src.load_examples(src.SourceConfig("math", format="tfds"))


def _fake_tfds(rows, calls, fail=None):
    mod = types.ModuleType("tensorflow_datasets")

    def load(name, split, data_dir, download):
        calls.append((name, split, data_dir, download))
        if fail:
            raise fail
        return rows

    mod.load = load
    mod.as_numpy = lambda ds: iter(ds)
    return mod


def test_tfds_rows_are_decoded_and_mapped(monkeypatch):
    rows = [{"question": np.bytes_(b"What is 2+2?"), "answer": np.array(b"4"), "n": np.int64(3),
             "tests": np.array([b"a", b"b"])}]
    calls = []
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", _fake_tfds(rows, calls))
    cfg = src.SourceConfig("my_math", format="tfds", split="test", data_dir="/data/tfds", prompt_field="question",
                           extra_fields=("n", "tests"))
    out = src.load_examples(cfg)
    assert calls == [("my_math", "test", "/data/tfds", False)]
    assert out == [src.Example("What is 2+2?", "4", {"n": 3, "tests": ["a", "b"]}, "tfds my_math/test row 0")]


def test_tfds_load_failure_and_bad_row(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", _fake_tfds([], calls, fail=AssertionError("not prepared")))
    with pytest.raises(src.DataError, match=r"tfds my_math/train: cannot load \(AssertionError: not prepared\)"):
        src.load_examples(src.SourceConfig("my_math", format="tfds"))
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", _fake_tfds([{"problem": b"q"}], calls))
    with pytest.raises(src.DataError, match=r"tfds my_math/train row 0: missing field 'answer'"):
        src.load_examples(src.SourceConfig("my_math", format="tfds", tfds_download=True))
    assert calls[-1][3] is True


def test_tfds_runtime_banners_at_load_and_first_read_stay_off_the_console(monkeypatch, capfd):
    """TensorFlow prints `failed call to cuInit` and its factory notices when a dataset is first loaded and
    read; those lines are dropped, a real warning printed then is kept, and rows arrive as before."""
    mod = _fake_tfds([{"problem": b"q1", "answer": b"1"}, {"problem": b"q2", "answer": b"2"}], [])
    load = mod.load

    def noisy_load(*args, **kwargs):
        os.write(2, b"E0000 cuda_executor.cc:1228] failed call to cuInit: INTERNAL: CUDA error\n")
        return load(*args, **kwargs)

    def noisy_rows(ds):
        os.write(2, b"E0000 cuda_fft.cc:485] Unable to register cuFFT factory: one is already registered\n")
        os.write(2, b"W0000 reader.cc:1] a real warning about the data\n")
        yield from ds

    mod.load, mod.as_numpy = noisy_load, noisy_rows
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", mod)
    out = src.load_examples(src.SourceConfig("my_math", format="tfds"))
    assert [(ex.prompt, ex.answer) for ex in out] == [("q1", "1"), ("q2", "2")]
    assert capfd.readouterr().err == "W0000 reader.cc:1] a real warning about the data\n"
