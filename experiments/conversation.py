"""A policy and its task's prompt rendering, one prompt at a time: what `experiments/chat.py` and
`experiments/serve.py` (through `experiments/serving.py`) talk to.

`make_chat(policy, step)` loads a run workdir's checkpoint or a Hugging Face directory and picks the
renderer: `ArithmeticPrompts` (the built-in task: `47+85` -> its prompt; a response -> the value it
states) or `TextPrompts` (a text policy: the run's / a chat template, or the text as it is).
`Chat.reply(line)` renders, generates with `sampler.generate` (one row) and shows the response;
`Chat.notice(line)` is one line when the line's problem lies outside what the task trained on (the
built-in task: operand digit counts outside [min_digits, max_digits], an operator not trained on),
else None. A prompt over the policy's max prompt length (`max_prompt_tokens`, within the model's
`max_position_embeddings` less the response budget) is refused naming both numbers; an error
quotes at most 40 characters of the line.
"""

from __future__ import annotations

import json
import logging
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
_QUOTE_CHARS = 40  # an error quotes at most this much of a line (a 100k-character line stays one short line)


def quote(line: str, limit: int = _QUOTE_CHARS) -> str:
    """`line` stripped and quoted, cut to `limit` characters (`'1111...' (100003 characters)`)."""
    text = line.strip()
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def too_long(n_tokens: int, limit: int) -> str:
    """The refusal of a prompt over the policy's max prompt length (chat and the server say the same)."""
    return f"the prompt has {n_tokens} tokens, over the policy's max prompt length of {limit} tokens"


def quiet_startup_logs() -> None:
    """Log WARNING and above only: absl (orbax's restore logs), orbax, and jax (its backend probe's
    INFO line `Unable to initialize backend 'tpu'` on every start), as experiments/train.py does."""
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("absl", "orbax", "jax._src"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _prompt_limit(*limits: int | None) -> int | None:
    given = [int(x) for x in limits if x is not None]
    return min(given) if given else None


class ArithmeticPrompts:
    """The built-in task's rendering: `lhs op rhs[=]` -> its prompt; a response -> its stated answer.

    A problem outside what the task trained on (operands of a digit count outside
    [task.min_digits, task.max_digits], an operator not in task.ops, a negative difference of a
    task without negative answers) is still rendered, in the task's prompt form, and answered;
    `notice(line)` says what is outside. A prompt over `max_prompt_tokens` tokens is refused.
    """

    def __init__(self, task: arithmetic.ArithmeticTask, max_prompt_tokens: int | None = None):
        self.task, self.max_prompt_tokens = task, max_prompt_tokens

    def _parse(self, line: str, max_tokens: int | None = None) -> tuple[int, str, int]:
        limit = _prompt_limit(self.max_prompt_tokens, max_tokens)
        text = "".join(line.split())
        n_tokens = len(text) + 1 + (not text.endswith("="))  # characters are tokens; <bos> and `=`
        if limit is not None and n_tokens > limit:
            raise ValueError(too_long(n_tokens, limit))
        m = _PROBLEM.match(line)
        if not m:
            raise ValueError(f"{quote(line)} is not a problem of the arithmetic task "
                             f"(write e.g. 47+85, operators {''.join(self.task.ops)})")
        return int(m.group(1)), m.group(2), int(m.group(3))

    def outside(self, lhs: int, op: str, rhs: int) -> list[str]:
        """What of `lhs op rhs` lies outside the task's training distribution (empty: nothing)."""
        t, reasons = self.task, []
        lo, hi = t.min_digits, t.max_digits
        trained = f"{lo}-digit" if lo == hi else f"{lo}- to {hi}-digit"
        odd = [x for x in (lhs, rhs) if not lo <= len(str(x)) <= hi]
        if odd:
            shown = ", ".join(f"{x} ({len(str(x))} digit{'s' if len(str(x)) > 1 else ''})" for x in odd)
            reasons.append(f"operand{'s' if len(odd) > 1 else ''} {shown}, trained on {trained} operands")
        if op not in t.ops:
            reasons.append(f"operator {op!r}, trained on {''.join(t.ops)}")
        if op == "-" and lhs < rhs and not t.allow_negative:
            reasons.append("a negative difference, trained on non-negative ones")
        return reasons

    def notice(self, line: str) -> str | None:
        """One line saying that `line`'s problem is outside what the task trained on, else None."""
        lhs, op, rhs = self._parse(line)
        reasons = self.outside(lhs, op, rhs)
        if not reasons:
            return None
        return (f"note: {lhs}{op}{rhs} is outside what this policy was trained on ({'; '.join(reasons)}): "
                "its answer may be wrong")

    def render(self, line: str, max_tokens: int | None = None) -> tuple[np.ndarray, np.ndarray, Any]:
        lhs, op, rhs = self._parse(line, max_tokens)
        t = self.task
        if (op in t.ops and max(lhs, rhs) < 10**t.max_digits and (t.allow_negative or op != "-" or lhs >= rhs)):
            problems = arithmetic.make_problems(t, np.array([lhs]), np.array([cv.OPERATORS.index(op)]),
                                                np.array([rhs]))
            return np.asarray(problems.prompt_tokens_bp[0]), np.asarray(problems.prompt_mask_bp[0]), \
                int(problems.answer_b[0])
        # Outside what `make_problems` takes: the same prompt form (<bos> lhs op rhs =, operands
        # zero-padded to max_digits when the task pads them, left-padded to at least prompt_len).
        width = t.max_digits if t.pad_operands else 1
        text = f"{str(lhs).zfill(width)}{op}{str(rhs).zfill(width)}="
        ids = [cv.BOS_ID] + [cv.TOKEN_TO_ID[ch] for ch in text]
        limit = _prompt_limit(self.max_prompt_tokens, max_tokens)
        if limit is not None and len(ids) > limit:
            raise ValueError(too_long(len(ids), limit))
        n = max(t.prompt_len, len(ids))
        tokens = np.full(n, cv.PAD_ID, np.int32)
        tokens[n - len(ids):] = ids
        mask = (np.arange(n) >= n - len(ids)).astype(np.int32)
        answer = lhs + rhs if op == "+" else lhs - rhs if op == "-" else lhs * rhs
        return tokens, mask, answer

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

    def notice(self, line: str) -> None:
        """A text policy's prompts have no training distribution to check against: no notice."""
        del line

    def render(self, line: str, max_tokens: int | None = None) -> tuple[np.ndarray, np.ndarray, Any]:
        text = line.rstrip("\n")
        if self.config is not None:
            text = render_prompt(self.tokenizer, text, self.config)
        ids = self.tokenizer.encode(text, add_special_tokens=self.config is None)
        if not ids:
            raise ValueError("empty prompt")
        limit = _prompt_limit(self.max_prompt_tokens, max_tokens)
        if len(ids) > limit:
            raise ValueError(too_long(len(ids), limit))
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

    def notice(self, line: str) -> str | None:
        """One line (`note: ...`) when `line` is outside what the policy's task trained on, else None;
        ValueError for a line the task cannot render."""
        return self.prompts.notice(line)

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

    def limit(budget: int) -> int:  # the policy's max prompt length: the flag, within the model's positions
        return max(1, min(max_prompt_tokens, model.max_position_embeddings - budget))

    if spec is not None and spec.task.tokenizer is None:  # the built-in task
        task = spec.task
        budget = max_new_tokens or task.answer_len
        return Chat(model, params, ArithmeticPrompts(task, limit(budget)), stop_ids=task.stop_token_ids,
                    pad_id=task.pad_id, max_new_tokens=budget, **kw)
    if spec is not None:
        run = evaluate.load_run_config(policy)
        budget = max_new_tokens or run.rollout.max_new_tokens
        prompts = TextPrompts(spec.task.tokenizer, spec.task.prompt_config, limit(budget))
        return Chat(model, params, prompts, stop_ids=spec.task.stop_token_ids, pad_id=spec.task.pad_id,
                    max_new_tokens=budget, **kw)
    tokenizer = load_tokenizer(policy)
    templated = prompt_style == "instruct" or (prompt_style == "auto" and getattr(tokenizer, "chat_template", None))
    budget = int(max_new_tokens or _generation_config(policy).get("max_new_tokens") or 512)
    config = PromptConfig(style="instruct", instruction="", max_prompt_tokens=limit(budget)) if templated else None
    return Chat(model, params, TextPrompts(tokenizer, config, limit(budget)),
                stop_ids=stop_token_ids(tokenizer, policy), pad_id=pad_token_id(tokenizer),
                max_new_tokens=budget, **kw)
