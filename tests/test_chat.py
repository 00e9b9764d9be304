"""What a new user meets when talking to a policy (`experiments/chat.py` over
`experiments/conversation.py`, `experiments/serve.py` over `experiments/serving.py`):

- a problem outside what the task trained on (the main job's 2-digit operands: `3+4`; an operator or
  a digit count it never saw) gets a one-line notice naming what is outside, and is still answered
  with the sampler's tokens;
- an over-long prompt (a 100k-character line) is refused in one short line naming the prompt's
  tokens and the policy's max prompt length, by chat and by the server's request check (whose
  refusal travels as gRPC trailing metadata, so it must stay short);
- start-up prints no `Unable to initialize backend 'tpu'` line, and the server sets TensorFlow's
  variables before TensorFlow is imported, only where the user did not set them.

The policy is a random tiny model on the main job's task (no training)."""

import os
import pathlib
import subprocess
import sys
import textwrap
import types

import jax
import numpy as np
import pytest

from configs import grpo
from pipo_jax.data import char_vocab as cv
from pipo_jax.models import qwen3
from pipo_jax.config.sections import RunConfig
from pipo_jax.sampling import sampler
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.tasks import arithmetic
from tests.typed import spec_of

ROOT = pathlib.Path(__file__).resolve().parents[1]
LONG = "1" * 100_000 + "+1"  # a 100k-character problem


def tiny_task() -> arithmetic.ArithmeticTask:
    """The main job's task (configs/grpo.py:tiny: 2-digit operands, + and -)."""
    task = arithmetic.from_config(RunConfig.from_config(grpo.get_config("tiny")))
    assert (task.min_digits, task.max_digits, task.ops) == (2, 2, ("+", "-"))
    return task


@pytest.fixture(scope="module")
def chat():
    from experiments.conversation import Chat
    from pipo_jax.tasks.arithmetic_chat import ArithmeticPrompts

    model = spec_of(grpo.get_config("micro")).model
    params = qwen3.init_params(model, jax.random.PRNGKey(3), std=0.3)
    task = tiny_task()
    return Chat(model, params, ArithmeticPrompts(task, max_prompt_tokens=64), stop_ids=task.stop_token_ids,
                pad_id=task.pad_id, max_new_tokens=task.answer_len)


def _greedy(chat, tokens, mask) -> list[int]:
    out = sampler.generate(chat.model, chat.params, tokens[None], mask[None], jax.random.PRNGKey(0),
                           SamplingParams(max_new_tokens=chat.max_new_tokens, temperature=0.0,
                                          stop_token_ids=chat.stop_ids, pad_id=chat.pad_id))
    return [int(t) for t, m in zip(np.asarray(out.tokens_br[0]), np.asarray(out.mask_br[0])) if m]


def test_a_problem_inside_the_task_gets_no_notice(chat):
    for line in ("47+85", "63-28", " 10 + 99 =", "99-10"):
        assert chat.notice(line) is None, line


@pytest.mark.parametrize("line, prompt, answer, named", [
    ("3+4", "<bos>3+4=", 7, ["3 (1 digit)", "4 (1 digit)", "trained on 2-digit operands"]),
    ("47*85", "<bos>47*85=", 3995, ["operator '*'", "trained on +-"]),
    ("123+45", "<bos>123+45=", 168, ["123 (3 digits)", "trained on 2-digit operands"]),
    ("12-34", "<bos>12-34=", -22, ["negative difference"]),
])
def test_a_problem_outside_the_task_is_noticed_in_one_line_and_still_answered(chat, line, prompt, answer, named):
    notice = chat.notice(line)
    assert notice is not None and "\n" not in notice and notice.startswith("note: ")
    assert "outside what this policy was trained on" in notice
    for part in named:
        assert part in notice, (part, notice)
    tokens, mask, expected = chat.prompts.render(line)
    assert expected == answer
    assert cv.decode([int(t) for t, m in zip(tokens, mask) if m]) == prompt
    assert len(tokens) >= chat.prompts.task.prompt_len and mask[-1] == 1  # left-padded as the task's prompts
    response = _greedy(chat, tokens, mask)
    reply = chat.reply(line)
    assert reply.split("\t")[0] == chat.prompts.text([t for t in response if t != cv.EOS_ID])
    assert str(answer) in reply.split("\t")[1]


def test_an_inside_problem_renders_exactly_as_the_task(chat):
    tokens, mask, answer = chat.prompts.render("47+85")
    problems = arithmetic.make_problems(tiny_task(), np.array([47]), np.array([0]), np.array([85]))
    np.testing.assert_array_equal(tokens, np.asarray(problems.prompt_tokens_bp[0]))
    np.testing.assert_array_equal(mask, np.asarray(problems.prompt_mask_bp[0]))
    assert answer == 132


def test_an_over_long_prompt_is_one_short_line_naming_the_limit(chat):
    for line in (LONG, "a" * 100_000):
        with pytest.raises(ValueError) as refused:
            chat.reply(line)
        message = str(refused.value)
        assert message == f"the prompt has {len(line) + 2} tokens, over the policy's max prompt length of 64 tokens"
    # A line that is no problem is quoted cut short.
    with pytest.raises(ValueError) as refused:
        chat.reply("hello " * 8)
    assert "not a problem of the arithmetic task" in str(refused.value) and "(47 characters)" in str(refused.value)
    assert len(str(refused.value)) < 200


def test_the_servers_request_check_refuses_an_over_long_prompt_in_a_short_line(chat):
    from experiments import serving

    tokenizer = serving.PolicyTokenizer(chat, max_prefill_length=16)
    with pytest.raises(ValueError, match=r"^the prompt has 100004 tokens, over the policy's max prompt length of "
                                         r"16 tokens$"):
        tokenizer.prompt_ids(LONG)
    request = types.SimpleNamespace(max_tokens=4, session_cache="", text_content=types.SimpleNamespace(text=LONG),
                                    WhichOneof=lambda _: "text_content")
    problem = serving._request_problem(request, tokenizer, max_new_tokens=4)
    assert problem == "the prompt has 100004 tokens, over the policy's max prompt length of 16 tokens"
    ids = types.SimpleNamespace(max_tokens=4, session_cache="", token_content=types.SimpleNamespace(token_ids=[5] * 20),
                                WhichOneof=lambda _: "token_content")
    assert serving._request_problem(ids, tokenizer, max_new_tokens=4) == (
        "the prompt has 21 tokens, over the policy's max prompt length of 16 tokens (with bos; the server's "
        "--max_prefill_length)")
    # Whatever the refusal, its text stays far below gRPC's 8 KiB metadata limit.
    assert serving.bounded("x" * 100_000) == "x" * (serving.MAX_ERROR_CHARS - 3) + "..."
    assert serving.bounded(problem) == problem


def test_a_text_policys_over_long_prompt_names_the_limit(tmp_path):
    from experiments.conversation import TextPrompts
    from pipo_jax.data.tokenizer import load_tokenizer
    from tests.data.tiny_tokenizer import save_tiny_tokenizer

    save_tiny_tokenizer(str(tmp_path))
    prompts = TextPrompts(load_tokenizer(str(tmp_path)), None, max_prompt_tokens=2048)
    with pytest.raises(ValueError, match=r"^the prompt has \d+ tokens, over the policy's max prompt length of "
                                         r"32 tokens$"):
        prompts.render("word " * 1000, max_tokens=32)
    assert prompts.notice("word") is None


_CHAT_SCRIPT = textwrap.dedent("""
    import runpy, sys
    import jax
    from configs import grpo
    from experiments import conversation
    from pipo_jax.models import qwen3
    from pipo_jax.tasks.arithmetic_chat import ArithmeticPrompts
    from tests.typed import spec_of, task_of

    def make_chat(policy, step=None, **kw):  # a random tiny policy on the main job's task
        model = spec_of(grpo.get_config("micro")).model
        task = task_of(grpo.get_config("tiny"))
        params = qwen3.init_params(model, jax.random.PRNGKey(3), std=0.3)
        return conversation.Chat(model, params, ArithmeticPrompts(task, kw["max_prompt_tokens"]),
                                 stop_ids=task.stop_token_ids, pad_id=task.pad_id, max_new_tokens=task.answer_len)

    conversation.make_chat = make_chat
    sys.argv = ["chat", "--policy=unused"]
    runpy.run_module("experiments.chat", run_name="__main__")
""")


@pytest.mark.slow  # an interpreter start-up and a few generate compiles (~20 s on a loaded 2-core CPU)
def test_the_chat_command_says_a_notice_before_answering_and_starts_quietly():
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}  # let jax probe its backends
    env["PYTHONPATH"] = str(ROOT)
    res = subprocess.run([sys.executable, "-c", _CHAT_SCRIPT], input=f"47+85\n3+4\n{LONG}\n63-28\n",
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    replies = res.stdout.split("\n\n")
    assert len(replies) == 4 and replies[-1] == "", res.stdout  # 47+85, 3+4 (answered), 63-28
    assert "expected 132" in replies[0] or "= 132 (correct)" in replies[0]
    assert "7" in replies[1].split("\t")[1]
    lines = res.stderr.strip().splitlines()
    assert lines == [
        "note: 3+4 is outside what this policy was trained on (operands 3 (1 digit), 4 (1 digit), trained on "
        "2-digit operands): its answer may be wrong",
        f"error: the prompt has {len(LONG) + 2} tokens, over the policy's max prompt length of 2048 tokens",
    ], res.stderr[-3000:]
    assert "Unable to initialize backend" not in res.stderr


_SERVE_ENV_SCRIPT = textwrap.dedent("""
    import importlib.abc, json, os, sys

    seen = {}

    class Watch(importlib.abc.MetaPathFinder):  # the environment when the serving stack's import starts
        def find_spec(self, name, path=None, target=None):
            if name in ("grpc", "jetstream", "tensorflow") and "first" not in seen:
                seen["first"] = {k: os.environ.get(k) for k in ("TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES")}
            return None

    sys.meta_path.insert(0, Watch())
    import experiments.serve
    print(json.dumps(seen["first"]))
""")


@pytest.mark.parametrize("user, expected", [
    ({}, {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}),
    ({"TF_CPP_MIN_LOG_LEVEL": "1", "CUDA_VISIBLE_DEVICES": "0"}, {"TF_CPP_MIN_LOG_LEVEL": "1", "CUDA_VISIBLE_DEVICES": "0"}),
])
def test_serve_sets_tensorflows_variables_before_it_is_imported_unless_the_user_did(user, expected):
    import json

    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES")}
    env.update(user, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")  # jax without CUDA: TensorFlow gets no GPU
    res = subprocess.run([sys.executable, "-c", _SERVE_ENV_SCRIPT], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == expected


def test_each_task_without_a_tokenizer_chats_through_its_registered_renderer_or_says_it_has_none():
    from pipo_jax.tasks import arithmetic, digit_sum, registry
    from pipo_jax.tasks.arithmetic_chat import ArithmeticPrompts
    from pipo_jax.tasks.protocol import TaskConfigError

    prompts = registry.chat_prompts(arithmetic.from_config(RunConfig.from_config(grpo.get_config("tiny"))), 12)
    assert isinstance(prompts, ArithmeticPrompts) and prompts.max_prompt_tokens == 12
    tokens, mask, answer = prompts.render("47+85")
    assert answer == 132 and cv.TOKENS[int(tokens[mask == 1][0])] == "<bos>"
    c = grpo.get_config("micro")
    c.task.name = "digit_sum"
    with pytest.raises(TaskConfigError, match=r"^the digit_sum task has no chat rendering \(tasks with one: "
                                              r"arithmetic; a text policy's chat uses its tokenizer\)$"):
        registry.chat_prompts(digit_sum.from_config(RunConfig.from_config(c)))
