"""`task.dataset.format=tfds`: a dataset task from a real tensorflow-datasets catalogue entry (GSM8K), offline
through `tfds.testing.mock_data` (the catalogue's own builder and features, generated rows);
`task.dataset.data_dir` and `task.dataset.tfds_download` reach `tfds.load`; an unprepared dataset without the
download switch is a one-line config error naming the directory and the switch."""

import pytest

from pipo_jax.rl.spec import ConfigError
from tests.rl.test_dataset_task import math_config, model_dir  # noqa: F401 (fixture)
from tests.typed import spec_of


def _gsm8k_config(model_dir, data_dir, **overrides):  # noqa: F811
    return math_config(model_dir, "gsm8k", **{"task.dataset.format": "tfds", "task.dataset.prompt_field": "question",
                                              "task.math.answer_field": "answer", "task.dataset.data_dir": str(data_dir),
                                              **overrides})


@pytest.mark.slow  # imports TensorFlow (~15 s on a loaded 2-core CPU)
def test_a_catalogue_dataset_becomes_the_task(model_dir, tmp_path, monkeypatch):  # noqa: F811
    tfds = pytest.importorskip("tensorflow_datasets", reason="the [data] extra is not installed")
    calls = []
    load = tfds.load

    def spy(name, **kw):
        calls.append((name, kw.get("split"), kw.get("data_dir"), kw.get("download")))
        return load(name, **kw)

    with tfds.testing.mock_data(num_examples=12):
        monkeypatch.setattr(tfds, "load", spy)
        spec = spec_of(_gsm8k_config(model_dir, tmp_path, **{"task.dataset.tfds_download": True}))
    assert calls == [("gsm8k", "train", str(tmp_path), True)]
    task = spec.task
    assert len(task.train_rows_np) + len(task.heldout_rows_np) == 12 and len(task.heldout_rows_np) >= 1
    assert task.origins[0] == "tfds gsm8k/train row 0"
    # The prompts are the questions rendered through the tokenizer's chat template.
    text = task.tokenizer.decode([int(t) for t in task.prompt_tokens_np[0] if t != task.pad_id])
    assert task.questions[0] in text and isinstance(task.references[0], str)


@pytest.mark.slow  # imports TensorFlow
def test_an_unprepared_dataset_without_download_names_the_directory(model_dir, tmp_path):  # noqa: F811
    pytest.importorskip("tensorflow_datasets", reason="the [data] extra is not installed")
    with pytest.raises(ConfigError, match=rf"cannot load .* from data_dir={tmp_path}; .*task.dataset.tfds_download=true"):
        spec_of(_gsm8k_config(model_dir, tmp_path))


def test_without_tensorflow_datasets_the_config_error_names_the_extra(model_dir, tmp_path, monkeypatch):  # noqa: F811
    import sys

    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ConfigError, match=r"config.task.dataset \(path='gsm8k'.*needs tensorflow-datasets and tensorflow: "
                                          r"pip install -e \"\.\[data\]\""):
        spec_of(_gsm8k_config(model_dir, tmp_path))
