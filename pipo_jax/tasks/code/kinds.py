"""The test kinds of the code task and how a dataset field becomes them."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Union

from pipo_jax.tasks.code.names import unimported_helpers, unimported_message


@dataclasses.dataclass(frozen=True)
class AssertTest:
    """A Python statement run after the solution, e.g. ``assert f(2) == 4``."""

    source: str


@dataclasses.dataclass(frozen=True)
class CallTest:
    """``fn_name(*args) == expected`` (a ``Solution().fn_name`` method is used if no
    top-level function exists; tuples compare equal to lists, floats to 1e-9, and a
    one-element list ``expected`` also matches its element, as in APPS/TACO).
    ``args`` and ``expected`` must be JSON values."""

    fn_name: str
    args: tuple
    expected: Any


@dataclasses.dataclass(frozen=True)
class IOTest:
    """Run the program with ``stdin``; stdout must equal ``expected_stdout`` up to
    trailing whitespace on each line and trailing blank lines."""

    stdin: str
    expected_stdout: str


Test = Union[AssertTest, CallTest, IOTest]


def tests_from_spec(spec: Any) -> list[Test]:
    """Tests from a dataset field.

    Accepts a list of assert statements (MBPP/HumanEval style), a list of
    ``{"input", "output"}`` dicts, or an APPS/TACO ``input_output`` dict (or its JSON
    string) ``{"inputs": [...], "outputs": [...], "fn_name"?: str}``; with ``fn_name``
    each input is the argument list of a call. Raises ValueError on anything else.
    """
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise ValueError(f"test spec is a string but not JSON: {e}") from e
    if isinstance(spec, dict):
        if "inputs" not in spec or "outputs" not in spec:
            raise ValueError(f"test spec dict needs 'inputs' and 'outputs', got keys {sorted(spec)}")
        ins, outs = spec["inputs"], spec["outputs"]
        if len(ins) != len(outs):
            raise ValueError(f"test spec has {len(ins)} inputs but {len(outs)} outputs")
        if spec.get("fn_name"):
            return [CallTest(spec["fn_name"], tuple(a) if isinstance(a, list) else (a,), o)
                    for a, o in zip(ins, outs, strict=True)]
        return [IOTest(_joined(i), _joined(o)) for i, o in zip(ins, outs, strict=True)]
    if isinstance(spec, list) and spec:
        if all(isinstance(t, str) for t in spec):
            for k, name in unimported_helpers(spec)[:1]:
                raise ValueError(unimported_message(k, name))
            return [AssertTest(t) for t in spec]
        if all(isinstance(t, dict) and "input" in t and "output" in t for t in spec):
            return [IOTest(_joined(t["input"]), _joined(t["output"])) for t in spec]
    raise ValueError(f"unrecognised test spec: {str(spec)[:200]!r}")


def _joined(x: Any) -> str:
    return "\n".join(map(str, x)) + "\n" if isinstance(x, list) else str(x)
