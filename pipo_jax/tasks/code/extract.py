"""The program of a response: its last ```python block."""
from __future__ import annotations

import re


_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


def extract_python_code(text: str) -> str | None:
    """Code of the last ```python (or ```py / ```python3) block; else the last
    unlabelled ``` block; None if there is none. An unclosed final block (truncated
    response) runs to the end of the text."""
    python_blocks, plain_blocks = [], []
    for m in _FENCE_RE.finditer(text):
        lang = m.group(1).lower()
        if lang in ("python", "py", "python3"):
            python_blocks.append(m.group(2))
        elif lang == "":
            plain_blocks.append(m.group(2))
    blocks = python_blocks or plain_blocks
    if not blocks or not blocks[-1].strip():
        return None
    return blocks[-1]
