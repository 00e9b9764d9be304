"""Prints `LONG_FILES` for tests/conftest.py from the seconds per file of the last whole-suite run in this
checkout (its `FileSeconds` plugin stores them in the pytest cache):

    python -m pytest -q -n 2 tests    # in a fresh clone (a cold compilation cache, as CI)
    python -m tests.long_files        # the dict to paste over `LONG_FILES` in tests/conftest.py

`LONG_FILES` orders a fresh clone's files (longest first) and keeps its files out of the `quick` tier.
"""

from __future__ import annotations

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
FILE_SECONDS = ROOT / ".pytest_cache" / "v" / "pipo_jax" / "file_seconds"  # conftest.FILE_SECONDS_KEY's file
LONG_S = 10.0  # a file over this many seconds is long


def long_files(seconds: dict[str, float], long_s: float = LONG_S) -> dict[str, int]:
    """The files over `long_s` seconds, longest first, their seconds rounded."""
    return {f: round(s) for f, s in sorted(seconds.items(), key=lambda kv: -kv[1]) if s > long_s}


def as_python(files: dict[str, int], width: int = 120) -> str:
    """`LONG_FILES = {...}` as tests/conftest.py writes it, lines under `width` columns."""
    lines, line = ["LONG_FILES = {"], "   "
    for f, s in files.items():
        item = f' "{f}": {s},'
        if len(line) + len(item) > width:
            lines.append(line)
            line = "   "
        line += item
    return "\n".join(lines + [line, "}"])


def main() -> int:
    if not FILE_SECONDS.exists():
        print(f"no {FILE_SECONDS.relative_to(ROOT)}: run the whole suite first (python -m pytest -q -n 2 tests)",
              file=sys.stderr)
        return 2
    print(as_python(long_files(json.loads(FILE_SECONDS.read_text()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
