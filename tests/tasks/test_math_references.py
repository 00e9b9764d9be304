"""A math data file whose reference answer the scorer cannot read (a list, a bool, a dict, an
unbalanced ``\\boxed``) is refused when the dataset loads: one line naming the file and row,
exit status 2, before any training (it used to load, then raise TypeError in `gold_answer`
at the first scoring of that row)."""

import json
import os

import pytest

from pipo_jax.data.sources import DataError, SourceConfig, load_examples
from pipo_jax.tasks import dataset
from tests.data.tiny_tokenizer import save_tiny_model_dir
from tests.scripts import run_script

GOOD = [{"problem": "What is 1 + 2?", "answer": "3"}, {"problem": "What is 2 + 2?", "answer": 4},
        {"problem": "Half of 3?", "answer": "The sum is \\boxed{\\frac{3}{2}}."}]
BAD = {"list": ([1, 2], "gold answer must be a string or number, got list: [1, 2]"),
       "bool": (True, "gold answer must be a string or number, got bool: True"),
       "dict": ({"value": 3}, "gold answer must be a string or number, got dict: {'value': 3}"),
       "unbalanced_box": ("so \\boxed{3", "gold answer has an unbalanced or empty \\boxed: 'so \\\\boxed{3'")}


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("kind", sorted(BAD))
def test_each_bad_reference_is_refused_naming_its_file_and_row(kind, tmp_path):
    answer, why = BAD[kind]
    path = _write(tmp_path / "m.jsonl", GOOD + [{"problem": "q", "answer": answer}])
    examples = load_examples(SourceConfig(path))  # the file itself is well-formed JSONL
    with pytest.raises(DataError) as e:
        dataset.check_math_references(examples)
    assert str(e.value) == f"{path}:4: reference answer: {why}"


def test_good_references_pass_the_check(tmp_path):
    dataset.check_math_references(load_examples(SourceConfig(_write(tmp_path / "m.jsonl", GOOD))))


def test_the_trainer_refuses_the_file_in_one_line_with_exit_2_before_training(tmp_path):
    model = save_tiny_model_dir(tmp_path / "model")
    path = _write(tmp_path / "m.jsonl", GOOD * 4 + [{"problem": "q", "answer": [3]}])
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    res = run_script("-m", "experiments.train", "--config=configs/grpo.py:micro", "--config.task.name=math",
                     f"--config.model.path={model}", f"--config.task.dataset.path={path}",
                     "--config.warmup.enabled=false", "--config.log.jit_loop=false",
                     "--config.rollout.max_new_tokens=8", "--config.iterations=2",
                     f"--workdir={tmp_path / 'run'}", env=env)
    errors = [line for line in res.stderr.splitlines() if line.startswith("error")]  # beside the load's log line
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert errors == [f"error: config.task.dataset (path={path!r}, tokenizer={model!r}): {path}:13: reference "
                     "answer: gold answer must be a string or number, got list: [3]"], res.stderr[-2000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_benchmark_file_is_checked_when_it_loads(tmp_path):
    from pipo_jax.run import evaluate
    good = _write(tmp_path / "good.jsonl", GOOD)
    assert [ex.answer for ex in evaluate.load_math_benchmark(SourceConfig(good))] == ["3", 4, GOOD[2]["answer"]]
    bad = _write(tmp_path / "bench.jsonl", GOOD + [{"problem": "q", "answer": False}])
    with pytest.raises(DataError) as e:
        evaluate.load_math_benchmark(SourceConfig(bad))
    assert str(e.value) == f"{bad}:4: reference answer: gold answer must be a string or number, got bool: False"


def test_the_trainer_refuses_a_bad_benchmark_file_before_training(tmp_path):
    """`eval.benchmarks` files are checked when the run starts, not at its first evaluation."""
    model = save_tiny_model_dir(tmp_path / "model")
    data = _write(tmp_path / "m.jsonl", GOOD * 4)
    bench = _write(tmp_path / "bench.jsonl", GOOD + [{"problem": "q", "answer": {"x": 1}}])
    res = run_script("-m", "experiments.train", "--config=configs/grpo.py:micro", "--config.task.name=math",
                     f"--config.model.path={model}", f"--config.task.dataset.path={data}",
                     "--config.warmup.enabled=false", "--config.log.jit_loop=false",
                     "--config.rollout.max_new_tokens=8", "--config.iterations=2",
                     f"--config.eval.benchmarks=b={bench}", f"--workdir={tmp_path / 'run'}",
                     env=dict(os.environ, JAX_PLATFORMS="cpu"))
    errors = [line for line in res.stderr.splitlines() if line.startswith("error")]
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert errors == [f"error: {bench}:4: reference answer: gold answer must be a string or number, got dict: "
                      "{'x': 1}"], res.stderr[-2000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
