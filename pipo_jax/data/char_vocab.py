"""The built-in vocabulary of the synthetic arithmetic task (no download, no tokenizer files).

Tokens are single characters (digits, operators, '=', ';') plus a few whole-word tokens
written in angle brackets (`<pad>`, `<bos>`, `<eos>`, and words used in SDPO feedback and
teacher contexts such as `<wrong>`, `<at>`, `<solution>`). `encode` reads a string
left to right: a `<...>` word is one token, any other character must be a single-character
token. `decode(encode(s)) == s` for every encodable string.

Ids are fixed by `TOKENS` order: PAD 0, BOS 1, EOS 2, digits '0'..'9' contiguous at
`DIGIT0_ID`..`DIGIT0_ID + 9`, so the token of digit d is `DIGIT0_ID + d` (also in jnp).
"""

from __future__ import annotations

from collections.abc import Iterable

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
DIGITS = tuple("0123456789")
OPERATORS = ("+", "-", "*")
SYMBOLS = ("=", ";")
# Words for environment feedback and SDPO teacher contexts.
WORDS = ("<correct>", "<wrong>", "<at>", "<answer>", "<solution>", "<feedback>", "<solve>")

TOKENS: tuple[str, ...] = (PAD, BOS, EOS) + DIGITS + OPERATORS + SYMBOLS + WORDS
TOKEN_TO_ID: dict[str, int] = {tok: i for i, tok in enumerate(TOKENS)}
VOCAB_SIZE = len(TOKENS)

PAD_ID, BOS_ID, EOS_ID = TOKEN_TO_ID[PAD], TOKEN_TO_ID[BOS], TOKEN_TO_ID[EOS]
DIGIT0_ID = TOKEN_TO_ID["0"]
PLUS_ID, MINUS_ID, TIMES_ID = (TOKEN_TO_ID[op] for op in OPERATORS)
EQUALS_ID, SEMICOLON_ID = TOKEN_TO_ID["="], TOKEN_TO_ID[";"]
CORRECT_ID, WRONG_ID, AT_ID, ANSWER_ID = (TOKEN_TO_ID[w] for w in ("<correct>", "<wrong>", "<at>", "<answer>"))
SOLUTION_ID, FEEDBACK_ID, SOLVE_ID = (TOKEN_TO_ID[w] for w in ("<solution>", "<feedback>", "<solve>"))


def token_id(token: str) -> int:
    """Id of one token string (e.g. `'7'`, `'+'`, `'<eos>'`)."""
    if token not in TOKEN_TO_ID:
        raise ValueError(f"unknown token {token!r}; the vocabulary is {list(TOKENS)}")
    return TOKEN_TO_ID[token]


def encode(text: str) -> list[int]:
    """Token ids of `text`; raises ValueError naming the offending position."""
    ids: list[int] = []
    i = 0
    while i < len(text):
        if text[i] == "<":
            end = text.find(">", i)
            word = text[i : end + 1] if end >= 0 else text[i:]
            if word not in TOKEN_TO_ID:
                raise ValueError(f"encode: unknown word token {word!r} at position {i} of {text!r}")
            ids.append(TOKEN_TO_ID[word])
            i += len(word)
        else:
            if text[i] not in TOKEN_TO_ID:
                raise ValueError(f"encode: unknown character {text[i]!r} at position {i} of {text!r}")
            ids.append(TOKEN_TO_ID[text[i]])
            i += 1
    return ids


def decode(ids: Iterable[int], skip_pad: bool = False) -> str:
    """The string of token ids (any int iterable, e.g. a numpy row); `skip_pad` drops `<pad>`."""
    out = []
    for pos, raw in enumerate(ids):
        i = int(raw)
        if not 0 <= i < VOCAB_SIZE:
            raise ValueError(f"decode: id {i} at position {pos} is outside the vocabulary [0, {VOCAB_SIZE})")
        if skip_pad and i == PAD_ID:
            continue
        out.append(TOKENS[i])
    return "".join(out)
