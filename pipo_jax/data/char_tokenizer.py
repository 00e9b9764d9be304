"""The built-in task's character vocabulary (`char_vocab`), or its extension to printable ASCII
(`text_vocab`, reasoning-gym's character form), as a Hugging Face tokenizer.

`hf_tokenizer()` is a `transformers.PreTrainedTokenizerFast` over a `tokenizers` WordLevel
model whose ids are `char_vocab`'s: a `<word>` is one token, any other character is one
token, no normalizer, no space handling, nothing added around the text (a prompt carries
its own `<bos>`). `encode` / `decode` agree with `char_vocab.encode` / `char_vocab.decode`
on every encodable string; a character outside the vocabulary is an error, as there.
It is what an export of a built-in-task run writes (`tokenizer.json`), so
`AutoTokenizer.from_pretrained(export)` reads the policy's real vocabulary.
"""

from __future__ import annotations

from typing import Any

from pipo_jax.data import char_vocab as cv

# A `<word>` or any one character, each its own token (in order, nothing dropped).
SPLIT_PATTERN = r"<[a-z]+>|."


def backend_tokenizer(tokens: tuple[str, ...] = cv.TOKENS) -> Any:
    """The `tokenizers.Tokenizer` of a character vocabulary `tokens` (id = position; the
    built-in task's by default, or `text_vocab.TOKENS`, which starts with it)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    if tokens[:cv.VOCAB_SIZE] != cv.TOKENS:
        raise ValueError("a character vocabulary here starts with char_vocab.TOKENS (same ids)")
    tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(tokens)}))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated")
    tok.decoder = decoders.Fuse()  # tokens concatenated as they are, no spaces between them
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (cv.PAD, cv.BOS, cv.EOS)])
    return tok


def hf_tokenizer(tokens: tuple[str, ...] = cv.TOKENS) -> Any:
    """`PreTrainedTokenizerFast` of the character vocabulary `tokens` (pad / bos / eos set)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=backend_tokenizer(tokens), pad_token=cv.PAD, bos_token=cv.BOS,
                                   eos_token=cv.EOS, clean_up_tokenization_spaces=False, padding_side="left",
                                   model_max_length=1 << 30)
