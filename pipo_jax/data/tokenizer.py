"""Tokenizer from a local Hugging Face directory, and the ids the sampler needs."""
from __future__ import annotations

import json
import os
from typing import Any

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def load_tokenizer(path: str) -> Any:
    """``transformers.AutoTokenizer`` from a local directory; never downloads.

    Raises FileNotFoundError naming the directory when it or its tokenizer files are
    missing.
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer directory not found: {path}")
    present = [f for f in _TOKENIZER_FILES if os.path.exists(os.path.join(path, f))]
    if not present:
        raise FileNotFoundError(
            f"no tokenizer files in {path} (expected one of {', '.join(_TOKENIZER_FILES)}); "
            f"it holds: {sorted(os.listdir(path))[:20]}")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def stop_token_ids(tokenizer: Any, path: str | None = None) -> tuple[int, ...]:
    """Sorted ids that end a response: the tokenizer's eos plus ``eos_token_id`` of
    ``generation_config.json`` in ``path`` when present (Qwen3 instruct lists both
    ``<|im_end|>`` and ``<|endoftext|>`` there)."""
    ids = set(_as_id_list(tokenizer.eos_token_id))
    if path is not None:
        gen_path = os.path.join(path, "generation_config.json")
        if os.path.exists(gen_path):
            with open(gen_path, encoding="utf-8") as f:
                try:
                    ids.update(_as_id_list(json.load(f).get("eos_token_id")))
                except (json.JSONDecodeError, TypeError, ValueError) as e:
                    raise ValueError(f"{gen_path}: cannot read eos_token_id: {e}") from e
    if not ids:
        raise ValueError("the tokenizer defines no eos token and no generation_config.json eos_token_id was found")
    return tuple(sorted(ids))


def pad_token_id(tokenizer: Any) -> int:
    """The pad id, falling back to the (first) eos id for tokenizers without one."""
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    eos = _as_id_list(tokenizer.eos_token_id)
    if not eos:
        raise ValueError("the tokenizer has neither a pad nor an eos token")
    return eos[0]
