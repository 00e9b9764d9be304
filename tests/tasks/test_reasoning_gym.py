"""reasoning-gym as a task source (`pipo_jax/tasks/reasoning_gym.py`): the library's own verifier
through the trainer's reward path, the split, the length / vocabulary errors, the missing extra,
the tokenizer (paper-scale) form, and (slow) that the CPU model learns one dataset."""

import builtins
import importlib
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import grpo
from pipo_jax.data import text_vocab
from pipo_jax.data import tokenizer as tk
from pipo_jax.models import qwen3
from pipo_jax.rl import rollout
from pipo_jax.config.sections import ConfigError, RunConfig
from pipo_jax.run import teacher_forcing
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.tasks import reasoning_gym as rgt
from tests.conftest import override
from tests.data.tiny_tokenizer import save_tiny_model_dir
from tests.typed import spec_of, task_of, train_config

rg = pytest.importorskip("reasoning_gym", reason="reasoning-gym is an optional extra: pip install -e \".[rg]\"")

SPELL = '{"min_word_len":3,"max_word_len":5}'
GCD = '{"min_numbers":2,"max_numbers":2,"min_value":1,"max_value":50}'


def rg_config(dataset="spell_backward", config=SPELL, algo="grpo", **overrides):
    c = importlib.import_module(f"configs.{algo}").get_config("micro")
    c.task.name = "reasoning_gym"
    c.task.reasoning_gym.dataset = dataset
    c.task.reasoning_gym.config = config
    c.task.reasoning_gym.size = 400
    c.warmup.steps = 2
    return override(c, overrides)


def responses(texts, width):
    """Responses in the character vocabulary: each text then <eos>, right-padded `[B, width]`."""
    tokens = np.full((len(texts), width), text_vocab.PAD_ID, np.int32)
    mask = np.zeros_like(tokens)
    for i, t in enumerate(texts):
        ids = (text_vocab.encode(t) + [text_vocab.EOS_ID])[:width]
        tokens[i, :len(ids)], mask[i, :len(ids)] = ids, 1
    return tokens, mask


def trainer_rewards(spec, rows, texts):
    """Rewards of `texts` as responses to task rows `rows`, through the trainer's reward path
    (`rollout.task_rewards` of a `Rollout`, jitted like the scan loop's)."""
    problems = spec.task.problems_at(np.asarray(rows, np.int32))
    resp, mask = responses(texts, spec.rollout.max_new_tokens)
    batch = rollout.from_generation(problems, jnp.asarray(resp), jnp.asarray(mask),
                                    jnp.zeros(resp.shape, jnp.float32))
    return np.asarray(jax.jit(rollout.task_rewards, static_argnums=0)(spec, batch))


def last_changed(answer):  # spell_backward credits each right letter in place
    return answer[:-1] + ("a" if answer[-1] != "a" else "b")


def x_before(answer):  # gcd credits a response holding the answer by its share of the response
    return "x" + answer


@pytest.mark.parametrize("dataset,config,wrong_of", [("spell_backward", SPELL, last_changed), ("gcd", GCD, x_before)])
def test_reward_is_the_librarys_score_through_the_trainer_path(dataset, config, wrong_of):
    spec = spec_of(rg_config(dataset, config))
    task = spec.task
    rows = list(task.source.heldout_rows[:4])
    entries = [task.source.entries[r] for r in rows]
    right = [e["answer"] for e in entries]
    wrong = [wrong_of(e["answer"]) for e in entries]
    got = trainer_rewards(spec, rows + rows, right + wrong)
    ds = rg.create_dataset(dataset, seed=0, size=400, **json.loads(config))
    want_wrong = [ds.score_answer(w, e) for w, e in zip(wrong, entries)]
    np.testing.assert_allclose(got[:4], 1.0)
    np.testing.assert_allclose(got[4:], want_wrong, rtol=1e-6)
    assert all(0.0 < w < 1.0 for w in want_wrong), want_wrong  # both datasets give partial credit here
    # a response without <eos> (cut at the width) is scored on what it holds; an empty one scores 0
    np.testing.assert_allclose(trainer_rewards(spec, rows[:1], [""]), [ds.score_answer("", entries[0])])


def test_reward_components_are_full_and_partial_credit_summing_to_the_reward():
    """gcd: the answer scores full credit [1, 0]; "x" + answer the library's partial credit
    [0, len(answer) / (len(answer) + 1)]; a wrong one [0, 0]; each row sums to the trainer's reward."""
    spec = spec_of(rg_config("gcd", GCD))
    task = spec.task
    assert [c.name for c in task.reward_weights()] == ["full_credit", "partial_credit"]
    rows = list(task.source.heldout_rows[:2])
    answers = [task.source.entries[r]["answer"] for r in rows]
    texts = answers + [x_before(a) for a in answers] + ["zz", "zz"]
    problems = task.problems_at(np.asarray(rows * 3, np.int32))
    resp, mask = responses(texts, spec.rollout.max_new_tokens)
    got = np.asarray(jax.jit(task.reward_components)(problems, jnp.asarray(resp), jnp.asarray(mask)))
    partial = [len(a) / (len(a) + 1) for a in answers]
    np.testing.assert_allclose(got, [[1, 0], [1, 0], [0, partial[0]], [0, partial[1]], [0, 0], [0, 0]], rtol=1e-6)
    np.testing.assert_allclose(got.sum(axis=1), trainer_rewards(spec, rows * 3, texts), rtol=1e-6)


def test_vmapped_seeds_score_every_batch_in_one_host_call():
    task = spec_of(rg_config()).task
    problems = task.problems_at(task.source.heldout_rows[:3])
    right, mask = responses([task.source.entries[r]["answer"] for r in task.source.heldout_rows[:3]], task.answer_len)
    wrong, wmask = responses(["zz", "zz", "zz"], task.answer_len)
    r = jax.jit(jax.vmap(lambda t, m: task.reward(problems, t, m)))(jnp.stack([right, wrong]), jnp.stack([mask, wmask]))
    np.testing.assert_allclose(np.asarray(r), [[1.0] * 3, [0.0] * 3])


def test_split_is_disjoint_and_repeats_are_counted():
    src = rgt.generate_entries("gcd", json.loads(GCD), 600, 3, 0.2)
    questions = [e["question"] for e in src.entries]
    assert len(set(questions)) == len(questions) == 600 - src.num_duplicates and src.num_duplicates > 0
    train = {questions[i] for i in src.train_rows}
    held = {questions[i] for i in src.heldout_rows}
    assert not train & held and len(train) + len(held) == len(questions)
    assert len(held) == round(0.2 * len(questions))
    again = rgt.generate_entries("gcd", json.loads(GCD), 600, 3, 0.2)  # deterministic in the seed
    np.testing.assert_array_equal(again.heldout_rows, src.heldout_rows)
    other = rgt.generate_entries("gcd", json.loads(GCD), 600, 4, 0.2)
    assert [e["question"] for e in other.entries] != questions


ISOMORPHIC_DRAW = ("import json, sys; from pipo_jax.tasks import reasoning_gym as rgt; "
                   "print(json.dumps([e['question'] for e in rgt.generate_entries('isomorphic_strings', {}, 60, 0, 0.1)"
                   ".entries]))")


def test_entries_are_the_same_in_every_process():
    """isomorphic_strings draws letters from a set (`rng.choice(list(set))`), whose order follows the
    process's string-hash seed: drawn as the library draws them, two processes made two datasets. Every
    process now gets the PYTHONHASHSEED=0 draw: in this test process (hashes seeded at random: through a
    child) as in processes with other hash seeds, and as in one with PYTHONHASHSEED=0 (drawn in-process)."""
    def questions(hash_seed: str) -> list[str]:
        out = subprocess.run([sys.executable, "-c", ISOMORPHIC_DRAW], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": hash_seed, "JAX_PLATFORMS": "cpu"})
        return json.loads(out.stdout.strip().splitlines()[-1])

    here = [e["question"] for e in rgt.generate_entries("isomorphic_strings", {}, 60, 0, 0.1).entries]
    assert questions("0") == questions("1") == questions("2") == here
    # the library's own draw does differ between hash seeds (else this test would prove nothing)
    library = ("import json, reasoning_gym as rg; d = rg.create_dataset('isomorphic_strings', seed=0, size=60); "
               "print(json.dumps([d[i]['question'] for i in range(60)]))")
    drawn = [subprocess.run([sys.executable, "-c", library], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONHASHSEED": h}).stdout for h in ("1", "2")]
    assert drawn[0] != drawn[1]


@pytest.mark.skipif(sys.flags.hash_randomization == 0, reason="this process draws in-process (PYTHONHASHSEED=0)")
def test_a_failed_draw_in_the_child_is_one_line_naming_the_dataset(monkeypatch):
    monkeypatch.setattr(rgt, "_DRAW_CHILD", "raise RuntimeError('the child failed')")
    with pytest.raises(ValueError, match=r"^dataset='gcd' with config=\{\}: drawing its entries in a child process "
                                         r"\(PYTHONHASHSEED=0\) failed: RuntimeError: the child failed$"):
        rgt.generate_entries("gcd", {}, 10, 0, 0.1)


def test_compact_prompts_cut_the_shared_text_only():
    assert rgt.compact_questions(["Find the GCD of: 49, 29. Give it.", "Find the GCD of: 6, 6. Give it.",
                                  "Find the GCD of: 41, 23. Give it."]) == ["49, 29", "6, 6", "41, 23"]
    # the shared '4' of '41' / '49' stays: a number is never cut
    assert rgt.compact_questions(["sum: 41 + 1 =", "sum: 49 + 2 ="]) == ["41 + 1", "49 + 2"]
    task = spec_of(rg_config()).task
    assert all(e["question"].endswith(p) for p, e in zip(task.prompts, task.source.entries))
    prompt = text_vocab.decode(task.prompt_tokens_np[0][task.prompt_tokens_np[0] != text_vocab.PAD_ID])
    assert prompt == "<bos>" + task.prompts[0] + "<answer>"


def test_length_and_vocabulary_errors_name_the_row():
    with pytest.raises(ConfigError, match=r"config\.task\.reasoning_gym: dataset 'spell_backward' row \d+: prompt .* "
                                          r"over task\.reasoning_gym\.max_prompt_chars=3"):
        task_of(rg_config(**{"task.reasoning_gym.max_prompt_chars": 3}))
    c = rg_config(**{"task.reasoning_gym.max_prompt_chars": 4, "task.reasoning_gym.overlong": "drop"})
    task = task_of(c)
    every = rgt.generate_entries("spell_backward", json.loads(SPELL), 400, 0, 0.1)
    assert task.num_dropped == sum(len(e["question"].split()[-1]) > 4 for e in every.entries) > 0
    assert len(task.source.entries) == len(every.entries) - task.num_dropped
    odd = every._replace(entries=({"question": "a", "answer": "b"}, {"question": "caf\xe9", "answer": "c"},
                                  *every.entries[2:]))
    with pytest.raises(ValueError, match="row 1: question 'caf\xe9' has character '\xe9' \\(position 3\\)"):
        rgt.char_task("x", odd, prompt_form="question")
    # with overlong=drop a row outside the vocabulary is dropped and counted like a long one
    kept = rgt.char_task("x", odd, prompt_form="question", overlong="drop", max_prompt_chars=64)
    assert kept.num_dropped == 1 and "caf\xe9" not in kept.prompts and "a" in kept.prompts


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"config\.task\.reasoning_gym\.dataset: name a reasoning-gym dataset"):
        task_of(rg_config(dataset=""))
    with pytest.raises(ConfigError, match=r"config\.task\.reasoning_gym\.config: '\{' is not JSON"):
        spec_of(rg_config(config="{"))
    with pytest.raises(ConfigError, match=r"dataset='no_such_dataset'"):
        task_of(rg_config(dataset="no_such_dataset", config=""))
    # the character form declares no teacher contexts: refused at start-up naming the key
    assert not task_of(rg_config()).capabilities.teacher_contexts
    with pytest.raises(ConfigError, match=r"config\.algorithm: sdpo needs teacher contexts"):
        spec_of(rg_config(algorithm="sdpo"))
    # the built-in task's warm-up demonstrations are its own: set there, they leave this task's warm-up alone
    shaped = spec_of(rg_config(**{"task.arithmetic.warmup_mistake_rate": 0.5,
                                     "task.arithmetic.warmup_context_fraction": 0.5}))
    assert not hasattr(shaped.task, "warmup_mistake_rate")


def test_missing_package_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def no_rg(name, *args, **kwargs):
        if name == "reasoning_gym" or name.startswith("reasoning_gym."):
            raise ImportError("No module named 'reasoning_gym'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_rg)
    with pytest.raises(ConfigError, match=r"^config\.task\.name: task\.name=reasoning_gym needs the reasoning-gym "
                                          r"package \(the optional extra\): pip install -e \"\.\[rg\]\"$"):
        task_of(rg_config())


def test_heldout_accuracy_is_the_verifiers_on_greedy_responses():
    """A model trained to say the answer is solved by the verifier; the decoded accuracy is
    the share scored 1.0 (not the mean partial credit)."""
    spec = spec_of(rg_config())
    task = spec.task
    params = qwen3.init_params(spec.model, jax.random.PRNGKey(0))
    acc = float(teacher_forcing.heldout_accuracy(spec.model, params, task, None, 8, jax.random.PRNGKey(0)))
    out = jax.jit(lambda p: __import__("pipo_jax.sampling.sampler", fromlist=["x"]).generate(
        spec.model, p, *task.heldout_problems(None, 8, None)[:2], jax.random.PRNGKey(0),
        SamplingParams(max_new_tokens=task.answer_len, temperature=0.0, stop_token_ids=task.stop_token_ids,
                       pad_id=task.pad_id)))(params)
    scores = task.score(task.source.heldout_rows[:8], out.tokens_br, out.mask_br)
    assert acc == pytest.approx(float(np.mean(scores >= 1.0)))


def test_short_run_with_warmup_in_the_character_vocabulary(tmp_path):
    out = train_config(rg_config(**{"task.arithmetic.warmup_mistake_rate": 0.0,
                                    "task.arithmetic.warmup_context_fraction": 0.0}), str(tmp_path / "run"))
    assert np.isfinite(out["final_accuracy"])
    assert out["state"].step == 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model_dir(tmp_path_factory.mktemp("model"))


def text_config(model_dir, **overrides):
    return rg_config(**{"model.path": model_dir, "warmup.enabled": False, "log.jit_loop": False,
                        "rollout.max_new_tokens": 16, "task.dataset.max_prompt_tokens": 256, "eval.n": 4, **overrides})


def test_tokenizer_form_renders_the_chat_template_and_scores_tagged_answers(model_dir):
    spec = spec_of(text_config(model_dir))
    task, tok = spec.task, tk.load_tokenizer(model_dir)
    assert task.name == "reasoning_gym" and task.tokenizer is not None
    row = int(task.heldout_rows_np[0])
    entry = task.source.entries[row]
    prompt = tok.decode(task.prompt_tokens_np[row][task.prompt_tokens_np[row] != task.pad_id])
    assert prompt.startswith("<|im_start|>user\n" + entry["question"]) and "<answer>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    texts = [f"so <answer>{entry['answer']}</answer>", "no tags here", f"<answer>x{entry['answer']}</answer>"]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, ids))
    tokens = np.asarray([i + [task.pad_id] * (width - len(i)) for i in ids], np.int32)
    mask = np.asarray([[1] * len(i) + [0] * (width - len(i)) for i in ids], np.int32)
    scorer = task.scorer()
    problems = rgt.dataset_lib.problems_at(task.prompt_table(), np.asarray([row] * 3, np.int32))
    got = scorer.score(problems, tokens, mask).rewards_b
    ds = task.source.dataset
    np.testing.assert_allclose(got, [1.0, ds.score_answer(None, entry), ds.score_answer("x" + entry["answer"], entry)])


def test_tokenizer_form_short_run(model_dir, tmp_path):
    out = train_config(text_config(model_dir, iterations=2), str(tmp_path / "run"))
    assert out["state"].step == 2 and 0.0 <= out["final_accuracy"] <= 1.0


ITERATIONS = 40
# The seeds of the check. One seed's gain is one draw from a wide spread, which a change of XLA:CPU's
# code generation alone moves by several hundredths: this run at 40 iterations, five seeds vmapped, on the
# AMD EPYC gains +0.14, +0.11, +0.12, +0.12, +0.21 under the test flags (tests/xla_flags.py) without
# `--xla_cpu_parallel_codegen_split_count=1`, and +0.13, +0.12, +0.08, +0.08, +0.09 with it. So the check
# is the mean gain of seeds 0-2, >= MIN_MEAN_GAIN: about twice the noise of a three-seed mean of held-out
# accuracies on ~250 problems, and below the five-seed comparison's 95% interval
# (docs/results.md, reasoning-gym: chain_sum, grpo +0.120 [+0.055, +0.192]).
SEEDS = (0, 1, 2)
MIN_MEAN_GAIN = 0.05


@pytest.mark.slow
def test_chain_sum_learns_with_grpo():
    """The CPU model, warmed up on the library's answers to a partial solver of three-term 1-digit
    chain sums, raises its held-out greedy accuracy (the share the library's verifier scores 1.0)
    under GRPO in 40 iterations by >= MIN_MEAN_GAIN on the mean of SEEDS (vmapped in one run, as
    `experiments.compare` runs them)."""
    from experiments.overrides import with_overrides
    from experiments.vmapped import run_group
    from pipo_jax.run import warmup

    c = grpo.get_config("tiny")
    override(c, {"task.name": "reasoning_gym", "task.reasoning_gym.dataset": "chain_sum",
                 "task.reasoning_gym.config": '{"min_terms":3,"max_terms":3,"min_digits":1,"max_digits":1}',
                 "task.arithmetic.warmup_mistake_rate": 0.0, "task.arithmetic.warmup_context_fraction": 0.0, "warmup.steps": 600,
                 "warmup.target_accuracy": 0.3, "iterations": ITERATIONS})
    spec = spec_of(c)
    settings = warmup.WarmupSettings.from_config(RunConfig.from_config(c), spec.task)
    bases, warmed = [], []
    for seed in SEEDS:
        base, m = warmup.warmup(spec.model, spec.task, settings, seed=seed)
        assert 0.2 <= m["final_accuracy"] <= 0.6, (seed, m["heldout_accuracy"])
        bases.append(base)
        warmed.append(m["final_accuracy"])
    rows, _ = run_group([RunConfig.from_config(with_overrides(c, {"seed": s})) for s in SEEDS], bases, 10)
    gains = [row["final_accuracy"] - row["initial_accuracy"] for row in rows]
    for row, accuracy in zip(rows, warmed):  # vmapped: the same problems as the warm-up's last check
        assert row["initial_accuracy"] == pytest.approx(accuracy, abs=0.01)
    assert np.mean(gains) >= MIN_MEAN_GAIN, [row["accuracy"] for row in rows]


def test_every_method_rg_runs_the_methods_the_task_can_and_names_those_it_cannot():
    """`experiments.reproduce` every_method_rg: each grouped method's config builds with the reasoning-gym
    task; each left out is refused in one line for the reason the table gives."""
    from experiments import reproduce

    for group in reproduce.RG_METHOD_GROUPS:
        for algo in group:
            assert spec_of(rg_config(algo=algo)).algorithm.name == algo
    for algo, why in reproduce.RG_NOT_APPLICABLE.items():
        with pytest.raises(ConfigError, match=why.split()[0]):
            spec_of(rg_config(algo=algo))
