"""The built-in arithmetic task's chat rendering (`registry.TaskEntry.chat` of `arithmetic`): a
typed problem `47+85` -> the task's prompt; a response -> the value it states and whether it is right.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from pipo_jax.data import char_vocab as cv
from pipo_jax.tasks.arithmetic import ArithmeticTask, make_problems, read_answer
from pipo_jax.tasks.chat_prompts import prompt_limit, quote, too_long

_PROBLEM = re.compile(r"^\s*(\d+)\s*([-+*])\s*(\d+)\s*=?\s*$")


class ArithmeticPrompts:
    """The built-in task's rendering: `lhs op rhs[=]` -> its prompt; a response -> its stated answer.

    A problem outside what the task trained on (operands of a digit count outside
    [task.min_digits, task.max_digits], an operator not in task.ops, a negative difference of a
    task without negative answers) is still rendered, in the task's prompt form, and answered;
    `notice(line)` says what is outside. A prompt over `max_prompt_tokens` tokens is refused.
    """

    def __init__(self, task: ArithmeticTask, max_prompt_tokens: int | None = None):
        self.task, self.max_prompt_tokens = task, max_prompt_tokens

    def _parse(self, line: str, max_tokens: int | None = None) -> tuple[int, str, int]:
        limit = prompt_limit(self.max_prompt_tokens, max_tokens)
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
            problems = make_problems(t, np.array([lhs]), np.array([cv.OPERATORS.index(op)]),
                                                np.array([rhs]))
            return np.asarray(problems.prompt_tokens_bp[0]), np.asarray(problems.prompt_mask_bp[0]), \
                int(problems.answer_b[0])
        # Outside what `make_problems` takes: the same prompt form (<bos> lhs op rhs =, operands
        # zero-padded to max_digits when the task pads them, left-padded to at least prompt_len).
        width = t.max_digits if t.pad_operands else 1
        text = f"{str(lhs).zfill(width)}{op}{str(rhs).zfill(width)}="
        ids = [cv.BOS_ID] + [cv.TOKEN_TO_ID[ch] for ch in text]
        limit = prompt_limit(self.max_prompt_tokens, max_tokens)
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
        stated = read_answer(self.task, text)
        if stated is None:
            verdict = f"(no answer; expected {answer})"
        else:
            verdict = f"= {stated} " + ("(correct)" if stated == answer else f"(expected {answer})")
        ended = "" if cv.EOS_ID in response_ids else " [no <eos>]"
        return f"{text}\t{verdict}{ended}"
