"""Dataset tasks in the trainer: math answers / code tests from files, scored on the host,
with the held-out accuracy and benchmark pass@k of the shared evaluation harness."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo
from pipo_jax.data import prompts as pr
from pipo_jax.data import tokenizer as tk
from pipo_jax.models import hf
from pipo_jax.rl import rollout
from pipo_jax.rl.spec import ConfigError
from pipo_jax.run import evaluate, trainer
from pipo_jax.tasks import dataset
from tests.conftest import override
from tests.data.tiny_tokenizer import save_tiny_model_dir
from tests.scripts import run_script
from tests.typed import spec_of, train_config

QUESTIONS = [(f"What is {a} + {b}?", str(a + b)) for a, b in
             [(1, 2), (3, 4), (5, 6), (7, 1), (2, 2), (9, 9), (4, 5), (6, 3), (8, 1), (2, 7), (3, 3), (5, 5)]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def math_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "math.jsonl"
    path.write_text("".join(json.dumps({"problem": q, "answer": a}) + "\n" for q, a in QUESTIONS))
    return str(path)


def math_config(model_dir, math_file, **overrides):
    c = grpo.get_config("micro")
    c.model.path = model_dir
    c.warmup.enabled = False
    c.task.name = "math"
    c.task.dataset.path = math_file
    c.task.heldout_fraction = 0.25
    c.task.dataset.max_prompt_tokens = 128
    c.rollout.max_new_tokens = 24
    c.log.jit_loop = False
    c.eval.n = 3
    return override(c, overrides)


def test_prompt_table_and_splits(model_dir, math_file):
    spec = spec_of(math_config(model_dir, math_file))
    task = spec.task
    assert not spec.task.capabilities.device_reward and task.kind == "math" and task.size == 12
    tok = tk.load_tokenizer(model_dir)
    for i, (q, a) in enumerate(QUESTIONS):  # left-padded chat-template ids of each question
        text = tok.apply_chat_template([{"role": "user", "content": q + "\n" + pr.DEFAULT_INSTRUCTION}],
                                       tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        row = task.prompt_tokens_np[i]
        assert task.prompt_lengths_np[i] == len(ids)
        assert list(row[len(row) - len(ids):]) == ids and np.all(row[:len(row) - len(ids)] == task.pad_id)
        assert task.references[i] == a
    assert task.prompt_len % 8 == 0 and task.prompt_len >= task.prompt_lengths_np.max()
    assert len(task.heldout_rows_np) == 3 and len(task.train_rows_np) == 9
    assert not set(task.heldout_rows_np) & set(task.train_rows_np)
    assert task.stop_token_ids == (2,) and task.pad_id == 0

    table = dataset.prompt_arrays(task)
    sample = jax.jit(lambda t, k: dataset.sample_problems(t, k, 64))
    probs = sample(table, jax.random.PRNGKey(1))
    assert set(np.asarray(probs.index_b)) <= set(task.train_rows_np)
    np.testing.assert_array_equal(probs.prompt_tokens_bp, task.prompt_tokens_np[np.asarray(probs.index_b)])
    np.testing.assert_array_equal(probs.prompt_mask_bp.sum(1), task.prompt_lengths_np[np.asarray(probs.index_b)])
    held = dataset.sample_problems(table, jax.random.PRNGKey(1), 16, split="heldout")
    assert set(np.asarray(held.index_b)) <= set(task.heldout_rows_np)


def test_the_evaluation_names_its_real_number_of_problems(model_dir, math_file):
    """eval.n larger than the held-out split: the trainer scores the whole split and says its size."""
    spec = spec_of(math_config(model_dir, math_file))
    assert trainer.heldout_count(spec, 512) == len(spec.task.heldout_rows_np) == 3
    assert trainer.heldout_count(spec, 2) == 2
    assert trainer.describe_heldout(3, 512) == ("the trainer's 3 fixed held-out problems (the whole held-out split: "
                                                "eval.n=512 asks for more)")
    assert trainer.describe_heldout(512, 512) == "the trainer's 512 fixed held-out problems (eval.n)"
    assert trainer.heldout_count(spec_of(grpo.get_config("micro")), 16) == 16  # a generated task: eval.n


def constructed_rollout(spec, tok, rows, texts):
    """A rollout of the task's rows with the given response texts (each then <|im_end|>):
    (rollout, response tokens [B, R], response mask [B, R])."""
    r = spec.rollout.max_new_tokens
    resp = np.full((len(texts), r), spec.task.pad_id, np.int32)
    mask = np.zeros((len(texts), r), np.int32)
    for i, t in enumerate(texts):
        ids = tok(t, add_special_tokens=False)["input_ids"][: r - 1] + [2]
        resp[i, :len(ids)], mask[i, :len(ids)] = ids, 1
    problems = dataset.problems_at(dataset.prompt_arrays(spec.task), np.asarray(rows, np.int32))
    batch = rollout.Rollout(
        problems=problems, tokens_bl=jnp.concatenate([problems.prompt_tokens_bp, jnp.asarray(resp)], axis=1),
        mask_bl=jnp.concatenate([problems.prompt_mask_bp, jnp.asarray(mask)], axis=1),
        sample_logp_br=jnp.zeros((len(texts), r)), rewards_b=jnp.zeros((len(texts),)))
    return batch, resp, mask


def test_host_reward_verifies_each_response_against_its_row(model_dir, math_file):
    spec = spec_of(math_config(model_dir, math_file))
    tok = tk.load_tokenizer(model_dir)
    rows = np.asarray([0, 0, 1, 2], np.int32)  # answers 3, 3, 7, 11
    texts = ["so \\boxed{3}", "\\boxed{4}", "\\boxed{7}", "\\boxed{11}"]
    batch, resp, mask = constructed_rollout(spec, tok, rows, texts)
    mask[3, :] = 0  # an empty (masked-out) response scores 0 whatever its tokens
    batch = batch.replace(mask_bl=batch.mask_bl.at[3, spec.prompt_len:].set(0))
    reward = spec.task.scorer()
    try:
        decoded = reward.decode(resp, mask)
        assert decoded[:3] == [t for t in texts[:3]] and decoded[3] == ""
        np.testing.assert_array_equal(rollout.TaskReward(spec, reward)(batch), [1.0, 0.0, 1.0, 0.0])
        _, feedback = reward(resp, mask, rows)
        assert "4" in feedback[1] and feedback[0] != feedback[1]
    finally:
        reward.close()


def test_answers_past_the_batch_budget_score_0_and_are_counted(model_dir, math_file):
    spec = spec_of(math_config(model_dir, math_file, **{
        "task.dataset.verify_timeout_s": 1.0, "task.dataset.verify_batch_budget_s": 2.0, "task.dataset.verify_workers": 1,
        "rollout.max_new_tokens": 64}))
    assert spec.task.math_config.batch_budget_s == 2.0 and spec.task.math_config.num_workers == 1
    tok = tk.load_tokenizer(model_dir)
    slow = "\\boxed{9^{9^{9^9}}}"  # never finishes: each burns its 1 s limit
    texts = ["\\boxed{3}"] + [slow] * 6 + ["\\boxed{7}"]
    rows = [0] * 7 + [1]
    batch, _, _ = constructed_rollout(spec, tok, rows, texts)
    with spec.task.scorer() as reward:
        task_reward = rollout.TaskReward(spec, reward)
        assert task_reward.take_counts() == {"reward/unscored_count": 0, "reward/check_timeouts": 0}
        rewards = np.asarray(task_reward(batch))
        counts = task_reward.take_counts()
        assert rewards[0] == 1.0 and np.all(rewards[1:] == 0.0)  # the last, correct one was not reached
        # 2 s of budget, 1 s limit each: one or two slow answers time out on their own, the rest are unscored.
        assert counts["reward/check_timeouts"] in (1, 2)
        assert counts["reward/unscored_count"] == 7 - counts["reward/check_timeouts"]
        assert task_reward.take_counts() == {"reward/unscored_count": 0, "reward/check_timeouts": 0}  # reset
    for key, value in (("verify_batch_budget_s", 0.0), ("verify_timeout_s", -1.0), ("verify_workers", -2)):
        with pytest.raises(ConfigError, match=rf"config.task.dataset.{key}: {value} must be"):
            spec_of(math_config(model_dir, math_file, **{f"task.dataset.{key}": value}))


def test_code_task_scores_with_the_sandbox(model_dir, tmp_path):
    path = tmp_path / "code.jsonl"
    rows = [{"problem": "Write f(x) returning x + 1.", "tests": ["assert f(1) == 2", "assert f(5) == 6"]},
            {"problem": "Write g(s) returning s reversed.", "tests": ["assert g('ab') == 'ba'"]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = math_config(model_dir, str(path), **{"task.name": "code", "task.heldout_fraction": 0.0})
    spec = spec_of(c)
    assert spec.task.kind == "code" and len(spec.task.references[0]) == 2
    with spec.task.scorer() as reward:
        rewards, feedback = reward.score_texts(
            ["```python\ndef f(x):\n    return x + 1\n```", "```python\ndef g(s):\n    return s\n```"], [0, 1])
    np.testing.assert_array_equal(rewards, [1.0, 0.0])
    assert "assert g('ab') == 'ba'" in feedback[1]


def test_dataset_task_config_errors_name_the_key(model_dir, math_file, tmp_path):
    cases = [
        ({"log.jit_loop": True}, "config.log.jit_loop"),
        ({"task.dataset.path": ""}, "config.task.dataset.path"),
        ({"model.path": ""}, "config.model.path"),
        ({"rollout.max_new_tokens": 0}, "config.rollout.max_new_tokens"),
        ({"task.dataset.path": str(tmp_path / "nope.jsonl")}, "config.task.*nope.jsonl"),
        ({"task.dataset.enable_thinking": "maybe"}, "config.task.dataset.enable_thinking"),
        ({"eval.benchmarks": "B"}, "config.eval.benchmarks.*NAME=PATH"),
        ({"eval.benchmarks": f"B={math_file}", "eval.ks": "1,9"}, "config.eval.ks"),
    ]
    for overrides, match in cases:
        with pytest.raises(ConfigError, match=match):
            spec_of(math_config(model_dir, math_file, **overrides))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "q", "answer": "1"}) + "\n{not json\n")
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2"):
        spec_of(math_config(model_dir, str(bad)))
    c = grpo.get_config("micro")
    c.eval.benchmarks = f"B={math_file}"
    with pytest.raises(ConfigError, match="config.eval.benchmarks: math benchmarks need a math task"):
        spec_of(c)


@pytest.mark.slow  # the trainer end to end on a Hugging Face model and a math file
def test_trainer_on_a_math_file_with_benchmarks_then_eval_cli(model_dir, math_file, tmp_path):
    c = math_config(model_dir, math_file, **{"iterations": 2, "log.every": 1, "eval.every": 1,
                                               "eval.benchmarks": f"mini={math_file}", "eval.samples": 2,
                                               "eval.ks": "1,2", "checkpoint.export_hf": True})
    out = train_config(c, str(tmp_path / "run"))
    rows = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        for key in ("heldout_accuracy", "mini_pass_at_1", "mini_pass_at_2", "average_pass_at_1"):
            assert 0.0 <= r[key] <= 1.0
            assert r["mini_pass_at_1"] <= r["mini_pass_at_2"]
    for r in rows[1:]:
        assert r["tokens"] > 0 and np.isfinite(r["train/loss"]) and 0 <= r["reward_mean"] <= 1
        # The math scorer's counts reach the metrics (nothing here is near the 60 s budget).
        assert (r["reward/unscored_count"], r["reward/check_timeouts"]) == (0, 0)
    assert all(r["mini_unscored_count"] == 0 for r in rows)
    assert out["final_eval"]["mini_pass_at_1"] == rows[-1]["mini_pass_at_1"]
    # The held-out accuracy is the shared harness on the exported policy (greedy, same rows).
    spec = spec_of(c)
    _, params = hf.load(out["hf_export"])
    with spec.task.scorer() as reward:
        assert evaluate.decoded_heldout_accuracy(spec, params, reward, c.eval.n) == out["final_accuracy"]

    # experiments/eval.py on the run workdir: the tokenizer comes from the run's config.
    res = run_script("-m", "experiments.eval", f"--policy={tmp_path / 'run'}", f"--benchmark=mini={math_file}",
                     "--n=2", "--ks=1,2", "--max_new_tokens=24", f"--out={tmp_path / 'eval.json'}")
    assert res.returncode == 0, res.stderr[-2000:]
    table = json.loads((tmp_path / "eval.json").read_text())
    assert "mini" in json.dumps(table) and "mini" in res.stdout


def sdpo_config(model_dir, math_file, **overrides):
    from configs import sdpo

    c = sdpo.get_config("micro")
    base = math_config(model_dir, math_file)
    for key in ("model", "warmup", "task", "log"):
        c[key] = base[key]
    c.rollout.max_new_tokens = base.rollout.max_new_tokens
    c.eval.n = base.eval.n
    return override(c, overrides)


def test_sdpo_teacher_prompts_show_a_sibling_solution_or_feedback(model_dir, math_file):
    from pipo_jax.rl import learn

    c = sdpo_config(model_dir, math_file, **{"rollout.group_size": 2, "rollout.prompts_per_batch": 2,
                                              "train.mini_batch_prompts": 1})
    spec = spec_of(c)
    tok = tk.load_tokenizer(model_dir)
    rows = np.asarray([0, 0, 1, 1], np.int32)  # answers 3, 3, 7, 7
    batch, resp, mask = constructed_rollout(spec, tok, rows, ["\\boxed{3}", "\\boxed{5}", "\\boxed{1}", "\\boxed{2}"])
    with spec.task.scorer() as reward:
        scored = rollout.TaskReward(spec, reward).score_rollout(batch)
        _, feedback = reward(resp, mask, rows)
    np.testing.assert_array_equal(scored.rewards_b, [1, 0, 0, 0])
    ctx_tokens, ctx_mask, has = (np.asarray(x) for x in scored.teacher_context)
    assert ctx_tokens.shape == (4, spec.teacher_prompt_len)
    np.testing.assert_array_equal(has, [1, 1, 1, 1])
    prompts = [tok.decode(t[m == 1].tolist()) for t, m in zip(ctx_tokens, ctx_mask)]
    # Row 1 failed; its sibling (row 0) solved it: the teacher sees that solution.
    assert "What is 1 + 2?" in prompts[1] and "Here is a correct solution to this problem:\n\\boxed{3}" in prompts[1]
    assert prompts[1].endswith("<|im_start|>assistant\n")
    # Rows 0, 2, 3 have no successful sibling: the verifier's feedback on their own answer.
    for i in (0, 2, 3):
        assert "Feedback on an earlier attempt" in prompts[i] and feedback[i] in prompts[i]
    assert "What is 3 + 4?" in prompts[2]
    # The learn step appends the response to the host-built prompt.
    t_tokens, t_mask, sd_mask = learn.teacher_contexts(spec, scored, scored.rewards_b)
    np.testing.assert_array_equal(t_tokens[:, spec.teacher_prompt_len:], resp)
    np.testing.assert_array_equal(t_mask[:, :spec.teacher_prompt_len], ctx_mask)
    np.testing.assert_array_equal(sd_mask, has)
    # Without feedback only the row with a successful sibling gets a teacher prompt.
    spec_nofb = spec_of(sdpo_config(model_dir, math_file, **{"rollout.group_size": 2, "rollout.prompts_per_batch": 2,
                                                                "train.mini_batch_prompts": 1,
                                                                "sdpo.use_feedback": False}))
    with spec_nofb.task.scorer() as reward:
        scored = rollout.TaskReward(spec_nofb, reward).score_rollout(batch)
    ctx_tokens, ctx_mask, has = (np.asarray(x) for x in scored.teacher_context)
    np.testing.assert_array_equal(has, [0, 1, 0, 0])
    assert ctx_mask[[0, 2, 3]].sum() == 0


def test_teacher_prompt_cuts_a_context_that_does_not_fit(model_dir):
    tok = tk.load_tokenizer(model_dir)
    cfg = pr.PromptConfig(max_prompt_tokens=128)
    full = dataset.teacher_prompt_ids(tok, cfg, "What is 1 + 2?", "x" * 40, 1000)
    short = dataset.teacher_prompt_ids(tok, cfg, "What is 1 + 2?", "x" * 40, len(full) - 5)
    assert 0 < len(short) <= len(full) - 5
    assert tok.decode(short).endswith(tok.decode(full[-8:]))  # the template's end survives
    assert dataset.teacher_prompt_ids(tok, cfg, "What is 1 + 2?", "x" * 40, 5) == []  # not even the question fits


@pytest.mark.slow  # the trainer end to end on a Hugging Face model and a math file
def test_sdpo_trains_on_a_math_file(model_dir, math_file, tmp_path):
    c = sdpo_config(model_dir, math_file, **{"iterations": 2, "log.every": 1})
    train_config(c, str(tmp_path / "run"))
    rows = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert np.isfinite(r["train/loss"]) and r["tokens"] > 0
        # A random policy fails every problem: each response gets the verifier's feedback.
        assert r["reward_mean"] == 0 and r["teacher_context_frac"] == 1.0
