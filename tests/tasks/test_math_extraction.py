"""`\\boxed{}` extraction is linear in the response's length (the issue's adversarial
inputs: an unclosed `\\boxed{` repeated 16k times took 69 s, a 1 MB answer > 10 min)
and gives the same answers as the earlier per-box scan on ordinary responses."""

import random
import re
import subprocess
import sys
import textwrap

import pytest

from pipo_jax.tasks import math as mt

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\b")


def _reference_balanced_group(text, open_idx):
    """The earlier implementation (quadratic over many boxes): one scan per box."""
    depth, i = 0, open_idx
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _reference_box_argument(text, cmd_end):
    i = cmd_end
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        end = _reference_balanced_group(text, i)
        if end is None:
            return None
        return text[i + 1: end - 1], end
    m = re.match(r"[^\s$]+", text[i:]) if i > cmd_end else None
    if m is None:
        return None
    return m.group(0), i + m.end()


def reference_last_boxed(text):
    found, covered_to = None, -1
    for m in _BOX_RE.finditer(text):
        if m.start() < covered_to:
            continue
        arg = _reference_box_argument(text, m.end())
        if arg is None:
            found = None
            continue
        found, covered_to = arg
    if found is not None and not found.strip():
        return None
    return found


ORDINARY = [
    r"so $\boxed{12}$.", r"first \boxed{3}, finally \boxed{\frac{1}{2}}", r"\boxed{\{1,2\}} end",
    r"\boxed{\left\{ x \mid x>0 \right\}}", r"\boxed{\boxed{7} + 1}", r"\fbox{x^2}", r"\boxed {42}", r"$\boxed 5$",
    r"\boxed{3} then truncated \boxed{12", r"\boxed{ }", r"no box", r"\\boxed{2}", "\\boxed{a}\\", r"} \boxed{}} {",
    r"\boxed{\frac{\sqrt{3}}{2}} and \boxed 7$", "\\boxed\t{9}", r"\boxedx{1}", r"\boxed{1}\boxed{2}",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_same_answers_as_the_per_box_scan(text):
    assert mt.last_boxed(text) == reference_last_boxed(text)


def test_same_answers_on_random_responses():
    rng = random.Random(0)
    pieces = ["\\boxed", "\\fbox", "{", "}", "\\{", "\\}", "\\\\", " ", "\t", "x", "1", "$", "\\frac", "\\"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        assert mt.last_boxed(text) == reference_last_boxed(text), text


def test_hand_computed_answers():
    assert mt.last_boxed(r"\boxed{a{b}c} \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert mt.last_boxed(r"\boxed{1} \boxed{2") is None  # the last box is unclosed
    assert mt.last_boxed("\\boxed{" * 5 + "7}") == "7"  # only the innermost box closes
    assert mt.last_boxed("\\boxed{" + "{" * 3 + "1" + "}" * 3 + "}") == "{{{1}}}"
    assert mt.last_boxed("\\boxed " * 4 + "5") == "\\boxed" == reference_last_boxed("\\boxed " * 4 + "5")
    assert mt.last_boxed("\\boxed " * 3 + "5") == "5"


ADVERSARIAL_SCRIPT = textwrap.dedent(r"""
    from pipo_jax.tasks import math as mt
    n = 200_000  # the per-box scan needs ~n^2 * 7 / 2 = 1.4e11 steps here: hours
    assert mt.last_boxed("\\boxed{" * n) is None
    assert mt.last_boxed("\\boxed{" * n + "7}") == "7"
    assert mt.last_boxed("\\fbox{x " * n + "}" * n) == "x " + "\\fbox{x " * (n - 1) + "}" * (n - 1)
    # "\boxed \boxed": a bare argument runs to the next space, so every other box is the
    # argument of the one before it; with n even the last one read is "\boxed".
    assert mt.last_boxed("\\boxed " * n + "5") == "\\boxed"
    big = "1" * 4_000_000
    assert mt.last_boxed("\\boxed{" + big + "}") == big  # a 4 MB answer
    assert mt.extract_final_answer("\\boxed{" * n + "x") is None
    print("ok")
""")


def test_adversarial_inputs_extract_in_linear_time():
    # No timing threshold: the sizes make the quadratic scan take hours; the subprocess
    # timeout only stops a regression from hanging the suite.
    res = subprocess.run([sys.executable, "-c", ADVERSARIAL_SCRIPT], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]
