"""Math answer extraction, equivalence table, reward/feedback, time limits and workers."""
import os
import signal
import threading
import time

import pytest

from pipo_jax.tasks import math as mt

INLINE = mt.MathVerifyConfig(isolation="inline", timeout_s=5.0)


def answers_equivalent(pred: str, gold: str, config: mt.MathVerifyConfig) -> bool:
    """The equivalence check alone, under ``config.timeout_s`` (main thread only)."""
    with mt.time_limit(config.timeout_s):
        return mt.answers_equivalent_untimed(pred, gold, config)


def score_inline(response: str, gold, config: mt.MathVerifyConfig) -> mt.MathResult:
    """One response through the verifier's inline path (``config.isolation="inline"``: this thread)."""
    assert config.isolation == "inline"
    return mt.MathVerifier(config)(response, gold)

# (gold, predicted final answer, equivalent?) -- real-style answers from MATH-like data.
EQUIVALENT = [
    (r"\frac{1}{2}", "0.5"),
    (r"\frac{1}{2}", r"\dfrac{1}{2}"),
    (r"\frac{3}{4}", r"\tfrac34"),
    (r"\frac{3}{4}", "3/4"),
    (r"\frac{1}{2}", r"\frac{2}{4}"),
    (r"\frac12", "1/2"),
    (r"-\frac{1}{2}", r"\frac{-1}{2}"),
    (r"\frac{\sqrt{3}}{2}", r"\frac{1}{2}\sqrt{3}"),
    (r"2\sqrt{2}", r"\sqrt{8}"),
    (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}"),
    (r"8\sqrt{3}", r"\sqrt{192}"),
    (r"\sqrt{2}", r"\sqrt2"),
    ("1000", "1,000"),
    ("1000", "1{,}000"),
    ("1000", r"1\,000"),
    ("1000.50", r"\$1{,}000.50"),
    ("5", r"\$5"),
    ("5", r"\$5.00"),
    ("10", r"10\text{ cm}"),
    ("10", r"\text{10 cm}"),
    ("10", r"10 \mbox{ cm}"),
    ("4", r"4 \text{ m}^2"),
    ("2.5", r"2.5\text{ hours}"),
    ("30", r"30^\circ"),
    ("30", r"30^{\circ}"),
    ("30", "30°"),
    (r"50\%", "50"),  # a gold written with % carries the unit: the bare number is accepted
    ("0.05", r"5\%"),
    ("3", r"300\%"),
    ("(1,2)", r"\left(1, 2\right)"),
    ("[1,2)", r"\left[ 1, 2 \right)"),
    (r"(-\infty, 3]", r"(-\infty,3]"),
    (r"(0,\infty)", r"(0, \infty)"),
    ("(0,1)", r"x \in (0,1)"),
    ("(3,-1)", "(3, -1)"),
    (r"\{1,2\}", r"\{2,1\}"),
    (r"\left\{1,2\right\}", r"\{1,2\}"),
    ("1, 2, 3", "3, 2, 1"),
    ("-2, 1", "1, -2"),
    (r"\{-1, 2\}", "2, -1"),
    ("x^2+2x+1", "(x+1)^2"),
    (r"\frac{a+b}{2}", r"\frac{b+a}{2}"),
    (r"\frac{9\pi}{4}", r"\frac{9}{4}\pi"),
    ("3+2i", "2i+3"),
    ("3", "x=3"),
    ("5", "k = 5"),
    ("y = 2x + 1", "2x+1"),
    (r"\text{(B)}", "B"),
    ("C", r"\textbf{(C)}"),
    (r"\text{Evelyn}", "Evelyn"),
    (r"\pi", "3.14159265"),
    ("2^{10}", "1024"),
    ("10^{-3}", "0.001"),
    ("1.5", "1.50"),
    (r"\frac{7}{2}", "3.5"),
    (r"\frac{5}{2}", r"2\frac{1}{2}"),
    (r"\dfrac{14}{3}", r"4\frac{2}{3}"),
    (r"\frac{1}{3}", r"0.\overline{3}"),
    (r"\frac{1}{6}", r"0.1\overline{6}"),
    (r"6.02\times10^{23}", "6.02e23"),
    (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}"),
    (r"\infty", r"\infty"),
    (r"\frac{1}{2}", r"\displaystyle\frac12"),
    ("-3", "- 3"),
    (r"\sin^2 x + \cos^2 x", "1"),
]
NOT_EQUIVALENT = [
    ("12", "13"),
    (r"\frac{1}{3}", "0.333"),
    ("3", "3.0001"),
    ("[1,2)", "[1,2]"),
    (r"(0,\infty)", r"[0,\infty)"),
    ("(3,-1)", "(-1,3)"),
    ("(1,2)", "(2,1)"),
    (r"\{1,2\}", r"\{1,2,3\}"),
    ("x^2", "x^3"),
    ("x+1", "x-1"),
    ("2x", "2y"),
    (r"\text{Monday}", r"\text{Tuesday}"),
    ("B", "C"),
    (r"\sqrt{2}", "2"),
    (r"2\sqrt{3}", r"3\sqrt{2}"),
    (r"\frac{2}{3}", r"\frac{3}{2}"),
    ("-5", "5"),
    ("100", "1,000"),
    (r"\pi", "3.14"),
    ("6", "6!"),
    ("1/2", "2"),
    ("1.5", "15"),
    (r"\frac{1}{2}", r"\frac{1}{2}x"),
    # An answer's percent sign means value / 100 only: 50\% states 0.5, not 50 (the gold 50 has no unit).
    ("50", r"50\%"),
]
TABLE = [(g, p, True) for g, p in EQUIVALENT] + [(g, p, False) for g, p in NOT_EQUIVALENT]


def test_table_is_big_enough():
    assert len(TABLE) >= 60 and len(NOT_EQUIVALENT) >= 20


@pytest.mark.parametrize("gold,pred,expected", TABLE)
def test_equivalence_table_inline(gold, pred, expected):
    assert answers_equivalent(pred, gold, INLINE) is expected


def test_equivalence_table_in_workers_matches_inline():
    """The worker-process path gives the same verdicts as the inline path."""
    responses = [f"Thus the answer is $\\boxed{{{p}}}$." for _, p, _ in TABLE]
    with mt.MathVerifier(mt.MathVerifyConfig(num_workers=2, timeout_s=5.0)) as v:
        results = v.score_batch(responses, [g for g, _, _ in TABLE])
        assert v.restarts == 0
    assert [r.status for r in results] == ["correct" if e else "incorrect" for _, _, e in TABLE]
    assert [r.reward for r in results] == [1.0 if e else 0.0 for _, _, e in TABLE]


# ---------------------------------------------------------------- extraction

@pytest.mark.parametrize("text,expected", [
    (r"so $\boxed{12}$.", "12"),
    (r"first \boxed{3}, finally \boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}"),
    (r"\boxed{\{1,2\}} end", r"\{1,2\}"),  # escaped braces are not grouping
    (r"\boxed{\left\{ x \mid x>0 \right\}}", r"\left\{ x \mid x>0 \right\}"),
    (r"\boxed{\boxed{7} + 1}", r"\boxed{7} + 1"),  # a nested box belongs to the outer one
    (r"\fbox{7}", "7"),
    (r"\boxed {42}", "42"),
    (r"$\boxed 5$", "5"),
    (r"\boxed{3} then truncated \boxed{12", None),  # unclosed last box
    (r"\boxed{ }", None),
    ("no box at all: 12", None),
])
def test_last_boxed(text, expected):
    assert mt.last_boxed(text) == expected


def test_answer_pattern():
    text = "Answer: 3\nwait... Answer: 17"
    assert mt.extract_final_answer(text, r"Answer:\s*(\S+)") == "17"
    assert mt.extract_final_answer(text, r"Answer:\s*(?P<answer>\d+)") == "17"
    assert mt.extract_final_answer("ANSWER", r"[A-Z]+") == "ANSWER"
    assert mt.extract_final_answer("nothing", r"Answer:\s*(\S+)") is None
    cfg = mt.MathVerifyConfig(isolation="inline", answer_pattern=r"####\s*(.+)")
    assert score_inline("so 6*7 = 42\n#### 42", "42", cfg).reward == 1.0
    nope = score_inline(r"\boxed{42}", "42", cfg)
    assert (nope.status, nope.reward) == ("no_answer", 0.0)
    assert "expected answer format" in nope.feedback
    with pytest.raises(ValueError, match="answer_pattern"):
        mt.MathVerifyConfig(answer_pattern="(")


def test_gold_answer_from_solution_and_types():
    assert mt.gold_answer(r"We get $x=2$, so \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert mt.gold_answer(7) == "7"
    assert mt.gold_answer(2.5) == "2.5"
    with pytest.raises(TypeError, match="gold answer"):
        mt.gold_answer(["1"])
    with pytest.raises(ValueError, match="unbalanced"):
        mt.gold_answer(r"\boxed{1")


@pytest.mark.parametrize("raw,expected", [
    (r"0.\overline{3}", r"\frac{3}{9}"),
    (r"0.1\overline{6}", r"\frac{15}{90}"),
    (r"1.\overline{27}", r"\frac{126}{99}"),
    (r"-0.\overline{142857}", r"-\frac{142857}{999999}"),
    (r"1\,000", "1000"),
    (r"\text{10 cm}", r"10\text{ cm}"),
    ("6.02e23", r"6.02\times10^{23}"),
    ("$x$", "x"),
    (r"\displaystyle\frac12\quad", r"\frac12"),
])
def test_normalize_answer(raw, expected):
    assert mt.normalize_answer(raw) == expected


# ---------------------------------------------------------------- reward and feedback

def test_reward_and_feedback_strings():
    good = score_inline(r"so the total is $\boxed{\dfrac{3}{4}}$", "0.75", INLINE)
    assert good == mt.MathResult(1.0, r"The final answer \dfrac{3}{4} is correct.", r"\dfrac{3}{4}", "correct")
    bad = score_inline(r"\boxed{12}", "13", INLINE)
    assert bad == mt.MathResult(0.0, "The final answer 12 is incorrect.", "12", "incorrect")
    none = score_inline("I think it is 13", "13", INLINE)
    assert none == mt.MathResult(0.0, r"No \boxed{} answer found.", None, "no_answer")
    long = score_inline("\\boxed{" + "1+" * 200 + "1}", "3", INLINE)
    assert long.reward == 0.0 and long.feedback.endswith("... is incorrect.") and len(long.feedback) < 240


def test_inline_timeout_and_outer_timer_restored(monkeypatch):
    def spin_in_python(pred, gold, config):  # the inline timer bounds Python code only (no C here)
        while True:
            pass

    monkeypatch.setattr(mt, "answers_equivalent_untimed", spin_in_python)
    cfg = mt.MathVerifyConfig(isolation="inline", timeout_s=0.5)
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    try:
        start = time.monotonic()
        res = score_inline(r"\boxed{9^{9^{9}}}", "5", cfg)
        assert time.monotonic() - start < 25
        assert res.status == "timeout" and res.reward == 0.0
        assert res.feedback == "The final answer 9^{9^{9}} could not be checked within 0.5 s."
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < left < 30.0  # the caller's timer is still armed
        assert signal.getsignal(signal.SIGALRM) is not mt._raise_timeout
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert fired == []


def test_inline_from_other_thread_is_a_clear_error():
    errors = []

    def run():
        try:
            score_inline(r"\boxed{1}", "1", INLINE)
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert len(errors) == 1 and "isolation='process'" in errors[0]


def test_process_isolation_from_a_thread_with_timeout():
    """Workers keep the time limit when called off the main thread."""
    out = {}

    def run():
        with mt.MathVerifier(mt.MathVerifyConfig(timeout_s=1.0)) as v:
            out["res"] = v.score_batch([r"\boxed{9^{9^{9}}}", r"\boxed{2}"], ["5", "2"])
            out["restarts"] = v.restarts

    t = threading.Thread(target=run)
    t.start()
    t.join(120)
    assert [r.status for r in out["res"]] == ["timeout", "correct"]
    assert out["restarts"] == 0  # the worker's own timer fired; no kill needed


def test_stuck_worker_is_killed_and_replaced():
    """A worker that stops responding (here: SIGSTOP) is killed at timeout_s + grace_s."""
    with mt.MathVerifier(mt.MathVerifyConfig(timeout_s=0.5, grace_s=0.5, num_workers=1)) as v:
        assert v(r"\boxed{1}", "1").reward == 1.0
        os.kill(v._workers[0].proc.pid, signal.SIGSTOP)
        res = v(r"\boxed{2}", "2")
        assert (res.status, res.reward, v.restarts) == ("timeout", 0.0, 1)
        assert v(r"\boxed{3}", "3").status == "correct"  # a fresh worker took over


def test_dead_worker_mid_check_and_while_idle():
    with mt.MathVerifier(mt.MathVerifyConfig(timeout_s=20.0, num_workers=1)) as v:
        assert v(r"\boxed{1}", "1").reward == 1.0
        pid = v._workers[0].proc.pid
        threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
        res = v(r"\boxed{9^{9^{9}}}", "5")  # slow check; the worker is killed under it
        assert res.status == "error" and "checker process died" in res.feedback
        assert v(r"\boxed{4}", "4").status == "correct"
        os.kill(v._workers[0].proc.pid, signal.SIGKILL)  # dies while idle
        v._workers[0].proc.wait()
        assert v(r"\boxed{5}", "5").status == "correct"
        assert v.restarts == 2


def test_worker_start_failure_is_reported():
    with pytest.raises(RuntimeError, match="failed to start"):
        mt.MathVerifier(mt.MathVerifyConfig(worker_memory_mb=20))(r"\boxed{1}", "1")


def test_batch_validation_and_config_errors():
    with mt.MathVerifier(INLINE) as v:
        with pytest.raises(ValueError, match="2 responses but 1"):
            v.score_batch(["a", "b"], ["1"])
        assert [r.reward for r in v.score_batch([r"\boxed{1}", "x"], ["1", "1"])] == [1.0, 0.0]
    with pytest.raises(ValueError, match="isolation"):
        mt.MathVerifyConfig(isolation="thread")
    with pytest.raises(ValueError, match="timeout_s"):
        mt.MathVerifyConfig(timeout_s=0)
