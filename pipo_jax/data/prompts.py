"""Prompts from examples with the tokenizer's own chat template, and length limits.

Styles (Qwen3):
- "instruct": the chat template with an optional system prompt and, for Qwen3's
  hybrid-thinking template, ``enable_thinking`` passed through (None = template default;
  False makes the template pre-fill an empty ``<think></think>`` block).
- "base": for base models (Qwen3-Base ships the same ChatML template): a single user
  turn through the chat template with no system prompt and no template switches; or,
  when ``base_template`` is set, plain text ``base_template.format(prompt=...)`` with
  no chat markup at all.
The instruction (default: reason step by step and put the final answer in
``\\boxed{}``) is appended to (or put before) the question. Prompts longer than
``max_prompt_tokens`` are dropped and counted, truncated, or an error, by config.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from pipo_jax.data.sources import Example

logger = logging.getLogger(__name__)

DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
OVERLONG_MODES = ("drop", "truncate_left", "truncate_right", "error")


@dataclasses.dataclass(frozen=True)
class PromptConfig:
    """How a question becomes prompt tokens.

    style: "instruct" or "base" (see module docstring).
    instruction: text added to the question ("" = none).
    instruction_position: "after" or "before" the question.
    separator: between question and instruction.
    system_prompt: instruct style only.
    enable_thinking: instruct style only; passed to the chat template when not None.
    base_template: base style only; plain-text format string with ``{prompt}``
      (None = use the chat template).
    max_prompt_tokens: length limit in tokens.
    overlong: "drop" (count and log), "truncate_left" (keep the last tokens, so the
      generation prompt survives), "truncate_right" (keep the first) or "error".
    add_special_tokens: let the tokenizer add BOS/EOS when encoding the text (chat
      templates already contain their special tokens).
    """

    style: str = "instruct"
    instruction: str = DEFAULT_INSTRUCTION
    instruction_position: str = "after"
    separator: str = "\n"
    system_prompt: str | None = None
    enable_thinking: bool | None = None
    base_template: str | None = None
    max_prompt_tokens: int = 512
    overlong: str = "drop"
    add_special_tokens: bool = False

    def __post_init__(self):
        if self.style not in ("instruct", "base"):
            raise ValueError(f"PromptConfig.style must be 'instruct' or 'base', got {self.style!r}")
        if self.instruction_position not in ("after", "before"):
            raise ValueError(f"PromptConfig.instruction_position must be 'after' or 'before', "
                             f"got {self.instruction_position!r}")
        if self.overlong not in OVERLONG_MODES:
            raise ValueError(f"PromptConfig.overlong must be one of {OVERLONG_MODES}, got {self.overlong!r}")
        if self.max_prompt_tokens < 1:
            raise ValueError(f"PromptConfig.max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        if self.style == "base" and (self.system_prompt is not None or self.enable_thinking is not None):
            raise ValueError("PromptConfig.system_prompt and enable_thinking apply to style='instruct' only")
        if self.style == "instruct" and self.base_template is not None:
            raise ValueError("PromptConfig.base_template applies to style='base' only")
        if self.base_template is not None and "{prompt}" not in self.base_template:
            raise ValueError("PromptConfig.base_template must contain '{prompt}'")


def with_instruction(question: str, config: PromptConfig) -> str:
    """The question with the configured instruction before or after it."""
    if not config.instruction:
        return question
    if config.instruction_position == "after":
        return question + config.separator + config.instruction
    return config.instruction + config.separator + question


def chat_messages(prompt: str | list[dict[str, str]], config: PromptConfig) -> list[dict[str, str]]:
    """Chat messages for a question (or given messages): instruction added to the
    last user turn, system prompt first when configured and not already present."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": with_instruction(prompt, config)}]
    else:
        messages = [dict(m) for m in prompt]
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if not users:
            raise ValueError("chat prompt has no user message")
        messages[users[-1]]["content"] = with_instruction(messages[users[-1]]["content"], config)
    if config.system_prompt is not None and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": config.system_prompt})
    return messages


def render_prompt(tokenizer: Any, prompt: str | list[dict[str, str]], config: PromptConfig) -> str:
    """Prompt text, ending where the model's response starts."""
    if config.style == "base" and config.base_template is not None:
        if not isinstance(prompt, str):
            raise ValueError("base_template needs a text prompt, not chat messages")
        return config.base_template.format(prompt=with_instruction(prompt, config))
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat_template; use style='base' with base_template for plain text")
    kwargs = {}
    if config.enable_thinking is not None:
        kwargs["enable_thinking"] = config.enable_thinking
    return tokenizer.apply_chat_template(chat_messages(prompt, config), tokenize=False,
                                         add_generation_prompt=True, **kwargs)


@dataclasses.dataclass(frozen=True)
class PromptSet:
    """Tokenized prompts of the kept examples (same order as the input).

    token_ids[i] is a list of ints of length <= max_prompt_tokens; texts[i] is the
    rendered prompt before any truncation.
    """

    examples: list[Example]
    token_ids: list[list[int]]
    texts: list[str]
    num_dropped: int
    num_truncated: int
    dropped_origins: list[str]


def build_prompts(examples: Sequence[Example], tokenizer: Any, config: PromptConfig) -> PromptSet:
    """Render, tokenize and length-limit every example's prompt."""
    kept, ids_out, texts = [], [], []
    dropped, truncated = [], 0
    limit = config.max_prompt_tokens
    for ex in examples:
        text = render_prompt(tokenizer, ex.prompt, config)
        ids = list(tokenizer(text, add_special_tokens=config.add_special_tokens)["input_ids"])
        if len(ids) > limit:
            if config.overlong == "error":
                raise ValueError(f"{ex.origin}: prompt has {len(ids)} tokens, more than max_prompt_tokens={limit}")
            if config.overlong == "drop":
                dropped.append(ex.origin)
                continue
            ids = ids[-limit:] if config.overlong == "truncate_left" else ids[:limit]
            truncated += 1
        kept.append(ex)
        ids_out.append(ids)
        texts.append(text)
    if dropped:
        logger.warning("dropped %d of %d prompts longer than %d tokens (first: %s)", len(dropped), len(examples),
                       limit, ", ".join(dropped[:5]))
    if truncated:
        logger.warning("truncated %d of %d prompts to %d tokens (%s)", truncated, len(examples), limit,
                       config.overlong)
    return PromptSet(kept, ids_out, texts, len(dropped), truncated, dropped)
