"""Talking to and loading a trained policy. `experiments/export.py` / `run/export.py`: a run's
checkpoint N as a Hugging Face directory that `transformers` loads (model and tokenizer) and that
generates, greedily, the tokens of the project's sampler; bf16 weights; the model card; file modes;
the trainer's end-of-run export; one-line errors. `experiments/chat.py`: the task's prompt
rendering and the sampler's responses, in process and with prompts piped in."""

import json
import os
import pathlib
import re
import stat

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

from configs import grpo
from experiments import cli
from experiments import eval as eval_cli
from pipo_jax.data import char_vocab as cv
from pipo_jax.models import hf
from pipo_jax.config.sections import RunConfig
from pipo_jax.run import evaluate, export
from pipo_jax.run.workdir import stored_form
from pipo_jax.sampling import sampler
from pipo_jax.sampling.sampling_params import SamplingParams
from tests.conftest import override
from tests.scripts import run_script
from tests.typed import train_config

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 2-iteration micro run on the built-in task, checkpoints 0, 1 and 2."""
    root = tmp_path_factory.mktemp("run")
    c = grpo.get_config("micro")
    c.iterations = 2
    c.checkpoint.every = 1
    summary = train_config(c, str(root))
    return root, summary


def _modes(path: pathlib.Path) -> set[tuple[str, int]]:
    return {(p.name, stat.S_IMODE(p.stat().st_mode)) for p in [path, *path.rglob("*")]}


def _sampler_responses(policy_dir: str, step: int, n: int = 12) -> tuple[list[str], list[list[int]]]:
    """Held-out prompts (text) and the sampler's greedy responses (stop token included) at `step`."""
    spec, state = evaluate.restore_run(policy_dir, step)
    problems = spec.task.heldout_problems(None, n, jax.random.PRNGKey(7))
    out = sampler.generate(spec.model, state.params, problems.prompt_tokens_bp, problems.prompt_mask_bp,
                           jax.random.PRNGKey(0),
                           SamplingParams(max_new_tokens=spec.task.answer_len, temperature=0.0,
                                          stop_token_ids=spec.task.stop_token_ids, pad_id=spec.task.pad_id))
    tokens, mask = np.asarray(out.tokens_br), np.asarray(out.mask_br)
    prompts = [cv.decode(t, skip_pad=True) for t in np.asarray(problems.prompt_tokens_bp)]
    return prompts, [list(map(int, t[m == 1])) for t, m in zip(tokens, mask)]


def _hf_greedy(out_dir: str, prompts: list[str], torch_dtype=None) -> list[list[int]]:
    """`transformers`' greedy generation from the export (its generation_config.json), cut after the stop token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out_dir)
    model = AutoModelForCausalLM.from_pretrained(out_dir, **({"dtype": torch_dtype} if torch_dtype else {}))
    batch = tok(prompts, return_tensors="pt", padding=True)  # left padding (tokenizer_config)
    with torch.no_grad():
        gen = model.generate(**batch)
    width = batch.input_ids.shape[1]
    rows = []
    for row in gen[:, width:].tolist():
        rows.append(row[: row.index(tok.eos_token_id) + 1] if tok.eos_token_id in row else row)
    return rows


def test_export_of_step_n_loads_in_transformers_and_generates_as_the_sampler(run, tmp_path):
    root, _ = run
    out = tmp_path / "export"
    previous = os.umask(0o077)  # modes are set explicitly, whatever the umask
    try:
        export.export_policy(str(root), str(out), step=1)
    finally:
        os.umask(previous)
    assert {name for name, _ in _modes(out)} >= {"config.json", "model.safetensors", "tokenizer.json",
                                                 "tokenizer_config.json", "generation_config.json", "README.md"}
    assert _modes(out) == {(out.name, 0o755)} | {(p.name, 0o644) for p in out.iterdir()}

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    assert len(tok) == cv.VOCAB_SIZE and (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    prompts, expected = _sampler_responses(str(root), 1)
    for p in prompts:
        assert tok.encode(p) == cv.encode(p) and tok.decode(cv.encode(p)) == p
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "do_sample": False, "max_new_tokens": 4}
    assert _hf_greedy(str(out), prompts) == expected
    assert any(len(r) > 1 for r in expected)

    card = (out / "README.md").read_text()
    assert f"Exported from the run `{root}` at iteration 1 of 2." in card
    row = {k: v for k, v in export.metrics_at(str(root), 1).items()}
    assert row["step"] == 1 and f"| kl_ref | {row['kl_ref']:.6g} |" in card
    assert "| commit |" in card and "| jax |" in card
    # The weights are the checkpoint's.
    _, params = hf.load(str(out))
    _, state = evaluate.restore_run(str(root), 1)
    jax.tree.map(np.testing.assert_array_equal, params, jax.device_get(state.params))


def test_bfloat16_export_stores_bf16_weights_and_transformers_loads_them(run, tmp_path):
    root, _ = run
    out = tmp_path / "bf16"
    export.export_policy(str(root), str(out), dtype="bfloat16")  # the newest checkpoint: step 2
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {"torch.bfloat16"}
    _, state = evaluate.restore_run(str(root), 2)
    model, params = hf.load(str(out), dtype="bfloat16")
    expected = jax.tree.map(lambda x: np.asarray(x).astype(ml_dtypes.bfloat16), jax.device_get(state.params))
    jax.tree.map(np.testing.assert_array_equal, params, expected)
    assert "iteration 2 of 2" in (out / "README.md").read_text()
    import torch
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(out))
    assert loaded.dtype == torch.bfloat16
    # The project's sampler on the bf16 weights (bf16 compute) and transformers' greedy decoding agree.
    prompts, _ = _sampler_responses(str(root), 2)
    spec, _ = evaluate.restore_run(str(root), 2)
    toks = [cv.encode(p) for p in prompts]
    width = max(map(len, toks))
    tokens = jnp.asarray([[0] * (width - len(t)) + t for t in toks], jnp.int32)
    mask = jnp.asarray([[0] * (width - len(t)) + [1] * len(t) for t in toks], jnp.int32)
    ours = sampler.generate(model.replace(dtype="bfloat16"), params, tokens, mask, jax.random.PRNGKey(0),
                            SamplingParams(max_new_tokens=4, temperature=0.0, stop_token_ids=(cv.EOS_ID,),
                                           pad_id=cv.PAD_ID))
    ours_rows = [list(map(int, t[m == 1])) for t, m in zip(np.asarray(ours.tokens_br), np.asarray(ours.mask_br))]
    theirs = _hf_greedy(str(out), prompts)
    same = sum(a == b for a, b in zip(ours_rows, theirs))
    assert same >= len(prompts) - 1, (ours_rows, theirs)  # bf16 rounding may flip one near-tie


def test_the_trainers_hf_export_is_the_same_export(run):
    root, summary = run
    out = pathlib.Path(summary["hf_export"])
    assert out == root / "hf_export"
    assert (out / "tokenizer.json").exists() and (out / "generation_config.json").exists()
    assert _modes(out) == {(out.name, 0o755)} | {(p.name, 0o644) for p in out.iterdir()}
    assert "at iteration 2 of 2" in (out / "README.md").read_text()
    prompts, expected = _sampler_responses(str(root), 2)
    assert _hf_greedy(str(out), prompts) == expected


def _cli(*args, cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return run_script("-m", "experiments.export", *args, cwd=cwd, env=env)


@pytest.mark.slow  # four interpreter start-ups (~15 s each on a loaded 2-core CPU)
def test_cli_exports_and_reports_bad_input_in_one_line(run, tmp_path):
    root, _ = run
    res = _cli(f"--policy={root}", f"--out={tmp_path / 'e'}", "--step=0")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "at iteration 0 of 2" in (tmp_path / "e" / "README.md").read_text()
    cases = [([f"--policy={root}", f"--out={tmp_path / 'x'}", "--step=7"], "no checkpoint of step 7 (saved: [0, 1, 2])"),
             ([f"--policy={root}", f"--out={root}"], "is the policy directory itself"),
             ([f"--policy={tmp_path / 'missing'}", f"--out={tmp_path / 'y'}"], "neither a Hugging Face directory")]
    for args, message in cases:
        res = _cli(*args)
        assert res.returncode == 2, res.stderr[-2000:]
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.stderr[-2000:]


# ----------------------------------------------------------------------------- chat


def _expected_replies(root, step, problems_text):
    """The sampler's greedy responses to `lhs op rhs` problems, rendered as the task renders them."""
    from pipo_jax.tasks import arithmetic

    spec, state = evaluate.restore_run(str(root), step)
    parsed = [(int(a), cv.OPERATORS.index(op), int(b)) for a, op, b in
              (re.match(r"(\d+)([-+*])(\d+)", t).groups() for t in problems_text)]
    problems = arithmetic.make_problems(spec.task, *(np.array(col) for col in zip(*parsed)))
    out = sampler.generate(spec.model, state.params, problems.prompt_tokens_bp, problems.prompt_mask_bp,
                           jax.random.PRNGKey(0),
                           SamplingParams(max_new_tokens=spec.task.answer_len, temperature=0.0,
                                          stop_token_ids=spec.task.stop_token_ids, pad_id=spec.task.pad_id))
    tokens, mask = np.asarray(out.tokens_br), np.asarray(out.mask_br)
    return [list(map(int, t[m == 1])) for t, m in zip(tokens, mask)], problems


def test_chat_renders_the_task_prompt_and_answers_as_the_sampler(run):
    from experiments import conversation as chat_lib

    root, _ = run
    texts = ["3+4", "12+5", "9-7", "40+40"]
    expected, problems = _expected_replies(root, 1, texts)
    chat = chat_lib.make_chat(str(root), 1)
    for i, (text, ids) in enumerate(zip(texts, expected)):
        tokens, mask, answer = chat.prompts.render(text + ("=" if i % 2 else ""))
        np.testing.assert_array_equal(tokens, np.asarray(problems.prompt_tokens_bp[i]))
        assert answer == int(problems.answer_b[i])
        assert chat.response_ids(tokens, mask) == ids
        assert chat.reply(text).split("\t")[0] == cv.decode([t for t in ids if t != cv.EOS_ID])
    with pytest.raises(ValueError, match="not a problem of the arithmetic task"):
        chat.reply("hello")
    # Outside what the task trained on (a 3-digit operand): a notice naming it, and still an answer.
    assert chat.notice("12+5") is None
    notice = chat.notice("123+4")
    assert "123 (3 digits)" in notice and "trained on 1- to 2-digit operands" in notice
    assert "127" in chat.reply("123+4").split("\t")[1]


def test_chat_states_the_answer_and_whether_it_is_right():
    from pipo_jax.tasks import arithmetic
    from pipo_jax.tasks.arithmetic_chat import ArithmeticPrompts

    prompts = ArithmeticPrompts(arithmetic.ArithmeticTask(max_digits=2, answer_format="reversed"))
    assert prompts.show(cv.encode("231<eos>"), 132) == "231\t= 132 (correct)"
    assert prompts.show(cv.encode("31<eos>"), 132) == "31\t= 13 (expected 132)"
    assert prompts.show(cv.encode("=="), 132) == "==\t(no answer; expected 132) [no <eos>]"
    worked = arithmetic.ArithmeticTask(max_digits=2, answer_format="worked")
    assert arithmetic.read_answer(worked, "231;132") == 132 and arithmetic.read_answer(worked, "231") == 231


@pytest.mark.slow  # an interpreter start-up with a checkpoint restore (~15 s on a loaded 2-core CPU)
def test_chat_command_answers_piped_prompts(run):
    root, _ = run
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = run_script("-m", "experiments.chat", f"--policy={root}", "--step=1", input="3+4\nhello\n\n12+5=\n", env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    expected, _ = _expected_replies(root, 1, ["3+4", "12+5"])
    replies = res.stdout.split("\n\n")
    assert replies[-1] == "" and len(replies) == 3, res.stdout
    assert [r.split("\t")[0] for r in replies[:2]] == [cv.decode([t for t in ids if t != cv.EOS_ID])
                                                       for ids in expected]
    assert "error: 'hello' is not a problem of the arithmetic task" in res.stderr


# ----------------------------------------------------------------------------- text policies (HF directories)


@pytest.fixture(scope="module")
def text_model_dir(tmp_path_factory):
    """A random tiny HF Qwen3 with the tiny BPE tokenizer (chat template; generation_config eos ids)."""
    from tests.conftest import make_hf_qwen3
    from tests.data.tiny_tokenizer import save_tiny_tokenizer

    path = tmp_path_factory.mktemp("text_policy")
    make_hf_qwen3(path, tied=True, vocab_size=320)
    save_tiny_tokenizer(str(path), generation_eos=[1, 2])
    return path


def test_export_of_a_hf_directory_keeps_its_tokenizer_and_generation_config(text_model_dir, tmp_path):
    from transformers import AutoTokenizer

    out = tmp_path / "export"
    export.export_policy(str(text_model_dir), str(out), dtype="bfloat16")
    source, exported = AutoTokenizer.from_pretrained(str(text_model_dir)), AutoTokenizer.from_pretrained(str(out))
    text = "What is 1 + 2? Please reason step by step."
    assert exported.encode(text) == source.encode(text) and exported.chat_template == source.chat_template
    assert json.loads((out / "generation_config.json").read_text()) == json.loads(
        (text_model_dir / "generation_config.json").read_text())
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert f"Exported from `{text_model_dir}`." in (out / "README.md").read_text()
    assert _modes(out) == {(out.name, 0o755)} | {(p.name, 0o644) for p in out.iterdir()}
    # A model directory without a tokenizer is refused before any weight is read or written.
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((text_model_dir / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="no tokenizer files in"):
        export.export_policy(str(bare), str(tmp_path / "never"))
    assert not (tmp_path / "never").exists()
    with pytest.raises(export.ExportError, match="--step=3: .* is not a run workdir"):
        export.export_policy(str(text_model_dir), str(tmp_path / "never"), step=3)


def test_chat_on_a_hf_directory_renders_its_chat_template(text_model_dir):
    from experiments import conversation
    from pipo_jax.data.prompts import PromptConfig, render_prompt

    chat = conversation.make_chat(str(text_model_dir), max_new_tokens=6)
    question = "What is 1 + 2?"
    tok = chat.prompts.tokenizer
    ids = tok.encode(render_prompt(tok, question, PromptConfig(style="instruct", instruction="")),
                     add_special_tokens=False)
    model, params = hf.load(str(text_model_dir))
    out = sampler.generate(model, params, jnp.asarray([ids]), jnp.ones((1, len(ids)), jnp.int32),
                           jax.random.PRNGKey(0), SamplingParams(max_new_tokens=6, temperature=0.0,
                                                                 stop_token_ids=chat.stop_ids, pad_id=chat.pad_id))
    expected = [int(t) for t, m in zip(np.asarray(out.tokens_br[0]), np.asarray(out.mask_br[0])) if m]
    assert "<|im_start|>assistant" in tok.decode(ids) and chat.stop_ids == (1, 2)
    assert chat.reply(question) == tok.decode(expected, skip_special_tokens=True)
    raw = conversation.make_chat(str(text_model_dir), max_new_tokens=6, prompt_style="raw")
    assert raw.prompts.config is None


def test_a_runs_tokenizer_is_its_dataset_tokenizer_path_else_its_model_path(tmp_path):
    """One rule for export and eval (`DatasetSettings.tokenizer_dir`): `task.dataset.tokenizer_path`, else
    `model.path`, read from the run's stored config.json; neither set: None (export) / a usage error (eval)."""
    def stored(name, **overrides):
        workdir = tmp_path / name
        workdir.mkdir()
        run = RunConfig.from_config(override(grpo.get_config("micro"), overrides))
        (workdir / "config.json").write_text(json.dumps(stored_form(run)))
        return str(workdir)

    both = stored("both", **{"model.path": "/models/base", "task.dataset.tokenizer_path": "/models/tok"})
    model_only = stored("model_only", **{"model.path": "/models/base"})
    neither = stored("neither")
    assert export.run_tokenizer_dir(evaluate.load_run_config(both)) == "/models/tok"
    assert eval_cli.tokenizer_path(both, object(), None) == "/models/tok"
    assert eval_cli.tokenizer_path(model_only, object(), None) == "/models/base"
    assert export.run_tokenizer_dir(evaluate.load_run_config(neither)) is None
    with pytest.raises(cli.UsageError, match="the run trained the built-in task's model, which has no tokenizer"):
        eval_cli.tokenizer_path(neither, object(), None)
