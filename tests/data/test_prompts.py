"""Tokenizer loading and prompt building with a tiny locally built tokenizer."""
import logging

import pytest

from pipo_jax.data import prompts as pr
from pipo_jax.data import tokenizer as tk
from pipo_jax.data.sources import Example
from tests.data.tiny_tokenizer import save_tiny_tokenizer

Q = "What is 1 + 2?"
INSTR = pr.DEFAULT_INSTRUCTION


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return save_tiny_tokenizer(tmp_path_factory.mktemp("tok"), generation_eos=[2, 0])


@pytest.fixture(scope="module")
def tok(tok_dir):
    return tk.load_tokenizer(tok_dir)


def ex(prompt, origin="t.jsonl:1"):
    return Example(prompt, "3", {}, origin)


# ---------------------------------------------------------------- tokenizer

def test_load_tokenizer_and_special_ids(tok, tok_dir):
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert tk.stop_token_ids(tok) == (2,)
    assert tk.stop_token_ids(tok, tok_dir) == (0, 2)  # generation_config.json adds <|endoftext|>
    assert tk.pad_token_id(tok) == 0


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer directory not found: .*nope"):
        tk.load_tokenizer(str(tmp_path / "nope"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"no tokenizer files in .*config\.json"):
        tk.load_tokenizer(str(tmp_path))


def test_pad_falls_back_to_eos():
    class NoPad:
        pad_token_id = None
        eos_token_id = [7, 9]

    assert tk.pad_token_id(NoPad()) == 7
    NoPad.eos_token_id = None
    with pytest.raises(ValueError, match="neither a pad nor an eos"):
        tk.pad_token_id(NoPad())


# ---------------------------------------------------------------- rendering

def test_instruct_style_uses_the_chat_template(tok):
    text = pr.render_prompt(tok, Q, pr.PromptConfig())
    assert text == f"<|im_start|>user\n{Q}\n{INSTR}<|im_end|>\n<|im_start|>assistant\n"
    no_think = pr.render_prompt(tok, Q, pr.PromptConfig(enable_thinking=False))
    assert no_think == text + "<think>\n\n</think>\n\n"
    assert pr.render_prompt(tok, Q, pr.PromptConfig(enable_thinking=True)) == text
    sys_text = pr.render_prompt(tok, Q, pr.PromptConfig(system_prompt="You are careful."))
    assert sys_text == "<|im_start|>system\nYou are careful.<|im_end|>\n" + text


def test_instruction_options(tok):
    before = pr.render_prompt(tok, Q, pr.PromptConfig(instruction="Answer briefly.", instruction_position="before",
                                                      separator="\n\n"))
    assert before == f"<|im_start|>user\nAnswer briefly.\n\n{Q}<|im_end|>\n<|im_start|>assistant\n"
    bare = pr.render_prompt(tok, Q, pr.PromptConfig(instruction=""))
    assert bare == f"<|im_start|>user\n{Q}<|im_end|>\n<|im_start|>assistant\n"


def test_base_style(tok):
    chat = pr.render_prompt(tok, Q, pr.PromptConfig(style="base"))
    assert chat == f"<|im_start|>user\n{Q}\n{INSTR}<|im_end|>\n<|im_start|>assistant\n"
    plain = pr.render_prompt(tok, Q, pr.PromptConfig(style="base", base_template="Question: {prompt}\nAnswer:"))
    assert plain == f"Question: {Q}\n{INSTR}\nAnswer:"
    with pytest.raises(ValueError, match="instruct' only"):
        pr.PromptConfig(style="base", enable_thinking=False)
    with pytest.raises(ValueError, match="base' only"):
        pr.PromptConfig(base_template="{prompt}")
    with pytest.raises(ValueError, match="must contain"):
        pr.PromptConfig(style="base", base_template="no slot")


def test_chat_message_prompts(tok):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": Q}]
    text = pr.render_prompt(tok, msgs, pr.PromptConfig(system_prompt="ignored: one is present"))
    assert text == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\nhello<|im_end|>\n"
                    f"<|im_start|>user\n{Q}\n{INSTR}<|im_end|>\n<|im_start|>assistant\n")
    assert msgs[3]["content"] == Q  # the input is not modified
    with pytest.raises(ValueError, match="no user message"):
        pr.render_prompt(tok, [{"role": "system", "content": "S"}], pr.PromptConfig())


def test_tokenizer_without_chat_template(tmp_path):
    plain_tok = tk.load_tokenizer(save_tiny_tokenizer(tmp_path, chat_template=None))
    with pytest.raises(ValueError, match="no chat_template"):
        pr.render_prompt(plain_tok, Q, pr.PromptConfig())
    text = pr.render_prompt(plain_tok, Q, pr.PromptConfig(style="base", base_template="{prompt}"))
    assert text == f"{Q}\n{INSTR}"


# ---------------------------------------------------------------- tokens and length limits

def _lengths(tok, questions):
    cfg = pr.PromptConfig(max_prompt_tokens=10_000)
    return [len(ids) for ids in pr.build_prompts([ex(q) for q in questions], tok, cfg).token_ids]


def test_build_prompts_tokens_roundtrip(tok):
    out = pr.build_prompts([ex(Q), ex("Find x.")], tok, pr.PromptConfig(max_prompt_tokens=10_000))
    assert out.num_dropped == 0 and out.num_truncated == 0
    for ids, text in zip(out.token_ids, out.texts, strict=True):
        assert tok.decode(ids) == text
        assert ids[:1] == [1]  # <|im_start|>: the template's special tokens are single ids
    assert out.token_ids[0][-3:] == tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"][-3:]


def test_overlong_drop_counts_and_logs(tok, caplog):
    questions = [Q, "Find the sum of all x such that x^2 = 4. " * 5, "Find x."]
    n_short, n_long, n_mid = _lengths(tok, questions)
    assert n_long > n_short and n_long > n_mid
    limit = max(n_short, n_mid)
    examples = [ex(q, f"d.jsonl:{i + 1}") for i, q in enumerate(questions)]
    with caplog.at_level(logging.WARNING, logger="pipo_jax.data.prompts"):
        out = pr.build_prompts(examples, tok, pr.PromptConfig(max_prompt_tokens=limit))
    assert out.num_dropped == 1 and out.dropped_origins == ["d.jsonl:2"]
    assert [e.origin for e in out.examples] == ["d.jsonl:1", "d.jsonl:3"]
    assert f"dropped 1 of 3 prompts longer than {limit} tokens (first: d.jsonl:2)" in caplog.text


def test_overlong_truncation_and_error(tok):
    long_q = "Find the sum of all x such that x^2 = 4. " * 5
    full = pr.build_prompts([ex(long_q)], tok, pr.PromptConfig(max_prompt_tokens=10_000)).token_ids[0]
    limit = len(full) - 7
    left = pr.build_prompts([ex(long_q)], tok, pr.PromptConfig(max_prompt_tokens=limit, overlong="truncate_left"))
    right = pr.build_prompts([ex(long_q)], tok, pr.PromptConfig(max_prompt_tokens=limit, overlong="truncate_right"))
    assert left.token_ids == [full[-limit:]] and right.token_ids == [full[:limit]]
    assert left.num_truncated == right.num_truncated == 1 and left.num_dropped == 0
    msg = rf"q\.jsonl:7: prompt has {len(full)} tokens, more than max_prompt_tokens={limit}"
    with pytest.raises(ValueError, match=msg):
        pr.build_prompts([ex(long_q, "q.jsonl:7")], tok, pr.PromptConfig(max_prompt_tokens=limit, overlong="error"))


def test_prompt_config_validation():
    with pytest.raises(ValueError, match="style"):
        pr.PromptConfig(style="chat")
    with pytest.raises(ValueError, match="overlong"):
        pr.PromptConfig(overlong="cut")
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        pr.PromptConfig(max_prompt_tokens=0)
    with pytest.raises(ValueError, match="instruction_position"):
        pr.PromptConfig(instruction_position="middle")
