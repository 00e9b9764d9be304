"""config.task.arithmetic: the built-in task's own keys, declared beside its code (`arithmetic.py`).

This module imports only the schema, so declaring the config never loads the task.
"""

from __future__ import annotations

import dataclasses

from pipo_jax.config.schema import Section, key, need, within

OPERATORS = ("+", "-", "*")
ANSWER_FORMATS = ("plain", "reversed", "worked")
REWARD_MODES = ("exact", "per_token")
FEEDBACK_STYLES = ("position", "reveal")


def _ops(value: str) -> str | None:
    ok = bool(value) and all(op in OPERATORS for op in value) and len(set(value)) == len(value)
    return None if ok else f"{value!r}: distinct operators of {''.join(OPERATORS)}"


@dataclasses.dataclass(frozen=True)
class ArithmeticSettings(Section):
    """The problems, answers, rewards and feedback of `task.name=arithmetic`, and its warm-up's
    demonstrations (flawed ones and teacher-context ones are this task's own)."""

    _section = "task.arithmetic"
    min_digits: int = key(1, "fewest digits of an operand", within(1, 8))
    max_digits: int = key(2, "most digits of an operand (<= 8, <= 4 with '*': every answer fits int32)", within(1, 8))
    ops: str = key("+-", "the operators drawn from", _ops)
    answer_format: str = key("reversed", "reversed (least-significant digit first: carries are learnable) | plain "
                             "| worked", choices=ANSWER_FORMATS)
    reward_mode: str = key("exact", "exact (1 for the whole answer) | per_token (graded)", choices=REWARD_MODES)
    feedback_style: str = key("position", "the SDPO / VPD feedback: position (the first wrong position) | reveal "
                              "(the answer)", choices=FEEDBACK_STYLES)
    warmup_mistake_rate: float = key(0.0, "warm-up: share of carrying / borrowing demonstrations shown with the "
                                     "column mistake (carries dropped), so greedy decoding learns the carry-free share",
                                     within(0, 1))
    warmup_context_fraction: float = key(0.0, "warm-up: share of rows shown with an SDPO / VPD teacher context (a "
                                         "sibling's solution or the feedback)", within(0, 1))

    def check(self):
        need(self.min_digits <= self.max_digits, "task.arithmetic.min_digits",
             f"{self.min_digits} > task.arithmetic.max_digits={self.max_digits}")
        need("*" not in self.ops or self.max_digits <= 4, "task.arithmetic.max_digits",
             f"{self.max_digits} > 4 with '*' in task.arithmetic.ops overflows int32")
