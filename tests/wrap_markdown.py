"""Rewraps the paragraphs and list items of markdown pages that have a line over 120 columns:

    python -m tests.wrap_markdown ARCHITECTURE.md [more pages]

Headings, tables, fenced code, HTML comments and paragraphs already under the width are left as they are; a code
span is never split across lines (`tests/test_docs.py` reads code spans line by line). A word longer than the width
keeps a line of its own.
"""

from __future__ import annotations

import pathlib
import re
import sys

WIDTH = 120
_WORD = re.compile(r"(?:`[^`\n]*`|[^\s`])+")  # a run of non-space characters, a code span counting as one
_ITEM = re.compile(r"(\s*)(?:[-*+]|\d+\.) ")  # a list item's marker and its indent


def _verbatim(line: str) -> bool:
    """A line kept as it is: blank, a heading, a table row or an HTML comment."""
    s = line.strip()
    return not s or s.startswith(("#", "|", "<!--"))


def _starts_unit(line: str) -> bool:
    """A list item or a bold lead-in (`**name**: ...`) starts its own paragraph-like unit."""
    return bool(_ITEM.match(line)) or line.startswith("**")


def _fill(lines: list[str], width: int) -> list[str]:
    """One unit (its first line sets the indent of the rest) filled to `width` columns."""
    first = lines[0]
    item = _ITEM.match(first)
    lead = item.group(0) if item else re.match(r"\s*", first).group(0)
    rest_indent = " " * len(lead)
    words = _WORD.findall(" ".join(line.strip() for line in lines)[len(lead.strip()):] if item
                          else " ".join(line.strip() for line in lines))
    out, line = [], lead
    for word in words:
        if line.strip() and len(line) + 1 + len(word) > width:
            out.append(line)
            line = rest_indent + word
        else:
            line += ("" if line == lead or not line.strip() else " ") + word
    out.append(line)
    return out


def wrap(text: str, width: int = WIDTH) -> str:
    """`text` with each unit that has a line over `width` columns refilled; everything else as it was."""
    out: list[str] = []
    unit: list[str] = []

    def flush() -> None:
        if unit:
            out.extend(_fill(unit, width) if max(map(len, unit)) > width else unit)
            unit.clear()

    fenced = False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            flush()
            fenced = not fenced
            out.append(line)
        elif fenced or _verbatim(line):
            flush()
            out.append(line)
        else:
            if _starts_unit(line):
                flush()
            unit.append(line)
    flush()
    return "\n".join(out)


def long_lines(text: str, width: int = WIDTH) -> list[int]:
    """Line numbers over `width` columns outside fenced code, tables and HTML comments."""
    found, fenced = [], False
    for n, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and not _verbatim(line) and len(line) > width:
            found.append(n)
    return found


def main(paths: list[str]) -> int:
    for path in map(pathlib.Path, paths):
        text = path.read_text()
        new = wrap(text)
        if new != text:
            path.write_text(new)
        print(f"{path}: {'rewrapped' if new != text else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
