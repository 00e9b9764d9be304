"""Scoring a program against its tests: `run_tests`, `score_code`, `score_code_batch`."""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from pipo_jax.tasks.code.config import SandboxConfig
from pipo_jax.tasks.code.extract import extract_python_code
from pipo_jax.tasks.code.feedback import _clip, _clip_text, _ended_badly
from pipo_jax.tasks.code.kinds import AssertTest, CallTest, IOTest, Test
from pipo_jax.tasks.code.launch import _launch


@dataclasses.dataclass(frozen=True)
class CodeResult:
    """reward = passed / total; outcomes[i] in pass/fail/error/timeout/crash/not_run. `unscored`:
    some tests were not checked because a time budget ran out (they count as not passed)."""

    reward: float
    passed: int
    total: int
    feedback: str
    outcomes: tuple[str, ...]
    unscored: bool = False


def _unchecked(config: SandboxConfig) -> tuple[str, str]:
    return "not_run", (f"not checked: the time budget ran out (response {config.response_budget_s:g} s, "
                       f"batch {config.batch_budget_s:g} s)")


def _run_in_process_tests(code: str, tests: Sequence[Test], config: SandboxConfig, budget: float
                          ) -> tuple[list[tuple[str, str]], tuple[str, str] | None]:
    """Assert/call tests, all in one judge and its runner.

    Returns ((outcome, message) per test, definition failure or None). Record -1 is
    defining the solution; if that fails every test gets its outcome. The judge reports
    the runner's end itself; a judge killed by the deadline during test k gives k that
    outcome, later tests "not_run"; one killed by the `budget` gives k and later tests `_unchecked`.
    """
    if time.monotonic() >= budget:
        return [_unchecked(config)] * len(tests), None
    spec = {"mode": "functions", "code": code, "tests": [_test_record(t) for t in tests],
            "limits": _limits(config, len(tests) + 1)}
    records, _, rc, killed = _launch(spec, config, budget)
    by_index = {r["i"]: (r["outcome"], r["msg"]) for r in records}
    if killed == "budget" and -1 not in by_index:
        return [_unchecked(config)] * len(tests), None
    definition = by_index.get(-1) or _ended_badly(rc, killed, config.timeout_s, config.max_output_bytes)
    if definition[0] != "pass":
        return [definition] * len(tests), definition
    out: list[tuple[str, str]] = []
    for k in range(len(tests)):
        if k in by_index:
            out.append(by_index[k])
        elif killed == "budget":
            out.append(_unchecked(config))
        elif k == len(by_index) - 1:  # the test that was running when the judge stopped
            out.append(_ended_badly(rc, killed, config.timeout_s, config.max_output_bytes))
        else:
            out.append(("not_run", "not run"))
    return out, None


def _run_io_test(code: str, test: IOTest, config: SandboxConfig, budget: float) -> tuple[str, str]:
    if time.monotonic() >= budget:
        return _unchecked(config)
    spec = {"mode": "io", "code": code, "stdin": test.stdin, "limits": _limits(config, 1)}
    records, stdout_bytes, rc, killed = _launch(spec, config, budget)
    if killed == "budget":
        return _unchecked(config)
    if not records:
        return _ended_badly(rc, killed, config.timeout_s, config.max_output_bytes)
    outcome, msg = records[-1]["outcome"], records[-1]["msg"]
    if outcome != "pass":
        return outcome, msg
    stdout = stdout_bytes.decode("utf-8", errors="replace")
    if _normalise_output(stdout) == _normalise_output(test.expected_stdout):
        return "pass", ""
    return "fail", (f"input {_clip(repr(test.stdin))}: expected output {_clip(repr(test.expected_stdout))} "
                    f"but got {_clip(repr(stdout))}")


def _normalise_output(s: str) -> str:
    return "\n".join(line.rstrip() for line in s.strip("\n").split("\n")).rstrip()


def _test_record(t: Test) -> dict:
    if isinstance(t, AssertTest):
        return {"kind": "assert", "source": t.source}
    if isinstance(t, CallTest):
        return {"kind": "call", "fn_name": t.fn_name, "args": list(t.args), "expected": t.expected}
    raise TypeError(f"not a test: {t!r}")


def _limits(config: SandboxConfig, n_slots: int) -> dict:
    return {"timeout_s": config.timeout_s, "startup_s": config.startup_s, "memory": config.memory_mb * 2**20,
            "cpu_s": math.ceil(config.startup_s + config.timeout_s * n_slots) + 1,
            "fsize": config.max_output_bytes, "nofile": config.max_open_files, "nproc": config.max_processes,
            "audit": config.audit_hook}


def _describe(outcome: str, msg: str) -> str:
    if outcome == "fail":
        return f"failed: {msg}"
    if outcome == "error":
        return f"raised {msg}"
    if outcome == "not_run":
        return f"was {msg}"
    return f"{'timed out' if outcome == 'timeout' else 'crashed'} ({msg})"


def run_tests(code: str, tests: Sequence[Test], config: SandboxConfig = SandboxConfig(),
              deadline: float = math.inf) -> CodeResult:
    """Run ``code`` against ``tests`` within ``config.response_budget_s`` (and the monotonic time
    `deadline`, the batch's); never raises for anything the code does."""
    if not tests:
        raise ValueError("run_tests needs at least one test")
    n_io = sum(isinstance(t, IOTest) for t in tests)
    if n_io not in (0, len(tests)):
        raise ValueError("a test list must be all IOTest or all AssertTest/CallTest")
    budget = min(time.monotonic() + config.response_budget_s, deadline)
    definition_failure = None
    if n_io:
        outcomes = [_run_io_test(code, t, config, budget) for t in tests]
    else:
        outcomes, definition_failure = _run_in_process_tests(code, tests, config, budget)
    passed = sum(o == "pass" for o, _ in outcomes)
    if definition_failure is not None:
        feedback = "The solution itself " + _describe(*definition_failure) + " before any test ran."
    else:
        first_bad = next(((k, o) for k, o in enumerate(outcomes) if o[0] != "pass"), None)
        feedback = "All tests passed." if first_bad is None else (
            f"Test {first_bad[0] + 1} " + _describe(*first_bad[1]))
    unscored = any(o == _unchecked(config) for o in outcomes)
    return CodeResult(passed / len(tests), passed, len(tests), _clip_text(feedback), tuple(o for o, _ in outcomes),
                      unscored)


def score_code(response: str, tests: Sequence[Test], config: SandboxConfig = SandboxConfig(),
               deadline: float = math.inf) -> CodeResult:
    """Extract the last ```python block of ``response`` and run it against ``tests``."""
    code = extract_python_code(response)
    if code is None:
        return CodeResult(0.0, 0, len(tests), "No ```python code block found.", ("not_run",) * len(tests))
    return run_tests(code, tests, config, deadline)


def score_code_batch(responses: Sequence[str], tests: Sequence[Sequence[Test]],
                     config: SandboxConfig = SandboxConfig()) -> list[CodeResult]:
    """`score_code` over a batch, ``config.max_workers`` runs at a time, all within
    ``config.batch_budget_s``: what is unchecked then scores 0 (`CodeResult.unscored`)."""
    if len(responses) != len(tests):
        raise ValueError(f"score_code_batch: {len(responses)} responses but {len(tests)} test lists")
    deadline = time.monotonic() + config.batch_budget_s
    if config.max_workers == 1:
        return [score_code(r, t, config, deadline) for r, t in zip(responses, tests, strict=True)]
    with ThreadPoolExecutor(config.max_workers) as pool:
        return list(pool.map(lambda rt: score_code(rt[0], rt[1], config, deadline), zip(responses, tests, strict=True)))
