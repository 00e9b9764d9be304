"""A character vocabulary for text tasks on the CPU-sized model: the built-in task's tokens
(`char_vocab.TOKENS`, same ids) followed by every other printable ASCII character and the
newline, one token each.

Unlike `char_vocab.encode`, every character is its own token ('<' included): a task's text is
read verbatim. `decode(encode(s)) == s` for every encodable string; `encode` raises naming the
first character outside the vocabulary; `decode` writes ids without a token (the model's
vocabulary is rounded up past `VOCAB_SIZE`) as U+FFFD, so a sampled response always decodes.
"""

from __future__ import annotations

import string
from collections.abc import Iterable

from pipo_jax.data import char_vocab

_BASE = char_vocab.TOKENS
EXTRA_CHARS: tuple[str, ...] = tuple(ch for ch in string.printable if ch not in _BASE and ch not in "\t\r\x0b\x0c")
TOKENS: tuple[str, ...] = _BASE + EXTRA_CHARS
VOCAB_SIZE = len(TOKENS)
PAD_ID, BOS_ID, EOS_ID = char_vocab.PAD_ID, char_vocab.BOS_ID, char_vocab.EOS_ID
ANSWER_ID = char_vocab.ANSWER_ID  # `<answer>`: ends a prompt, the response follows
CHAR_TO_ID: dict[str, int] = {tok: i for i, tok in enumerate(TOKENS) if len(tok) == 1}
UNKNOWN = "\ufffd"


def unknown_char(text: str) -> tuple[int, str] | None:
    """(position, character) of the first character of `text` without a token, else None."""
    for i, ch in enumerate(text):
        if ch not in CHAR_TO_ID:
            return i, ch
    return None


def encode(text: str) -> list[int]:
    """One id per character; raises ValueError naming the first character outside the vocabulary."""
    bad = unknown_char(text)
    if bad is not None:
        raise ValueError(f"character {bad[1]!r} at position {bad[0]} of {text!r} is not in the text vocabulary "
                         "(printable ASCII and newline)")
    return [CHAR_TO_ID[ch] for ch in text]


def decode(ids: Iterable[int]) -> str:
    """The text of `ids` (word tokens as their `<word>`, ids without a token as U+FFFD)."""
    return "".join(TOKENS[i] if 0 <= i < VOCAB_SIZE else UNKNOWN for i in (int(x) for x in ids))
