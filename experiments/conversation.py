"""A policy and its task's prompt rendering, one prompt at a time: what `experiments/chat.py` and
`experiments/serve.py` (through `experiments/serving.py`) talk to.

`make_chat(policy, step)` loads a run workdir's checkpoint or a Hugging Face directory and picks the
renderer (`pipo_jax/tasks/chat_prompts.py:ChatPrompts`): the task's own for a task without a
tokenizer (its registry entry names it, e.g. the built-in task's `47+85` -> its prompt, a response
-> the value it states), or `TextPrompts` (a text policy: the run's / a chat template, or the text
as it is). `Chat.reply(line)` renders, generates with `sampler.generate` (one row) and shows the
response; `Chat.notice(line)` is one line when the line's problem lies outside what the task
trained on (the built-in task: operand digit counts outside [min_digits, max_digits], an operator
not trained on), else None. A prompt over the policy's max prompt length (`max_prompt_tokens`,
within the model's `max_position_embeddings` less the response budget) is refused naming both
numbers; an error quotes at most 40 characters of the line.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import app

from pipo_jax.data.prompts import PromptConfig, render_prompt
from pipo_jax.data.tokenizer import load_tokenizer, pad_token_id, stop_token_ids
from pipo_jax.run import evaluate
from pipo_jax.sampling import sampler
from pipo_jax.sampling.sampling_params import SamplingParams
from pipo_jax.tasks import registry
from pipo_jax.tasks.chat_prompts import prompt_limit, too_long

PROMPT_BUCKET = 32  # text prompts are left-padded to a multiple of this: few compiles


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
        limit = prompt_limit(self.max_prompt_tokens, max_tokens)
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


def check_sampling_flags(temperature: float, top_p: float, max_new_tokens: int | None) -> None:
    """Refuses, naming the flag (`app.UsageError`: one line, exit 2), a sampling setting no sampler takes:
    a temperature that is NaN, infinite or negative (NaN would decode nothing but the pad token), a
    `top_p` outside (0, 1] (0 keeps no token), a response budget below one token."""
    if not (math.isfinite(temperature) and temperature >= 0):
        raise app.UsageError(f"--temperature={temperature}: must be a finite number >= 0 (0 = greedy)")
    if not 0 < top_p <= 1:
        raise app.UsageError(f"--top_p={top_p}: must be in (0, 1] (1 = off)")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise app.UsageError(f"--max_new_tokens={max_new_tokens}: must be >= 1")


def make_chat(policy: str, step: int | None = None, *, max_new_tokens: int | None = None,
              temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, prompt_style: str = "auto",
              max_prompt_tokens: int = 2048) -> Chat:
    """A `Chat` on a run workdir's checkpoint (`step`, default the newest that reads) or a HF directory."""
    model, params, spec = evaluate.load_policy(policy, step)
    kw = dict(temperature=temperature, top_p=top_p, seed=seed)

    def limit(budget: int) -> int:  # the policy's max prompt length: the flag, within the model's positions
        return max(1, min(max_prompt_tokens, model.max_position_embeddings - budget))

    if spec is not None and spec.task.tokenizer is None:  # a task that renders its own prompts
        task = spec.task
        budget = max_new_tokens or task.answer_len
        return Chat(model, params, registry.chat_prompts(task, limit(budget)), stop_ids=task.stop_token_ids,
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
