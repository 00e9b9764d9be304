"""A batch of adversarial math answers is checked in parallel under a batch deadline:
64 answers that each burn their whole time limit finish within about
ceil(64 / workers) x timeout_s + grace_s, and the worker pool is whole afterwards."""

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


def test_64_adversarial_answers_meet_the_batch_deadline_and_the_pool_survives():
    # 1 s per answer leaves honest checks room on a loaded 2-core machine; 8 workers keep the batch short.
    cfg = mt.MathVerifyConfig(timeout_s=1.0, grace_s=0.5, num_workers=8)
    responses = [ADVERSARIAL[i % len(ADVERSARIAL)] for i in range(64)]
    with mt.MathVerifier(cfg) as v:
        v(r"\boxed{\frac{1}{2}}", "0.5")  # starts the workers (not part of the batch's budget)
        pids = [w.proc.pid for w in v._workers]
        t0 = time.monotonic()
        results = v.score_batch(responses, ["7"] * 64)
        elapsed = time.monotonic() - t0
        budget = math.ceil(64 / cfg.num_workers) * cfg.timeout_s + cfg.grace_s
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
