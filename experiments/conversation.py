"""A policy and its task's prompt rendering, one prompt at a time: what `experiments/chat.py` and
`experiments/serve.py` (through `experiments/serving.py`) talk to.

`make_chat(policy, step)` loads a run workdir's checkpoint or a Hugging Face directory and picks the
renderer: `ArithmeticPrompts` (the built-in task: `47+85` -> its prompt; a response -> the value it
states) or `TextPrompts` (a text policy: the run's / a chat template, or the text as it is).
`Chat.reply(line)` renders, generates with `sampler.generate` (one row) and shows the response.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pipo_jax.data import char_vocab as cv
from pipo_jax.data.prompts import PromptConfig, render_prompt
from pipo_jax.data.tokenizer import load_tokenizer, pad_token_id, stop_token_ids
from pipo_jax.run import evaluate
from pipo_jax.sampling import sampler
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.tasks import arithmetic

PROMPT_BUCKET = 32  # text prompts are left-padded to a multiple of this: few compiles
_PROBLEM = re.compile(r"^\s*(\d+)\s*([-+*])\s*(\d+)\s*=?\s*$")


class ArithmeticPrompts:
    """The built-in task's rendering: `lhs op rhs[=]` -> its prompt; a response -> its stated answer."""

    def __init__(self, task: arithmetic.ArithmeticTask):
        self.task = task

    def render(self, line: str) -> tuple[np.ndarray, np.ndarray, Any]:
        m = _PROBLEM.match(line)
        if not m:
            raise ValueError(f"{line.strip()!r} is not a problem of the arithmetic task "
                             f"(write e.g. 47+85, operators {''.join(self.task.ops)})")
        lhs, op, rhs = int(m.group(1)), m.group(2), int(m.group(3))
        if op not in self.task.ops:
            raise ValueError(f"operator {op!r}: this policy was trained on {''.join(self.task.ops)}")
        for x in (lhs, rhs):
            if x >= 10**self.task.max_digits:
                raise ValueError(f"operand {x}: this policy was trained on operands of at most "
                                 f"{self.task.max_digits} digits")
        if op == "-" and lhs < rhs and not self.task.allow_negative:
            raise ValueError(f"{lhs}-{rhs}: this policy was trained on non-negative differences only")
        problems = arithmetic.make_problems(self.task, np.array([lhs]), np.array([cv.OPERATORS.index(op)]),
                                            np.array([rhs]))
        return np.asarray(problems.prompt_tokens_bp[0]), np.asarray(problems.prompt_mask_bp[0]), \
            int(problems.answer_b[0])

    bos_id = cv.BOS_ID

    @staticmethod
    def text(ids) -> str:
        """The tokens' text; an id past the character vocabulary (a model's padded vocab rows) reads `<id:N>`."""
        return "".join(cv.TOKENS[i] if 0 <= i < cv.VOCAB_SIZE else f"<id:{i}>" for i in map(int, ids))

    def show(self, response_ids: list[int], answer: int) -> str:
        text = self.text([i for i in response_ids if i != cv.EOS_ID])
        stated = arithmetic.read_answer(self.task, text)
        if stated is None:
            verdict = f"(no answer; expected {answer})"
        else:
            verdict = f"= {stated} " + ("(correct)" if stated == answer else f"(expected {answer})")
        ended = "" if cv.EOS_ID in response_ids else " [no <eos>]"
        return f"{text}\t{verdict}{ended}"


class TextPrompts:
    """A text policy's rendering: its chat template (`config`) or the raw text; responses decoded."""

    def __init__(self, tokenizer: Any, config: PromptConfig | None, max_prompt_tokens: int):
        self.tokenizer, self.config, self.max_prompt_tokens = tokenizer, config, max_prompt_tokens

    def render(self, line: str) -> tuple[np.ndarray, np.ndarray, Any]:
        text = line.rstrip("\n")
        if self.config is not None:
            text = render_prompt(self.tokenizer, text, self.config)
        ids = self.tokenizer.encode(text, add_special_tokens=self.config is None)
        if not ids:
            raise ValueError("empty prompt")
        if len(ids) > self.max_prompt_tokens:
            raise ValueError(f"the prompt has {len(ids)} tokens, more than --max_prompt_tokens={self.max_prompt_tokens}")
        width = -(-len(ids) // PROMPT_BUCKET) * PROMPT_BUCKET
        tokens = np.full(width, pad_token_id(self.tokenizer), np.int32)
        tokens[width - len(ids):] = ids
        mask = (np.arange(width) >= width - len(ids)).astype(np.int32)
        return tokens, mask, None

    @property
    def bos_id(self) -> int | None:
        return self.tokenizer.bos_token_id

    def text(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def show(self, response_ids: list[int], _: Any) -> str:
        return self.text(response_ids)


class Chat:
    """Responses of one policy to one prompt at a time (`sampler.generate`, one row)."""

    def __init__(self, model, params, prompts, *, stop_ids, pad_id: int, max_new_tokens: int,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        self.model, self.params, self.prompts = model, params, prompts
        self.stop_ids, self.pad_id, self.max_new_tokens = tuple(stop_ids), pad_id, max_new_tokens
        self.temperature, self.top_p = temperature, top_p
        self.rng = jax.random.PRNGKey(seed)
        self.count = 0

    def response_ids(self, tokens_p: np.ndarray, mask_p: np.ndarray) -> list[int]:
        out = sampler.generate(self.model, self.params, jnp.asarray(tokens_p[None]), jnp.asarray(mask_p[None]),
                               jax.random.fold_in(self.rng, self.count),
                               SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                                              top_p=self.top_p, stop_token_ids=self.stop_ids, pad_id=self.pad_id))
        self.count += 1
        tokens, mask = np.asarray(out.tokens_br[0]), np.asarray(out.mask_br[0])
        return [int(t) for t in tokens[mask == 1]]

    def reply(self, line: str) -> str:
        tokens, mask, info = self.prompts.render(line)
        return self.prompts.show(self.response_ids(tokens, mask), info)


def _generation_config(path: str) -> dict:
    gen_path = os.path.join(path, "generation_config.json")
    if not os.path.exists(gen_path):
        return {}
    with open(gen_path, encoding="utf-8") as f:
        return json.load(f)


def make_chat(policy: str, step: int | None = None, *, max_new_tokens: int | None = None,
              temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, prompt_style: str = "auto",
              max_prompt_tokens: int = 2048) -> Chat:
    """A `Chat` on a run workdir's checkpoint (`step`, default the newest that reads) or a HF directory."""
    model, params, spec = evaluate.load_policy(policy, step)
    kw = dict(temperature=temperature, top_p=top_p, seed=seed)
    if spec is not None and spec.task.tokenizer is None:  # the built-in task
        task = spec.task
        return Chat(model, params, ArithmeticPrompts(task), stop_ids=task.stop_token_ids, pad_id=task.pad_id,
                    max_new_tokens=max_new_tokens or task.answer_len, **kw)
    if spec is not None:
        run = evaluate.load_run_config(policy)
        prompts = TextPrompts(spec.task.tokenizer, spec.task.prompt_config, max_prompt_tokens)
        return Chat(model, params, prompts, stop_ids=spec.task.stop_token_ids, pad_id=spec.task.pad_id,
                    max_new_tokens=max_new_tokens or run.rollout.max_new_tokens, **kw)
    tokenizer = load_tokenizer(policy)
    templated = prompt_style == "instruct" or (prompt_style == "auto" and getattr(tokenizer, "chat_template", None))
    config = PromptConfig(style="instruct", instruction="", max_prompt_tokens=max_prompt_tokens) if templated else None
    budget = max_new_tokens or _generation_config(policy).get("max_new_tokens") or 512
    return Chat(model, params, TextPrompts(tokenizer, config, max_prompt_tokens),
                stop_ids=stop_token_ids(tokenizer, policy), pad_id=pad_token_id(tokenizer),
                max_new_tokens=int(budget), **kw)
