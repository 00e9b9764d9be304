"""A dataset run's `hf_export/` is a complete policy directory (weights + the run's
tokenizer), and `experiments.eval` on it writes eval.json beside the policy, not into
the current directory."""

import json
import os
import pathlib

import pytest

from pipo_jax.data.tokenizer import load_tokenizer, stop_token_ids
from tests.rl.test_dataset_task import QUESTIONS, math_config, math_file, model_dir  # noqa: F401 (fixtures)
from tests.scripts import run_script
from tests.typed import train_config

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow  # one dataset-task iteration plus an eval subprocess (~1 min on a loaded 2-core CPU)
def test_hf_export_carries_the_tokenizer_and_eval_writes_beside_it(model_dir, math_file, tmp_path):  # noqa: F811
    c = math_config(model_dir, math_file, **{"iterations": 1, "log.every": 1, "checkpoint.export_hf": True})
    export = train_config(c, str(tmp_path / "run"))["hf_export"]
    source, exported = load_tokenizer(model_dir), load_tokenizer(export)
    for question, _ in QUESTIONS:
        assert exported.encode(question) == source.encode(question)
    assert exported.chat_template == source.chat_template
    assert stop_token_ids(exported, export) == stop_token_ids(source, model_dir)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = run_script("-m", "experiments.eval", f"--policy={export}", f"--benchmark=mini={math_file}", "--n=1",
                     "--ks=1", "--max_new_tokens=8", cwd=elsewhere, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert os.listdir(elsewhere) == []
    table = json.loads((pathlib.Path(export) / "eval.json").read_text())
    assert "mini" in json.dumps(table)
