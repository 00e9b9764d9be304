"""Answers that state two values, a relation, or hide digits behind invisible characters do
not score as the value (gold 3); honest forms of the value still do. All through the
default worker-process path, one batch per table."""

import pytest

from pipo_jax.tasks import math as mt
from tests.tasks.test_math import EQUIVALENT, NOT_EQUIVALENT

# (response, why it is not the answer 3)
ATTACKS = [
    (r"\boxed{17 = 3}", "an equation with a number on the left (the grader took its right-hand side)"),
    ("\\boxed{3\u200b4}", "zero-width space inside a number (34)"),
    ("\\boxed{3\u00004}", "NUL inside a number"),
    ("\\boxed{3\ufeff4}", "BOM inside a number"),
    ("\\boxed{3\u00ad4}", "soft hyphen inside a number"),
    ("\\boxed{3\u2060 4}", "word joiner, then a second number"),
    ("\\boxed{3\u200f\u200e4}", "RTL and LTR marks inside a number"),
    ("\\boxed{\uff13}", "fullwidth digit"),
    ("\\boxed{\u0663}", "Arabic-Indic digit"),
    ("\\boxed{3\u0301}", "a combining mark on the digit"),
    ("\\boxed{3\u00b2}", "superscript two (9, read as 3)"),
    (r"\boxed{3 \approx 4}", r"\approx (latex2sympy keeps its left side)"),
    (r"\boxed{4 \approx 3}", r"\approx"),
    (r"\boxed{x \approx 3}", r"\approx"),
    (r"\boxed{3 \approx 3}", r"\approx"),
    (r"\boxed{\text{3 or 4}}", r"numbers inside \text (math-verify reads the first)"),
    (r"\boxed{\mathrm{3 or 4}}", r"numbers inside \mathrm"),
    (r"\boxed{\text{3 cm or 4 cm}}", "two quantities in one text"),
    (r"\boxed{3 \text{ (or 4)}}", "a number inside trailing text (stripped as a unit)"),
    (r"\boxed{3 \text{ cm} + 4 \text{ cm}}", "math-verify strips from the first \\text to the end"),
    (r"\boxed{3 \text{ OR } 4}", "an unknown word: the unit stripping drops the 4"),
    (r"\boxed{\boxed{3} 4}", "a box inside the answer (math-verify keeps only the box)"),
    (r"\boxed{\fbox{3} 4}", "an fbox inside the answer"),
    (r"\boxed{3 \to 4}", r"\to"),
    (r"\boxed{4 \to 3}", r"\to (math-verify parsed the fragment 3)"),
    (r"\boxed{4 \mapsto 3}", r"\mapsto"),
    (r"\boxed{4 \Rightarrow 3}", r"\Rightarrow"),
    (r"\boxed{3 \lor 4}", r"\lor"),
    (r"\boxed{3 \lor 3}", r"\lor"),
    (r"\boxed{3 \vee 4}", r"\vee"),
    (r"\boxed{3 \wedge 3}", r"\wedge"),
    (r"\boxed{3, 4}", "two values"),
    (r"\boxed{3 \text{ and } 4}", "two values"),
    (r"\boxed{3 \text{ or } 3}", "a connective"),
    (r"\boxed{3 \neq 4}", r"\neq"),
    (r"\boxed{3 \leq 3}", r"\leq"),
    (r"\boxed{3 < 4}", "<"),
    (r"\boxed{3 \pm 1}", r"\pm"),
    (r"\boxed{3 | 4}", "|"),
    (r"\boxed{3 \mid 4}", r"\mid"),
    (r"\boxed{\{3, 4\}}", "a set of two"),
    (r"\boxed{3 ; 4}", "two values"),
    (r"\boxed{3 \in \{3,4\}}", r"\in with a number on the left"),
    (r"\boxed{4 =: 3}", "=:"),
    (r"\boxed{3 := 4}", ":="),
    (r"\boxed{3 \equiv 4}", r"\equiv"),
    (r"\boxed{y = 4 = 3}", "a chain whose middle value is 4"),
    (r"\boxed{x = 4, x = 3}", "two assignments"),
    (r"\boxed{2x = 3}", "the left side is not a name (x = 3/2)"),
    (r"\boxed{x^{2} = 3}", "the left side is not a name"),
    (r"\boxed{\left(17 = 3\right)}", "an equation in parentheses"),
    (r"\boxed{\frac{17 = 3}{1}}", "an equation inside a fraction"),
    (r"\boxed{3 4}", "two numbers apart (latex2sympy adds them: 7)"),
    (r"\boxed{3 \text{ } 4}", "two numbers apart behind an empty text"),
    (r"\boxed{3_{=4}}", "an unparseable answer (math-verify parsed a fragment)"),
    (r"\boxed{3\% \text{ or } 4}", "a connective"),
    ("3\u200b4", "no box: nothing to score"),
    # math-verify reads what follows the word "answer" anywhere, and the last $-delimited part
    (r"\boxed{4 answer 3}", "the word 'answer' inside the answer (math-verify read the 3 after it)"),
    (r"\boxed{\frac{4}{answer 3}}", "the word 'answer' inside a fraction"),
    (r"\boxed{4 final answer is 3}", "'final answer is' after another value"),
    (r"\boxed{4$$3}", "two $-delimited parts (math-verify read the last)"),
    (r"\boxed{\pi$$3}", "two $-delimited parts"),
    (r"\boxed{The answer is 4 answer 3}", "the word 'answer' twice"),
]
# (response, gold) pairs that must stay 0 elsewhere than gold 3.
ATTACKS_OTHER_GOLD = [
    (r"\boxed{3 4}", "7"),
    (r"\boxed{3 \quad 4}", "7"),
    (r"\boxed{17 = 3}", "x = 3"),
    (r"\boxed{x = 1 \text{ or } x = 3}", "1, 2"),
    (r"\boxed{x = 1 \text{ or } x = 2 \text{ or } x = 3}", "1, 2"),
    (r"\boxed{x > 3 \lor x < 0}", "x > 3"),
]
HONEST = [
    "\\boxed{3}", "\\boxed{3.0}", "\\boxed{\\frac{6}{2}}", "\\boxed{x=3}", "\\boxed{x = 3}", "\\boxed{k = 3}",
    "\\boxed{x_{1} = 3}", "\\boxed{x = \\frac{6}{2} = 3}", "\\boxed{\\boxed{3}}", "\\boxed{\\text{3}}",
    "\\boxed{3 \\text{ cm}}", "\\boxed{\\text{3 cm}}", "\\boxed{3\\text{ m}^2}", "\\boxed{\\{3\\}}",
    "\\boxed{3\u200b}", "\\boxed{\u200f3}", "\\boxed{3\u00a0}", "\\boxed{$3$}", "\\boxed{6 - 3}",
    "\\boxed{\\sqrt{9}}", "\\boxed{\\dfrac{9}{3}}", "\\boxed{3^\\circ}",
    "The answer is $\\boxed{3}$.", "\\boxed{The answer is 3}", "\\boxed{The final answer is: $3$}",
    "\\boxed{answer: 3}", "\\boxed{\\sum_{n=1}^{3} 1}", "\\boxed{\\lim_{x \\to 0} (x + 3)}",
]
HONEST_OTHER_GOLD = [
    (r"\boxed{x = 1 \text{ or } x = 2}", "1, 2"),
    (r"\boxed{x = 1, x = 2}", "1, 2"),
    (r"\boxed{1 \text{ and } 2}", "1, 2"),
    (r"\boxed{x > 3}", "x > 3"),
    (r"\boxed{3 < x}", "x > 3"),
    (r"\boxed{x = 3}", "x = 3"),
    (r"\boxed{y = 2x + 1}", "y = 2x + 1"),
    ("\\boxed{\\text{Zo\u00eb}}", "\\text{Zoe\u0308}"),  # NFC: the same name
    (r"\boxed{30\%}", "0.3"),
]


@pytest.fixture(scope="module")
def verifier():
    with mt.MathVerifier(mt.MathVerifyConfig(num_workers=2, timeout_s=5.0)) as v:
        yield v


def test_attacks_score_zero(verifier):
    cases = [(r, "3") for r, _ in ATTACKS] + ATTACKS_OTHER_GOLD
    results = verifier.score_batch([r for r, _ in cases], [g for _, g in cases])
    scored = {(r, g): res.reward for (r, g), res in zip(cases, results)}
    assert scored == {c: 0.0 for c in cases}
    assert all(res.status in ("incorrect", "no_answer") for res in results), [res.status for res in results]


def test_honest_answers_still_score_one(verifier):
    cases = [(r, "3") for r in HONEST] + HONEST_OTHER_GOLD
    cases += [(f"\\boxed{{{p}}}", g) for g, p in EQUIVALENT]
    results = verifier.score_batch([r for r, _ in cases], [g for _, g in cases])
    assert {c: res.reward for c, res in zip(cases, results)} == {c: 1.0 for c in cases}


ANSWER_PATTERN = r"(?s)FINAL:(?P<answer>.*)"  # a final answer read by a pattern, not a box
PATTERN_CASES = [("FINAL: 4 answer 3", 0.0), (r"FINAL: \frac{4}{answer 3}", 0.0), ("FINAL: 4 final answer is 3", 0.0),
                 ("FINAL: 4$$3", 0.0), ("FINAL: The answer is 3", 1.0), (r"FINAL: \boxed{3}", 1.0), ("FINAL: 3", 1.0),
                 ("FINAL: So, the final answer is $3$", 1.0)]


def test_a_final_answer_holding_other_values_is_not_the_value():
    with mt.MathVerifier(mt.MathVerifyConfig(answer_pattern=ANSWER_PATTERN, num_workers=1, timeout_s=5.0)) as v:
        results = v.score_batch([r for r, _ in PATTERN_CASES], ["3"] * len(PATTERN_CASES))
    assert {r: res.reward for (r, _), res in zip(PATTERN_CASES, results)} == dict(PATTERN_CASES)


def test_existing_not_equivalent_table_stays_zero(verifier):
    results = verifier.score_batch([f"\\boxed{{{p}}}" for _, p in NOT_EQUIVALENT], [g for g, _ in NOT_EQUIVALENT])
    assert [r.reward for r in results] == [0.0] * len(NOT_EQUIVALENT)


def test_a_percent_answer_is_its_hundredth(verifier):
    """An answer with a percent sign states value / 100 and nothing else: 3\\% is 0.03, not 3
    (math-verify also took the bare number), 300\\% is 3. A gold written with a percent sign
    carries the unit, so a bare number matches it as before (the table: 50\\% accepts 50). A
    percent written in text (\\text{ percent}, \\text{\\%}) is the same percent sign."""
    cases = [(r"\boxed{3\%}", "3", 0.0), (r"\boxed{3\%}", "0.03", 1.0), (r"\boxed{3\%}", r"3\%", 1.0),
             (r"\boxed{300\%}", "3", 1.0), (r"\boxed{50\%}", "50", 0.0), (r"\boxed{50}", r"50\%", 1.0),
             (r"\boxed{0.5}", r"50\%", 1.0), (r"\boxed{3%}", "3", 0.0), (r"\boxed{3 \text{ percent}}", "3", 0.0),
             (r"\boxed{3 \text{ percent}}", "0.03", 1.0), (r"\boxed{x = 3\%}", "3", 0.0),
             (r"\boxed{\{3\%, 4\%\}}", r"\{3, 4\}", 0.0), (r"\boxed{3\%}", "4", 0.0),
             # a percent in text was dropped as a unit (3 \text{ percent} read as 3): it is \% too
             (r"\boxed{\text{3 percent}}", "3", 0.0), (r"\boxed{3\text{\%}}", "3", 0.0),
             (r"\boxed{3 \mbox{ pct}}", "3", 0.0), (r"\boxed{3 \text{ percent of all}}", "3", 0.0),
             (r"\boxed{3\text{\%}}", "0.03", 1.0), (r"\boxed{50}", r"50 \text{ percent}", 1.0),
             (r"\boxed{3\%}", "0.3", 0.0), (r"\boxed{3\% \text{ or } 4\%}", "3", 0.0)]
    results = verifier.score_batch([r for r, _, _ in cases], [g for _, g, _ in cases])
    assert {(r, g): res.reward for (r, g, _), res in zip(cases, results)} == {(r, g): e for r, g, e in cases}


@pytest.mark.parametrize("raw,expected", [
    ("3\u200b4", "34"),
    ("\ufeff3\u00ad4\u0000", "34"),
    ("\u200e3\u200f", "3"),
    ("3\u00a0cm", "3 cm"),
    (r"\boxed{\boxed{3}}", "3"),
    (r"\boxed{3} + \boxed{4}", r"\boxed{3} + \boxed{4}"),  # not one box: left for the pre-check
    (r"\text{3}", "3"),
    (r"\text{3 or 4}", r"\text{3 or 4}"),  # not a number and a unit
    ("30°", r"30^{\circ}"),
    (r"3 \text{ percent}", r"3 \%"),
    (r"\text{3 percent}", r"3\%"),
    (r"3\text{\%}", r"3\%"),
    (r"3 \text{ percent of all}", r"3 \%\text{ of all}"),
    (r"3\text{ percentile}", r"3\text{ percentile}"),
])
def test_normalize_answer_characters_and_boxes(raw, expected):
    assert mt.normalize_answer(raw) == expected
