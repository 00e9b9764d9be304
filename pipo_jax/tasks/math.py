"""Math answer checking: final-answer extraction, equivalence, reward and feedback.

Pipeline for one response: extract the final answer (the last outermost
``\\boxed{...}`` / ``\\fbox{...}``, or a configured regex) -> light LaTeX clean-up
(spacing commands, ``\\text{10 cm}``, repeating decimals, ``1.5e3``) -> equivalence by
`math-verify` (Hugging Face, Apache-2.0; LaTeX -> sympy via latex2sympy2_extended, MIT)
which handles numbers, ``\\frac``/``\\dfrac``/``\\tfrac``/``a/b``, ``\\left``/``\\right``,
units in ``\\text{}``, degrees, percentages (an answer's ``3\\%`` is 0.03 only, not 3;
a gold ``50\\%`` accepts 50), intervals, sets, tuples, matrices,
equations like ``x=3`` and symbolic equality -> a reward in {0, 1} plus a feedback
string (for SDPO's teacher context).

Time limit. math-verify's own timeout uses ``signal.alarm`` (whole seconds, main
thread only, and nested alarms clobber each other). We switch it off and arm one
``setitimer`` per answer that raises `AnswerCheckTimeout` (a ``BaseException``, so the
library's ``except Exception`` cannot swallow it). Signals only interrupt Python code,
so by default (``isolation="process"``) checks run in worker subprocesses (their main
thread, so the timer works whatever thread the trainer calls from) and the parent also
kills a worker that misses ``timeout_s + grace_s`` (stuck in C code, e.g. a huge
integer power) or dies; the answer then scores 0 with a "could not be checked"
feedback. ``isolation="inline"`` checks in the calling thread (must be the main one)
and has **no hard bound**: its timer interrupts Python code only, so an answer whose
check runs long inside C (sympy's big-integer power, GMP) runs past ``timeout_s`` and
the batch budget, for as long as the computation takes (``\\boxed{9^{9^{9^9}}}`` never
ends). It is for answers one trusts (tests of the checker itself, small offline tables);
whatever scores a policy's answers uses "process", the default and the only form the
run config can choose.

Extraction runs in the workers too, under the same per-answer timer (and it is linear
in the response's length: `last_boxed` matches the braces once, not per box), so the
trainer process only ships strings.

A batch is spread over ``num_workers`` processes (0, the default: one per CPU core this
process may use, at most `MAX_AUTO_WORKERS`) and has a wall-clock budget of its own,
``batch_budget_s``, whatever its size. Answers still unchecked (queued or in flight) when
it runs out score 0 with status "timeout" and ``unscored=True`` (the trainer counts them:
metric ``reward/unscored_count``); a killed worker's replacement starts in the background, so
the pool is whole for the next batch. Answers are checked in batch order.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import resource
import select
import signal
import subprocess
import sys
import threading
import time
import unicodedata
from collections import deque
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)

STATUS_CORRECT = "correct"
STATUS_INCORRECT = "incorrect"
STATUS_NO_ANSWER = "no_answer"
STATUS_TIMEOUT = "timeout"
STATUS_ERROR = "error"

_FEEDBACK_ANSWER_CHARS = 200


@dataclasses.dataclass(frozen=True)
class MathVerifyConfig:
    """How answers are extracted and compared.

    answer_pattern: regex used instead of ``\\boxed{}``; the last match's group
      ``answer`` (if named) else group 1 else the whole match is the answer.
    timeout_s: wall-clock limit for checking one answer (extract + parse + compare), seconds.
    batch_budget_s: wall-clock limit for a whole `score_batch` call, seconds (checks not
      done by then score 0, `MathResult.unscored`); independent of the batch's size.
    isolation: "process" (worker subprocesses, works from any thread, killed when stuck
      in C code: the only form with a hard bound) or "inline" (calling thread, main thread
      only; its timer interrupts Python code only, so a check stuck in C has no bound).
    num_workers: worker processes for "process" isolation; 0 = one per CPU core this
      process may use, at most `MAX_AUTO_WORKERS` (`resolve_workers`).
    grace_s: extra seconds the parent waits before killing a worker that missed
      its own timer.
    worker_memory_mb: address-space limit of each worker (0 = no limit).
    startup_timeout_s: how long a worker may take to import sympy/math-verify.
    max_answer_chars: longer extracted answers are not compared (reward 0): a 1 MB
      string or thousands of nested braces only burn the time limit.
    float_rounding, numeric_precision, strict, allow_set_relation_comp: passed to
      ``math_verify.verify`` (decimal places for floats, sympy evalf precision,
      variables must match / sets != tuples, allow ``1<x<2`` vs ``(1,2)``).
    """

    answer_pattern: str | None = None
    timeout_s: float = 5.0
    batch_budget_s: float = 60.0
    isolation: str = "process"
    num_workers: int = 0
    grace_s: float = 5.0
    worker_memory_mb: int = 4096
    startup_timeout_s: float = 120.0
    max_answer_chars: int = 1000
    float_rounding: int = 6
    numeric_precision: int = 15
    strict: bool = True
    allow_set_relation_comp: bool = False

    def __post_init__(self):
        if self.isolation not in ("process", "inline"):
            raise ValueError(f"MathVerifyConfig.isolation must be 'process' or 'inline', got {self.isolation!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"MathVerifyConfig.timeout_s must be > 0, got {self.timeout_s}")
        if not self.batch_budget_s > 0:
            raise ValueError(f"MathVerifyConfig.batch_budget_s must be > 0, got {self.batch_budget_s}")
        if self.num_workers < 0:
            raise ValueError(f"MathVerifyConfig.num_workers must be >= 0 (0 = one per core), got {self.num_workers}")
        if self.grace_s < 0 or self.worker_memory_mb < 0 or self.startup_timeout_s <= 0 or self.max_answer_chars < 1:
            raise ValueError("MathVerifyConfig: grace_s and worker_memory_mb must be >= 0, startup_timeout_s > 0, "
                             "max_answer_chars >= 1")
        if self.answer_pattern is not None:
            try:
                re.compile(self.answer_pattern)
            except re.error as e:
                raise ValueError(f"MathVerifyConfig.answer_pattern is not a valid regex: {e}") from e


MAX_AUTO_WORKERS = 16


def resolve_workers(num_workers: int) -> int:
    """`num_workers`, or for 0 the CPU cores this process may use (at most `MAX_AUTO_WORKERS`)."""
    if num_workers > 0:
        return num_workers
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_AUTO_WORKERS))


@dataclasses.dataclass(frozen=True)
class MathResult:
    """Outcome for one response: reward in [0, 1], SDPO feedback, extracted answer, status;
    `unscored`: not checked because the batch's budget ran out (reward 0, status timeout)."""

    reward: float
    feedback: str
    extracted: str | None
    status: str
    unscored: bool = False


class AnswerCheckTimeout(BaseException):
    """Raised by the per-answer timer; a BaseException so `except Exception` misses it."""


# ----------------------------------------------------------------------------------
# Extraction
# ----------------------------------------------------------------------------------

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\b")


def _brace_matches(text: str) -> dict[int, int]:
    """Every balanced group of ``text`` in one left-to-right pass: ``{open index: index
    just past its closing brace}`` (unclosed groups are absent). Escaped braces (``\\{``,
    ``\\}``) do not count; a ``}`` with no open group is ignored. Linear time."""
    ends: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE_TOKEN_RE.finditer(text):
        tok = m.group(0)
        if tok == "{":
            stack.append(m.start())
        elif tok == "}":
            if stack:
                ends[stack.pop()] = m.end()
    return ends


_BRACE_TOKEN_RE = re.compile(r"\\[\s\S]|[{}]")  # an escape pair (skipped) or a brace
_BARE_ARG_RE = re.compile(r"[^\s$]+")


def _box_argument(text: str, cmd_end: int, ends: dict[int, int]) -> tuple[str, int] | None:
    """Argument of a ``\\boxed`` whose name ends at ``cmd_end``: (content, end) or None.
    `ends`: `_brace_matches(text)`."""
    i = cmd_end
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        end = ends.get(i)
        if end is None:
            return None  # truncated response: unbalanced braces
        return text[i + 1 : end - 1], end
    # ``\boxed 5``: the argument runs to the next whitespace or '$'.
    m = _BARE_ARG_RE.match(text, i) if i > cmd_end else None
    if m is None:
        return None
    return m.group(0), m.end()


def last_boxed(text: str) -> str | None:
    """Content of the last outermost ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``.

    Nested braces are balanced; a box inside another box is part of the outer one;
    an unclosed last box (truncated response) or an empty one gives None. Linear in
    ``len(text)``: the brace groups are matched once (`_brace_matches`), not per box.
    """
    found: str | None = None
    covered_to = -1
    ends: dict[int, int] | None = None
    for m in _BOX_RE.finditer(text):
        if m.start() < covered_to:
            continue
        if ends is None:
            ends = _brace_matches(text)
        arg = _box_argument(text, m.end(), ends)
        if arg is None:
            found = None
            continue
        found, covered_to = arg
    if found is not None and not found.strip():
        return None
    return found


def extract_final_answer(text: str, answer_pattern: str | None = None) -> str | None:
    """The final answer string of a response, or None when there is none.

    Uses the last ``\\boxed{}``/``\\fbox{}`` unless ``answer_pattern`` is given, in
    which case the last regex match (group ``answer``, else group 1, else all).
    """
    if answer_pattern is None:
        return last_boxed(text)
    matches = list(re.finditer(answer_pattern, text))
    if not matches:
        return None
    m = matches[-1]
    if "answer" in m.re.groupindex:
        ans = m.group("answer")
    elif m.re.groups >= 1:
        ans = m.group(1)
    else:
        ans = m.group(0)
    if ans is None or not ans.strip():
        return None
    return ans.strip()


def gold_answer(gold: Any) -> str:
    """Reference answer as a string; a worked solution containing ``\\boxed`` gives its box."""
    if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
        raise TypeError(f"gold answer must be a string or number, got {type(gold).__name__}: {repr(gold)[:80]}")
    s = str(gold)
    if _BOX_RE.search(s):
        boxed = last_boxed(s)
        if boxed is None:
            raise ValueError(f"gold answer has an unbalanced or empty \\boxed: {s[:200]!r}")
        return boxed
    return s


# ----------------------------------------------------------------------------------
# Normalisation that math-verify does not do itself
# ----------------------------------------------------------------------------------

# Group 1 keeps a LaTeX row break (two backslashes) intact: in "1 \\ 2" the second
# backslash and the space are not a "\ " spacing command.
_SPACING_RE = re.compile(r"(\\\\)|\\[,;:! ]|\\q?quad\b|~|\\displaystyle\b|\\textstyle\b")
# \text{10 cm} -> 10\text{ cm}: math-verify strips units only after a number. The unit is
# words only (an exponent ^2 allowed): "\text{3 cm or 4 cm}" is not a number and a unit.
_TEXT_NUMBER_UNIT_RE = re.compile(
    r"\\(text|mbox|textrm|mathrm)\{\s*(-?\d[\d.,]*)\s*([A-Za-z][A-Za-z .]*(?:\^\{?\d\}?)?)\s*\}")
# \text{3} -> 3 (a text group holding just a number).
_TEXT_NUMBER_RE = re.compile(r"\\(?:text|mbox|textrm|mathrm|textbf|mathbf)\{\s*(-?\d[\d.,]*)\s*\}")
_REPEATING_RE = re.compile(r"(-?)(\d*)\.(\d*)\\overline\{(\d+)\}")
# A text group that opens with the percent sign or word (\text{ percent}, \text{\%}, \mbox{ pct of all}):
# math-verify's unit stripping drops it whole, so "3 \text{ percent}" would read as 3; written as \%
# (the rest of the text kept after it) it is a percentage, the answer's value / 100.
_TEXT_PERCENT_RE = re.compile(
    r"\\(?:text(?:normal|rm|bf|it|sf|up)?|mbox|math(?:rm|bf|it))\s*\{\s*"
    r"(?:\\?%|percent(?:age)?s?|pcts?|per\s*cents?)(?![A-Za-z])([^{}]*)\}", re.IGNORECASE)
_SCI_E_RE = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?)[eE]([+-]?\d+)(?![\w.])")
_WHOLE_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _repeating_to_fraction(m: re.Match) -> str:
    """``0.1\\overline{6}`` -> ``\\frac{1}{6}`` (exact value of a repeating decimal)."""
    sign, whole, fixed, rep = m.groups()
    whole = whole or "0"
    # value = whole + (fixed_rep - fixed) / (10^len(fixed) * (10^len(rep) - 1))
    den = 10 ** len(fixed) * (10 ** len(rep) - 1)
    num = int(whole) * den + int(fixed + rep) - (int(fixed) if fixed else 0)
    return f"{sign}\\frac{{{num}}}{{{den}}}"


def _clean_characters(s: str) -> str:
    """NFC; invisible format and control characters (zero-width space/joiners, BOM, soft
    hyphen, bidi marks, NUL) are dropped, so they cannot split or hide digits (``3<ZWSP>4`` is
    34); Unicode spaces become ASCII spaces."""
    s = unicodedata.normalize("NFC", s)
    if s.isascii() and s.isprintable():
        return s
    return "".join(" " if ch.isspace() else "" if unicodedata.category(ch) in ("Cf", "Cc") else ch
                   for ch in s)


def _unwrap_whole_box(s: str) -> str:
    """``\\boxed{X}`` -> X while the whole answer is one box (a box inside an answer is left)."""
    while (m := _WHOLE_BOX_RE.match(s)) and _brace_matches(s).get(m.end() - 1) == len(s):
        s = s[m.end():-1].strip()
    return s


def normalize_answer(answer: str) -> str:
    """LaTeX clean-up applied before math-verify (which does the rest).

    Drops invisible characters (`_clean_characters`), outer ``$...$`` and a box around the
    whole answer, spacing commands (``\\,`` ``\\!`` ``\\quad`` ``~`` ``\\displaystyle``); moves a
    leading number out of ``\\text{10 cm}`` (``\\text{3}`` -> 3), writes a percent in text
    (``\\text{ percent}``, ``\\text{\\%}``) as ``\\%``, writes ``°`` as
    ``^{\\circ}``, turns repeating decimals ``0.\\overline{3}`` into fractions and ``1.5e3``
    into ``1.5\\times10^{3}``.
    """
    s = _clean_characters(answer).strip()
    while len(s) >= 2 and s.startswith("$") and s.endswith("$"):
        s = s[1:-1].strip()
    if s.startswith("\\(") and s.endswith("\\)"):
        s = s[2:-2].strip()
    s = _unwrap_whole_box(s)
    s = _SPACING_RE.sub(lambda m: m.group(1) or "", s)
    s = _TEXT_NUMBER_UNIT_RE.sub(lambda m: f"{m.group(2)}\\text{{ {m.group(3).strip()}}}", s)
    s = _TEXT_NUMBER_RE.sub(r"\1", s)
    s = _TEXT_PERCENT_RE.sub(lambda m: "\\%" + (f"\\text{{{m.group(1)}}}" if m.group(1).strip() else ""), s)
    s = s.replace("°", "^{\\circ}")
    s = _REPEATING_RE.sub(_repeating_to_fraction, s)
    s = _SCI_E_RE.sub(lambda m: f"{m.group(1)}\\times10^{{{m.group(2)}}}", s)
    return s.strip()


# ----------------------------------------------------------------------------------
# Strict pre-check: an answer is one value, read whole
# ----------------------------------------------------------------------------------
# math-verify is built to find an answer in free text, so it is lenient where a reward must
# not be: `parse` falls back to a fragment (the rightmost number) when the whole string does
# not parse ("3<ZWSP>4", "4 \to 3", "3 \lor 3"); its normalisation drops what follows a nested
# \boxed and everything from the first \text{ to the end ("3 \text{ (or 4)}"); \text{3 or 4}
# reads as 3; latex2sympy turns "a \approx b" into a; and the grader compares an equation's
# right-hand side with a value gold ("17 = 3" == 3). The checks below reject such an answer
# before it is compared; a gold that itself uses a relation allows it in the answer.

_TEXT_CMD_RE = re.compile(
    r"\\(?:text(?:normal|rm|bf|it|sf|tt|up|sc)?|mbox|hbox|emph|operatorname|math(?:rm|bf|it|sf|tt|normal))\s*\{")
_SCRIPT_RE = re.compile(r"[_^]\s*\{")
_EXPONENT_RE = re.compile(r"\^\s*\{?\s*\d+\s*\}?")
_BOX_ANYWHERE_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_DIGITS_APART_RE = re.compile(r"\d\s+\d")
# Relations and logical connectives, by class: an answer may use a class only where its gold does.
_OP_TOKEN_RE = re.compile(r"\\[A-Za-z]+|:=|=:|==|<=|>=|!=|[=<>\u2190-\u21ff\u2200-\u22ff]")
_OP_CLASS = {
    "=": "=", "==": "=", ":=": ":=", "=:": ":=", "\\coloneqq": ":=", "\\eqqcolon": ":=", "\\triangleq": ":=",
    "<": "<", ">": "<", "\\lt": "<", "\\gt": "<", "\\ll": "<", "\\gg": "<",
    "<=": "<=", ">=": "<=", "\\le": "<=", "\\leq": "<=", "\\ge": "<=", "\\geq": "<=", "\\leqslant": "<=",
    "\\geqslant": "<=", "\\leqq": "<=", "\\geqq": "<=",
    "!=": "!=", "\\ne": "!=", "\\neq": "!=", "\\not": "not", "\\neg": "not", "\\lnot": "not",
    "\\approx": "~", "\\sim": "~", "\\simeq": "~", "\\cong": "~", "\\doteq": "~", "\\approxeq": "~",
    "\\thickapprox": "~", "\\thicksim": "~", "\\propto": "~", "\\equiv": "equiv",
    "\\in": "in", "\\notin": "in", "\\ni": "in", "\\subset": "sub", "\\subseteq": "sub", "\\supset": "sub",
    "\\supseteq": "sub", "\\subsetneq": "sub", "\\supsetneq": "sub",
    "\\lor": "or", "\\vee": "or", "\\land": "and", "\\wedge": "and", "\\mid": "mid", "\\nmid": "mid",
}
_ARROWS = ("to", "gets", "mapsto", "longmapsto", "implies", "impliedby", "iff", "rightarrow", "leftarrow",
           "Rightarrow", "Leftarrow", "leftrightarrow", "Leftrightarrow", "longrightarrow", "Longrightarrow",
           "longleftarrow", "Longleftarrow", "longleftrightarrow", "Longleftrightarrow", "rightleftharpoons")
_OP_CLASS.update({f"\\{a}": "->" for a in _ARROWS})
_UNICODE_OP_CLASS = {"≤": "<=", "≥": "<=", "≦": "<=", "≧": "<=", "≠": "!=", "≈": "~", "∼": "~", "≃": "~",
                     "≅": "~", "≡": "equiv", "∈": "in", "∉": "in", "∋": "in", "∨": "or", "∧": "and", "¬": "not",
                     "∣": "mid", "⊂": "sub", "⊆": "sub", "⊃": "sub", "⊇": "sub"}
# A name an equation may assign to: letters and commands (not \pi), a subscript, primes, an argument.
_NAME_RE = re.compile(
    r"\s*(?:(?!\\pi\b|\\infty\b)(?:[A-Za-z]|\\[A-Za-z]+(?:\s*\{[A-Za-z\s]*\})?)\s*)+"
    r"(?:_\s*(?:\w|\{[^{}]*\}))?'*\s*(?:\([^()]*\))?\s*")


def _masked(s: str, scripts: bool = True) -> tuple[str, list[str]]:
    """``s`` with the contents of text groups (``\\text{..}`` and kin) and, if ``scripts``, of
    braced sub/superscripts blanked out; and the text groups' contents."""
    ends = _brace_matches(s)
    keep, texts, i = [], [], 0
    pattern = _TEXT_CMD_RE.pattern + ("|" + _SCRIPT_RE.pattern if scripts else "")
    for m in re.finditer(pattern, s):
        if m.start() < i or (m.end() - 1) not in ends:
            continue
        end = ends[m.end() - 1]
        keep.append(s[i:m.end()])
        keep.append(" " * (end - 1 - m.end()) + "}")
        if _TEXT_CMD_RE.fullmatch(m.group(0)):
            texts.append(s[m.end():end - 1])
        i = end
    keep.append(s[i:])
    return "".join(keep), texts


_LIST_WORD_RE = re.compile(r"(?<![A-Za-z\\])(?:and|or)(?![A-Za-z])")
_LIST_SEP_RE = re.compile(r"(?<!\d),|,(?!\d{3}(?!\d))|;")  # not a thousands separator


def _op_classes(s: str, is_gold: bool = False) -> set[str]:
    """Classes of the relations and connectives in ``s`` outside scripts; "list": the words
    "and"/"or" (math-verify reads them as commas), or for a gold also a top-level comma."""
    masked, texts = _masked(s)
    out = set()
    if any(_LIST_WORD_RE.search(t) for t in [masked, *texts]) or (
            is_gold and len(_split_top_level(s.replace("{,}", ""), _LIST_SEP_RE)) > 1):
        out.add("list")
    for tok in _OP_TOKEN_RE.findall(masked):
        cls = _OP_CLASS.get(tok) or _UNICODE_OP_CLASS.get(tok)
        if cls is None and len(tok) == 1 and "\u2190" <= tok <= "\u21ff":
            cls = "->"
        if cls is not None:
            out.add(cls)
    return out


def _split_top_level(s: str, sep_re: re.Pattern) -> list[str]:
    """``s`` split at matches of ``sep_re`` outside any brace or bracket."""
    parts, depth, start = [], 0, 0
    for m in re.finditer(r"\\[{}]|\\[A-Za-z]+|[{(\[]|[})\]]|" + sep_re.pattern, s):
        tok = m.group(0)
        if tok in ("{", "(", "[", "\\{"):
            depth += 1
        elif tok in ("}", ")", "]", "\\}"):
            depth = max(depth - 1, 0)
        elif depth == 0 and sep_re.fullmatch(tok):
            parts.append(s[start:m.start()])
            start = m.end()
    parts.append(s[start:])
    return parts


_ASSIGN_SEP_RE = re.compile(r"(?<![:<>!=])=(?![:=])|\\in(?![A-Za-z])")
_EQUALS_RE = re.compile(r"(?<![:<>!=])=(?![:=])")
_TEXT_LIST_WORD_RE = re.compile(r"\\(?:text|mbox|textrm|mathrm)\s*\{\s*(?:and|or)\s*\}")


def _answer_defect(p: str) -> str | None:
    """Why the normalised answer ``p`` is not a single value that math-verify reads whole (None: no defect)."""
    for ch in p:
        if not ch.isascii():
            cat = unicodedata.category(ch)
            if cat[0] == "N" or cat in ("Mn", "Mc", "Me", "Co", "Cs", "Cn"):
                return f"character {ch!r} ({cat})"  # a look-alike digit or a combining mark
    if _BOX_ANYWHERE_RE.search(p):
        return "a box inside the answer"
    masked, texts = _masked(p)
    if any(re.search(r"\d", _EXPONENT_RE.sub("", t)) for t in texts):
        return "a number inside text"
    if _DIGITS_APART_RE.search(masked):
        return "numbers separated by spaces"
    return None


def _assigned_values(p: str, g: str) -> list[str] | None:
    """The values the answer ``p`` states, checked one by one against the gold ``g``: ``[p]``;
    the right-hand sides of ``x = a (= b ...)`` / ``x \\in S`` where the gold has no ``=``
    / ``\\in``; None when ``p`` uses a relation or connective that ``g`` does not."""
    extra = _op_classes(p) - _op_classes(g, is_gold=True)
    if not extra:
        return [p]
    if not extra <= {"=", "in"}:
        return None
    items = _split_top_level(_LIST_WORD_RE.sub(",", _TEXT_LIST_WORD_RE.sub(",", p)), _LIST_SEP_RE)
    if len(items) > 1 and extra == {"="} and "list" in _op_classes(g, is_gold=True):
        # A list gold ("1, 2") and "x = 1 \text{ or } x = 2": the list of right-hand sides.
        values = []
        for item in items:
            sides = _split_top_level(item, _EQUALS_RE)
            if len(sides) > 2 or (len(sides) == 2 and not _NAME_RE.fullmatch(sides[0])) or not sides[-1].strip():
                return None
            values.append(sides[-1].strip())
        return [", ".join(values)]
    parts = _split_top_level(p, _ASSIGN_SEP_RE)
    if len(parts) < 2 or not _NAME_RE.fullmatch(parts[0]) or not all(x.strip() for x in parts[1:]):
        return None
    if "in" in extra and len(parts) != 2:
        return None
    return [x.strip() for x in parts[1:]]


# math-verify also finds an answer after the word "answer" anywhere in a string (its "answer"
# anchor, "final answer ... is") and in the last $-delimited part: "4 answer 3", "\frac{4}{answer 3}",
# "4 final answer is 3" and "4$$3" read as 3. An answer may open with such a phrase ("The final
# answer is 3"); the word anywhere else, or values in more than one $-delimited part, is no one value.
_ANSWER_LEAD_RE = re.compile(
    r"\s*(?:(?:so|thus|hence|therefore|the|my|our|final)(?:\s*,)?\s+)*answer\s*(?:is(?![A-Za-z]))?\s*:?\s*", re.I)
_ANSWER_WORD_RE = re.compile(r"answer", re.I)
_DOLLAR_RE = re.compile(r"(?<!\\)\$")
_CONTENT_RE = re.compile(r"[^\s.,;:!]")  # a part holding more than spaces and punctuation


def _stated_answer(p: str) -> str | None:
    """The answer ``p`` without a leading "(The final) answer (is)" phrase; None where the word
    "answer" is anywhere else in it or `$` signs separate more than one part with content."""
    lead = _ANSWER_LEAD_RE.match(p)
    if lead is not None:
        p = p[lead.end():]
    if _ANSWER_WORD_RE.search(p) or sum(bool(_CONTENT_RE.search(part)) for part in _DOLLAR_RE.split(p)) > 1:
        return None
    return p


def _digit_counts(s: str) -> dict[str, int]:
    return {d: s.count(d) for d in "0123456789" if d in s}


# ----------------------------------------------------------------------------------
# Equivalence (runs inline or inside a worker process)
# ----------------------------------------------------------------------------------

def _import_math_verify():
    try:
        import math_verify  # noqa: F401
    except ImportError as e:  # pragma: no cover - exercised only without the dependency
        raise ImportError(
            "pipo_jax.tasks.math needs the 'math-verify' package (pip install 'math-verify>=0.7')"
        ) from e
    # We run math-verify with its alarm-based timeout off and enforce our own limit;
    # silence its one-time "timeout is disabled" warning, which does not apply here.
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_NoTimeoutWarning())
    return math_verify


class _NoTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


def _parse(math_verify, latex: str):
    return math_verify.parse(
        f"${latex}$",
        extraction_config=[math_verify.LatexExtractionConfig(), math_verify.ExprExtractionConfig()],
        parsing_timeout=None,
    )


_TEXT_EXPONENT_RE = re.compile(r"\}\s*\^\s*\{?\s*\d+\s*\}?")


def _read_whole(mv, p: str) -> bool:
    """True when math-verify's LaTeX normalisation of ``p`` keeps every digit outside text
    groups (it drops what follows a nested box, or the first ``\\text{`` on, as a unit) and
    the result parses as one expression (else `parse` would fall back to a fragment)."""
    from latex2sympy2_extended import latex2sympy
    from latex2sympy2_extended.math_normalization import normalize_latex
    from math_verify.grader import should_treat_as_complex

    norm_config = mv.LatexExtractionConfig().normalization_config
    # nits=False: its "0.5" -> \frac{1}{2} changes digits without dropping a value.
    kept = _digit_counts(normalize_latex(p, config=dataclasses.replace(norm_config, nits=False)))
    stated = _digit_counts(_TEXT_EXPONENT_RE.sub("}", _masked(p, scripts=False)[0]))
    if any(kept.get(d, 0) < n for d, n in stated.items()):
        return False
    latex = normalize_latex(p, config=norm_config)
    if _DIGITS_APART_RE.search(latex):  # "3 \text{ } 4" -> "3  4", which latex2sympy reads as 3 + 4
        return False
    try:
        latex2sympy(latex, is_real=not should_treat_as_complex(latex), convert_degrees=False,
                    normalization_config=None)
    except Exception:
        return False
    return True


def _percent_as_its_value(parsed: list) -> list:
    """An answer's parse (`_parse`) with each percentage as the value it states, ``X\\%`` -> X/100.

    latex2sympy and math-verify's parser keep ``X\\%`` (also ``X%``, ``X percent``) as
    ``X * UnevaluatedExpr(1/100)``, and math-verify's grader compares such an integer with an
    integer by X alone (``sympy_numeric_eq``: "9% == 9"), so ``3\\%`` matched gold 3 as well as
    0.03. For the answer that hundredth is now evaluated: ``3\\%`` is 3/100 and nothing else
    (``300\\%`` is 3). The gold's parse is left as it is: a gold ``50\\%`` still accepts 50,
    the unit being the gold's. A sympy value that cannot be rebuilt is dropped (the answer then
    only matches as the identical string)."""
    from sympy import Basic, MatrixBase, Rational, UnevaluatedExpr

    hundredth = UnevaluatedExpr(Rational(1, 100))
    out = []
    for expr in parsed:
        if isinstance(expr, (Basic, MatrixBase)) and expr.has(hundredth):
            try:
                expr = expr.xreplace({hundredth: Rational(1, 100)})
            except Exception:
                continue
        out.append(expr)
    return out


def answers_equivalent_untimed(pred: str, gold: str, config: MathVerifyConfig) -> bool:
    """True when the extracted answer ``pred`` equals the reference ``gold`` (no time limit).

    Beyond an identical string, ``pred`` must state one value that math-verify reads whole:
    the word "answer" only in a leading "The answer is" and no value beside a ``$`` part
    (`_stated_answer`), no defect (`_answer_defect`), no relation or connective the gold lacks (``x = 3`` is read
    as 3, `_assigned_values`), nothing math-verify's normalisation drops (`_read_whole`). A
    percentage in ``pred`` is its hundredth only (`_percent_as_its_value`: ``3\\%`` is 0.03, not 3)."""
    p, g = normalize_answer(pred), normalize_answer(gold)
    if p.replace(" ", "") == g.replace(" ", ""):
        return True
    stated = _stated_answer(p)
    if stated is None or not stated.strip():
        return False
    if stated != p:
        return answers_equivalent_untimed(stated, gold, config)
    if _answer_defect(p) is not None:
        return False
    values = _assigned_values(p, g)
    if values is None:
        return False
    if values != [p]:
        return all(answers_equivalent_untimed(v, gold, config) for v in values)
    mv = _import_math_verify()
    if not _read_whole(mv, p):
        return False
    return bool(
        mv.verify(
            _parse(mv, g),
            _percent_as_its_value(_parse(mv, p)),
            float_rounding=config.float_rounding,
            numeric_precision=config.numeric_precision,
            strict=config.strict,
            allow_set_relation_comp=config.allow_set_relation_comp,
            timeout_seconds=None,
        )
    )


def _raise_timeout(signum, frame):
    raise AnswerCheckTimeout()


def _require_main_thread() -> None:
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "inline math verification needs the main thread (its time limit is a signal); "
            "use MathVerifyConfig(isolation='process') from other threads"
        )


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raises AnswerCheckTimeout in the block after `seconds` (a SIGALRM timer: main thread
    only); restores any previous SIGALRM handler and interval timer afterwards."""
    _require_main_thread()
    old_handler = signal.signal(signal.SIGALRM, _raise_timeout)
    old_timer = signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_timer[0] > 0:  # give an outer timer back what is left of it
            left = max(old_timer[0] - (time.monotonic() - start), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, old_timer[1])


def check_response(response: str, gold: str, config: MathVerifyConfig, limit_s: float | None = None) -> dict:
    """The whole check of one response against the reference string `gold` (`gold_answer`),
    extraction included, under one timer of `limit_s` (default ``config.timeout_s``; main
    thread only). ``{"extracted": str | None, "outcome": status, "detail": str}``."""
    _require_main_thread()  # before the try below, which turns checker errors into outcomes
    out: dict[str, Any] = {"extracted": None, "outcome": STATUS_TIMEOUT, "detail": ""}
    try:
        with time_limit(config.timeout_s if limit_s is None else limit_s):
            extracted = out["extracted"] = extract_final_answer(response, config.answer_pattern)
            if extracted is None:
                out["outcome"] = STATUS_NO_ANSWER
            elif len(extracted) > config.max_answer_chars:
                out["outcome"], out["detail"] = STATUS_ERROR, f"longer than {config.max_answer_chars} characters"
            else:
                ok = answers_equivalent_untimed(extracted, gold, config)
                out["outcome"] = STATUS_CORRECT if ok else STATUS_INCORRECT
    except AnswerCheckTimeout:
        out["outcome"] = STATUS_TIMEOUT
    except MemoryError:
        out["outcome"], out["detail"] = STATUS_ERROR, "out of memory"
    except Exception as e:  # one bad answer scores 0, it does not stop the batch
        out["outcome"], out["detail"] = STATUS_ERROR, f"{type(e).__name__}: {e}"[:300]
    return out


# ----------------------------------------------------------------------------------
# Results and feedback
# ----------------------------------------------------------------------------------

def _shown(answer: str) -> str:
    a = " ".join(answer.split())
    return a if len(a) <= _FEEDBACK_ANSWER_CHARS else a[: _FEEDBACK_ANSWER_CHARS - 3] + "..."


def _no_answer_result(config: MathVerifyConfig) -> MathResult:
    what = "No \\boxed{} answer found." if config.answer_pattern is None else (
        "No final answer matching the expected answer format found.")
    return MathResult(0.0, what, None, STATUS_NO_ANSWER)


def _unscored_result(config: MathVerifyConfig) -> MathResult:
    return MathResult(0.0, f"The response could not be checked within the batch's {config.batch_budget_s:g} s budget.",
                      None, STATUS_TIMEOUT, unscored=True)


def _result(check: dict, config: MathVerifyConfig) -> MathResult:
    """The MathResult of a `check_response` outcome (or a worker's reply of one)."""
    extracted, outcome = check.get("extracted"), check["outcome"]
    if outcome == STATUS_NO_ANSWER:
        return _no_answer_result(config)
    if extracted is None:  # timed out or failed while extracting
        what = (f"within {config.timeout_s:g} s" if outcome == STATUS_TIMEOUT else f"({check.get('detail', '')})")
        return MathResult(0.0, f"The response could not be checked {what}.", None,
                          STATUS_TIMEOUT if outcome == STATUS_TIMEOUT else STATUS_ERROR)
    return _verdict_result(extracted, outcome, config, check.get("detail", ""))


def _verdict_result(extracted: str, outcome: str, config: MathVerifyConfig, detail: str = "") -> MathResult:
    shown = _shown(extracted)
    if outcome == STATUS_CORRECT:
        return MathResult(1.0, f"The final answer {shown} is correct.", extracted, outcome)
    if outcome == STATUS_INCORRECT:
        return MathResult(0.0, f"The final answer {shown} is incorrect.", extracted, outcome)
    if outcome == STATUS_TIMEOUT:
        return MathResult(
            0.0, f"The final answer {shown} could not be checked within {config.timeout_s:g} s.", extracted, outcome)
    return MathResult(0.0, f"The final answer {shown} could not be checked ({detail}).", extracted, STATUS_ERROR)


# ----------------------------------------------------------------------------------
# Worker processes
# ----------------------------------------------------------------------------------

def _worker_main() -> None:
    """Worker loop: one JSON request per stdin line -> one JSON reply per line.

    Request ``{"response", "gold"}`` (the reference as `gold_answer` gives it); reply: the
    `check_response` dict. Started by `MathVerifier`; config JSON in ``argv[1]``.
    """
    config = MathVerifyConfig(**json.loads(sys.argv[1]))
    if config.worker_memory_mb > 0:
        limit = config.worker_memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # Replies go to a private copy of stdout; anything a library prints goes to stderr.
    reply = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    _import_math_verify()
    reply.write('{"ready": true}\n')
    for line in sys.stdin:
        req = json.loads(line)
        try:
            out: dict[str, Any] = check_response(req["response"], req["gold"], config)
        except MemoryError:
            out = {"outcome": STATUS_ERROR, "extracted": None, "detail": "out of memory"}
        except Exception as e:  # one bad answer must not stop the worker
            out = {"outcome": STATUS_ERROR, "extracted": None, "detail": f"{type(e).__name__}: {e}"[:300]}
        reply.write(json.dumps(out) + "\n")


class _Worker:
    """One verification subprocess with a line-buffered reply pipe."""

    def __init__(self, config: MathVerifyConfig):
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env.setdefault("OMP_NUM_THREADS", "1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from pipo_jax.tasks.math import _worker_main; _worker_main()",
             json.dumps(dataclasses.asdict(config))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, env=env,
            start_new_session=True,  # a Ctrl-C to the trainer's group does not hit workers
        )
        self._buf = b""
        self.ready = False
        self.start_deadline = time.monotonic() + config.startup_timeout_s

    def check_ready(self) -> bool:
        """Reads the worker's "ready" line once it is there (call after `select` says readable,
        or to poll: `MathVerifier._wait_for_one`). Raises RuntimeError if it died or missed its start-up time."""
        if not self.ready:
            line = self.take_line()
            if line is None and time.monotonic() >= self.start_deadline:
                self.kill()
                raise RuntimeError("math verification worker did not start in time (see its stderr above)")
            if line is not None:
                if not json.loads(line).get("ready"):
                    self.kill()
                    raise RuntimeError("math verification worker failed to start (see its stderr above)")
                self.ready = True
        return self.ready

    def send(self, request: dict) -> None:
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def take_line(self) -> str | None:
        if b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            return line.decode()
        return None

    def pump(self) -> bool:
        """Read what is available; False on EOF (worker died)."""
        chunk = os.read(self.fileno(), 1 << 16)
        if not chunk:
            return False
        self._buf += chunk
        return True

    def read_line(self, deadline: float) -> str | None:
        while (line := self.take_line()) is None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self], [], [], left)[0] or not self.pump():
                return None
        return line

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


class MathVerifier:
    """Scores responses against reference answers; callable and batched.

    ``verifier(response, gold) -> MathResult``; ``verifier.score_batch(responses,
    golds) -> list[MathResult]`` (spread over `num_workers` processes, within
    ``batch_budget_s``). Use as a context manager or call `close` to stop the workers.
    Not thread-safe: use one verifier per calling thread.
    """

    def __init__(self, config: MathVerifyConfig = MathVerifyConfig()):
        self.config = config
        self.num_workers = resolve_workers(config.num_workers)
        self._workers: list[_Worker | None] = [None] * self.num_workers
        self.restarts = 0  # workers killed for overrunning or dying

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def close(self) -> None:
        for i, w in enumerate(self._workers):
            if w is not None:
                w.kill()
                self._workers[i] = None

    def __call__(self, response: str, gold: Any) -> MathResult:
        return self.score_batch([response], [gold])[0]

    def score_batch(self, responses: Sequence[str], golds: Sequence[Any]) -> list[MathResult]:
        """One result per response, in order; what the batch budget leaves unchecked is unscored."""
        if len(responses) != len(golds):
            raise ValueError(f"score_batch: {len(responses)} responses but {len(golds)} gold answers")
        todo = deque((i, resp, gold_answer(gold)) for i, (resp, gold) in enumerate(zip(responses, golds)))
        results: list[MathResult | None] = [None] * len(responses)
        if todo and self.config.isolation == "inline":
            self._run_inline(todo, results)
        elif todo:
            self._run_in_workers(todo, results)
        unscored = sum(r.unscored for r in results)
        if unscored:
            logger.warning("math batch: %d of %d answers not checked within the batch budget of %g s (scored 0)",
                           unscored, len(results), self.config.batch_budget_s)
        return results  # type: ignore[return-value]

    def _run_inline(self, todo: deque, results: list) -> None:
        """Checks `todo` in this (main) thread, each under min(timeout_s, what is left of the budget).

        The limits bound Python code only: a check stuck in C runs until it returns."""
        cfg = self.config
        deadline = time.monotonic() + cfg.batch_budget_s
        for i, resp, gold in todo:
            left = deadline - time.monotonic()
            if left <= 0:
                results[i] = _unscored_result(cfg)
                continue
            check = check_response(resp, gold, cfg, min(cfg.timeout_s, left))
            if check["outcome"] == STATUS_TIMEOUT and left < cfg.timeout_s:
                results[i] = _unscored_result(cfg)  # cut by the budget, not by its own limit
            else:
                results[i] = _result(check, cfg)

    def _start_missing(self) -> None:
        """Starts a worker in every empty or dead slot (without waiting for it)."""
        for slot, w in enumerate(self._workers):
            if w is not None and w.proc.poll() is not None:  # died while idle
                self._retire(slot)
                w = None
            if w is None:
                self._workers[slot] = _Worker(self.config)

    def _retire(self, slot: int, replace: bool = False) -> None:
        """Kills the slot's worker; `replace`: starts its successor now (ready in the background)."""
        w = self._workers[slot]
        if w is not None:
            w.kill()
        self._workers[slot] = _Worker(self.config) if replace else None
        self.restarts += 1

    def _wait_for_one(self) -> None:
        """Blocks until at least one worker is ready (start-up is not charged to the batch budget;
        the others join the batch as they become ready)."""
        while not any(w.ready for w in self._workers):
            starting = [w for w in self._workers if not w.ready]
            for w in select.select(starting, [], [], 0.05)[0]:
                if not w.pump():
                    w.kill()
                    raise RuntimeError("math verification worker failed to start (see its stderr above)")
            for w in starting:
                w.check_ready()

    def _run_in_workers(self, todo: deque, results: list) -> None:
        """Checks `todo` on the workers, each answer within `timeout_s + grace_s` and the whole
        batch within `batch_budget_s` (see the module doc)."""
        cfg = self.config
        self._start_missing()
        self._wait_for_one()
        batch_deadline = time.monotonic() + cfg.batch_budget_s
        busy: dict[int, tuple[int, float]] = {}  # slot -> (index, deadline)
        while todo or busy:
            now = time.monotonic()
            if now >= batch_deadline:
                self._abandon(todo, busy, results)
                return
            for slot in range(self.num_workers):
                w = self._workers[slot]
                if slot not in busy and todo and w.ready:
                    i, resp, gold = todo.popleft()
                    try:
                        w.send({"response": resp, "gold": gold})
                    except OSError:  # died while idle (killed, OOM): replace it, retry the answer
                        todo.appendleft((i, resp, gold))
                        self._retire(slot, replace=True)
                        continue
                    busy[slot] = (i, min(now + cfg.timeout_s + cfg.grace_s, batch_deadline))
            starting = [w for w in self._workers if not w.ready]
            waiting = {slot: self._workers[slot] for slot in busy}
            wait_s = max(0.0, min([d for _, d in busy.values()] + [batch_deadline]) - time.monotonic())
            if starting:
                wait_s = min(wait_s, 0.05)  # their start-up deadlines are checked below
            ready = select.select(list(waiting.values()) + starting, [], [], wait_s)[0]
            for w in starting:
                if w in ready and not w.pump():
                    w.kill()
                    raise RuntimeError("math verification worker failed to start (see its stderr above)")
                w.check_ready()
            for slot, w in waiting.items():
                i, deadline = busy[slot]
                if w in ready and not w.pump():
                    results[i] = _result({"outcome": STATUS_ERROR, "detail": "the checker process died"}, cfg)
                    del busy[slot]
                    self._retire(slot, replace=True)
                    continue
                line = w.take_line()
                if line is not None:
                    results[i] = _result(json.loads(line), cfg)
                    del busy[slot]
                elif time.monotonic() >= deadline:
                    if deadline >= batch_deadline:
                        continue  # the budget ran out under it: `_abandon` counts it as unscored
                    logger.warning("math check overran %.1f s; restarting its worker", cfg.timeout_s + cfg.grace_s)
                    results[i] = _result({"outcome": STATUS_TIMEOUT}, cfg)
                    del busy[slot]
                    self._retire(slot, replace=True)

    def _abandon(self, todo: deque, busy: dict, results: list) -> None:
        """The batch budget ran out: what is running or waiting is unscored (0, status timeout);
        the busy workers are replaced (their successors start in the background)."""
        for slot, (i, _) in busy.items():
            results[i] = _unscored_result(self.config)
            self._retire(slot, replace=True)
        for i, _, _ in todo:
            results[i] = _unscored_result(self.config)
        busy.clear()
        todo.clear()
