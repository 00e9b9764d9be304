"""config.task.digit_sum: the digit-sum task's own keys, declared beside its code (`digit_sum.py`).

This module imports only the schema, so declaring the config never loads the task.
"""

from __future__ import annotations

import dataclasses

from pipo_jax.config.schema import Section, key, need, within

MAX_DIGITS = 5  # at most 10**5 numbers: the split's tables stay small (< 0.5 MB)


@dataclasses.dataclass(frozen=True)
class DigitSumSettings(Section):
    """The numbers of `task.name=digit_sum` ("what is the sum of the digits of N?"): every N with
    min_digits..max_digits digits (1 digit: 0..9), each a problem once."""

    _section = "task.digit_sum"
    min_digits: int = key(1, "fewest digits of N (1: N may be 0..9)", within(1, MAX_DIGITS))
    max_digits: int = key(3, f"most digits of N (<= {MAX_DIGITS}: every number is a problem, "
                          f"10**max_digits of them at most)", within(1, MAX_DIGITS))

    def check(self):
        need(self.min_digits <= self.max_digits, "task.digit_sum.min_digits",
             f"{self.min_digits} > task.digit_sum.max_digits={self.max_digits}")
