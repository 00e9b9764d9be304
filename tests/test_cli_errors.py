"""The experiments' scripts print a config or data error as one line with exit status 2
(not a traceback); a dataset task's missing settings come all at once; a JSONL error
names the column where the line ends."""

import pathlib
import subprocess
import sys

import pytest

from pipo_jax.data.sources import DataError, SourceConfig, load_examples

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(*args):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_unknown_override_is_one_line_with_the_hint():
    res = _run("experiments.train", "--config=configs/grpo.py:micro", "--config.pipo.windw=3", "--check_config")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "error: command-line override: 'windw' Did you mean \"window\" instead of \"windw\"?"]


def test_dataset_task_lists_every_missing_setting_at_once(tmp_path):
    res = _run("experiments.train", "--config=configs/grpo.py:micro", "--config.task.name=math",
               f"--workdir={tmp_path / 'run'}")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: config: task.name='math' needs --config.model.path=")
    for key in ("model.path", "task.path", "log.jit_loop=false", "rollout.max_new_tokens", "warmup.enabled=false"):
        assert f"--config.{key}" in lines[0], key
    assert not (tmp_path / "run").exists()  # nothing written for a refused run


def test_eval_on_a_missing_policy_is_one_line(tmp_path):
    res = _run("experiments.eval", f"--policy={tmp_path / 'nothing'}", "--builtin_problems=4")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'nothing'}: neither a Hugging Face directory (config.json) nor a run workdir "
        "(checkpoints/)"]


def test_jsonl_error_at_the_end_of_a_line_names_that_column(tmp_path):
    path = tmp_path / "d.jsonl"
    line = '{"problem": "1+1", "answer": "2"'  # 32 characters, the closing brace missing
    path.write_text('{"problem": "2+2", "answer": "4"}\n' + line + "\n")
    with pytest.raises(DataError, match=r"d\.jsonl:2: invalid JSON \(Expecting ',' delimiter at column 33\)"):
        load_examples(SourceConfig(str(path)))
