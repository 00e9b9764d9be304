"""What a chat renderer is (`ChatPrompts`: one line typed by a user -> a prompt, a response -> its
text and verdict) and the refusal lines every renderer and the server share.

A task without a tokenizer renders its own prompts: its registry entry names its renderer
(`registry.TaskEntry.chat`, e.g. `arithmetic_chat.ArithmeticPrompts`); a text policy's renderer is
its tokenizer's (`experiments/conversation.py:TextPrompts`).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

QUOTE_CHARS = 40  # an error quotes at most this much of a line (a 100k-character line stays one short line)


class ChatPrompts(Protocol):
    """A policy's rendering of typed lines. `render` raises ValueError (one line) for a line it
    cannot render or one over the prompt limit."""

    bos_id: int | None

    def render(self, line: str, max_tokens: int | None = None) -> tuple[np.ndarray, np.ndarray, Any]:
        """`(tokens_p, mask_p, info)`: the left-padded prompt of `line` and what `show` needs to
        judge the response (the expected answer, or None)."""

    def notice(self, line: str) -> str | None:
        """One line when `line` lies outside what the policy trained on, else None."""

    def text(self, ids) -> str:
        """The text of token ids."""

    def show(self, response_ids: list[int], info: Any) -> str:
        """The response as shown to the user (with a verdict where `info` allows one)."""


def quote(line: str, limit: int = QUOTE_CHARS) -> str:
    """`line` stripped and quoted, cut to `limit` characters (`'1111...' (100003 characters)`)."""
    text = line.strip()
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def too_long(n_tokens: int, limit: int) -> str:
    """The refusal of a prompt over the policy's max prompt length (chat and the server say the same)."""
    return f"the prompt has {n_tokens} tokens, over the policy's max prompt length of {limit} tokens"


def prompt_limit(*limits: int | None) -> int | None:
    """The smallest of the given limits (None: no limit given)."""
    given = [int(x) for x in limits if x is not None]
    return min(given) if given else None
