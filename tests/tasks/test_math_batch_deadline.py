"""A batch of adversarial math answers is checked in parallel within the batch's budget
(`batch_budget_s`, whatever the batch's size): 32 answers that each burn their whole time
limit finish in time, what the budget leaves unchecked scores 0 and is counted
(`MathResult.unscored`), and the worker pool is whole afterwards."""

import math
import time

from pipo_jax.tasks import math as mt

ADVERSARIAL = [
    r"\boxed{9^{9^{9^9}}}",  # sympy evaluates the power tower: never finishes
    r"\boxed{10^{10^{10^{10}}}!}",
    r"\boxed{(2^{2^{40}})}",
    r"\boxed{" + "1" * 1_000_000 + "}",  # a 1 MB answer
    r"\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",  # 10k nested braces
]


def test_32_adversarial_answers_meet_the_batch_deadline_and_the_pool_survives():
    # 1 s per answer leaves honest checks room on a loaded 2-core machine; 8 workers keep the batch short
    # (four rounds of answers that each burn their whole second: ~2 cores for ~4 s).
    cfg = mt.MathVerifyConfig(timeout_s=1.0, grace_s=0.5, num_workers=8, batch_budget_s=4.5)
    responses = [ADVERSARIAL[i % len(ADVERSARIAL)] for i in range(32)]
    with mt.MathVerifier(cfg) as v:
        v(r"\boxed{\frac{1}{2}}", "0.5")  # starts the workers (not part of the batch's budget)
        pids = [w.proc.pid for w in v._workers]
        t0 = time.monotonic()
        results = v.score_batch(responses, ["7"] * len(responses))
        elapsed = time.monotonic() - t0
        budget = math.ceil(len(responses) / cfg.num_workers) * cfg.timeout_s + cfg.grace_s
        # The deadline is enforced by the checking loop itself; the slack bounds its own
        # bookkeeping after the deadline (select wake-up, killing and restarting workers).
        assert elapsed <= budget + 2.0, (elapsed, budget)
        assert all(r.reward == 0.0 for r in results)
        by_kind = {a[:12]: {r.status for r, resp in zip(results, responses) if resp == a} for a in ADVERSARIAL}
        assert by_kind[ADVERSARIAL[3][:12]] == by_kind[ADVERSARIAL[4][:12]] == {"error"}  # too long: not compared
        assert {r.status for r in results} <= {"timeout", "error"}
        assert "longer than 1000 characters" in results[3].feedback
        # The pool survives: every slot holds a live worker, and honest answers check as before.
        assert len(v._workers) == 8 and all(w.proc.poll() is None for w in v._workers)
        after = v.score_batch([r"\boxed{3}", r"\boxed{x^2}", r"\boxed{4}", r"\boxed{0.5}"], ["3", "x^2", "5", "1/2"])
        assert [r.status for r in after] == ["correct", "correct", "incorrect", "correct"]
        # A worker is replaced only when killed: each replaced pid counts one restart.
        assert v.restarts == sum(p not in [w.proc.pid for w in v._workers] for p in pids)


def test_the_budget_bounds_a_batch_whatever_its_size_and_counts_the_unscored():
    # 2 workers, 1 s per answer, a 3 s budget: 256 adversarial answers would need ~80 s
    # under the earlier ceil(n / workers) x timeout_s deadline.
    cfg = mt.MathVerifyConfig(timeout_s=1.0, grace_s=0.5, num_workers=2, batch_budget_s=3.0)
    honest = [r"so \boxed{\frac{1}{2}}", r"\boxed{4}", r"\boxed{x^2}"]
    responses = honest + [ADVERSARIAL[i % 3] for i in range(256)] + [r"\boxed{7}"]
    golds = ["0.5", "5", "x^2"] + ["7"] * 257
    with mt.MathVerifier(cfg) as v:
        v(r"\boxed{1}", "1")  # starts the workers (start-up is not charged to a batch)
        t0 = time.monotonic()
        results = v.score_batch(responses, golds)
        elapsed = time.monotonic() - t0
        # The slack bounds the loop's own bookkeeping after the budget (select wake-up, kills).
        assert elapsed <= cfg.batch_budget_s + 2.0, elapsed
        # Checked in batch order: the honest answers at the front were scored.
        assert [(r.status, r.reward) for r in results[:3]] == [("correct", 1.0), ("incorrect", 0.0),
                                                               ("correct", 1.0)]
        unscored = [i for i, r in enumerate(results) if r.unscored]
        # At most budget / timeout answers per worker finish or time out on their own (+1 in flight each).
        checked_adversarial = len(results) - 3 - len(unscored)
        assert checked_adversarial <= 2 * (cfg.batch_budget_s / cfg.timeout_s + 1), checked_adversarial
        assert unscored and min(unscored) >= 3 and unscored[-1] == len(results) - 1  # the last, honest one too
        for i in unscored:
            assert (results[i].reward, results[i].status, results[i].extracted) == (0.0, "timeout", None)
            assert "batch's 3 s budget" in results[i].feedback
        assert all(r.reward == 0.0 for r in results[3:])
        assert all(w.proc.poll() is None for w in v._workers)
        after = v.score_batch([r"\boxed{3}", r"\boxed{4}"], ["3", "5"])
        assert [r.status for r in after] == ["correct", "incorrect"] and not any(r.unscored for r in after)


def spin_in_python_on_gold_7(real_check):
    """`real_check`, except that a check against the gold "7" never ends in Python bytecode:
    the one kind of long check the inline timer can interrupt (a check stuck in C, such as
    `ADVERSARIAL`, runs only in the killable workers, never in the test process)."""
    def check(pred, gold, config):
        while gold == "7":
            pass
        return real_check(pred, gold, config)
    return check


def test_inline_checks_keep_the_budget_too(monkeypatch):
    monkeypatch.setattr(mt, "answers_equivalent_untimed", spin_in_python_on_gold_7(mt.answers_equivalent_untimed))
    cfg = mt.MathVerifyConfig(timeout_s=1.0, isolation="inline", batch_budget_s=1.5)
    t0 = time.monotonic()
    results = mt.MathVerifier(cfg).score_batch([r"\boxed{2}"] * 6, ["2"] + ["7"] * 5)
    assert time.monotonic() - t0 <= cfg.batch_budget_s + 1.0
    assert results[0].status == "correct"
    assert results[1].status == "timeout" and not results[1].unscored  # its own 1 s limit
    assert [r.unscored for r in results[2:]] == [True] * 4  # cut by, or after, the 1.5 s budget


def test_budget_and_workers_are_validated():
    import pytest

    with pytest.raises(ValueError, match="batch_budget_s must be > 0"):
        mt.MathVerifyConfig(batch_budget_s=0)
    with pytest.raises(ValueError, match="num_workers must be >= 0"):
        mt.MathVerifyConfig(num_workers=-1)
    assert mt.resolve_workers(3) == 3
    assert 1 <= mt.resolve_workers(0) <= mt.MAX_AUTO_WORKERS
    assert mt.MathVerifyConfig().num_workers == 0  # parallel by default
