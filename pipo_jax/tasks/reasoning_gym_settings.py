"""config.task.reasoning_gym: the reasoning-gym task's own keys, declared beside its code
(`reasoning_gym.py`). This module imports only the schema (not the library)."""

from __future__ import annotations

import dataclasses
import json

from pipo_jax.config.schema import Section, at_least, key

PROMPT_FORMS = ("compact", "question")
OVERLONG = ("error", "drop")


def _json_object(text: str) -> str | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return f"{text!r} is not JSON ({e.msg})"
    return None if isinstance(value, dict) else f"{text!r} is not a JSON object"


@dataclasses.dataclass(frozen=True)
class ReasoningGymSettings(Section):
    """One of reasoning-gym's procedural datasets (`pip install -e ".[rg]"`): in the character
    vocabulary for the task model, or through `model.path`'s tokenizer (then `task.dataset.*`'s
    prompt keys apply)."""

    _section = "task.reasoning_gym"
    dataset: str = key("", "the library's dataset, e.g. chain_sum, gcd, spell_backward")
    config: str = key("", "JSON of the dataset's own config, e.g. '{\"min_terms\":2}'; \"\" = its defaults",
                      _json_object)
    size: int = key(4000, "entries generated (seed task.split_seed); repeated questions dropped", at_least(1))
    prompt: str = key("compact", "character model: compact (the text all questions share cut off) | question",
                      choices=PROMPT_FORMS)
    max_prompt_chars: int = key(48, "character model: longer rows follow task.reasoning_gym.overlong", at_least(1))
    max_answer_chars: int = key(8, "character model: longest answer", at_least(1))
    overlong: str = key("error", "rows too long, or with a character outside the vocabulary: error (names the row) "
                        "| drop (counted, logged)", choices=OVERLONG)
