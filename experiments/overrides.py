"""Dotted config keys set from text ('pipo.lam=0.2'), each value read as the key's current type:
what `--set`, `--variant` and sweep points apply to a config."""

from __future__ import annotations

from typing import Any

import ml_collections

from pipo_jax.config import schema
from pipo_jax.config.moves import RENAMED
from pipo_jax.config.sections import RunConfig


def set_key(c: ml_collections.ConfigDict, assignment: str) -> None:
    """Applies 'KEY=VALUE' (dotted key) to `c`, VALUE read as the key's current type;
    ValueError naming the key."""
    key, sep, text = assignment.partition("=")
    if not sep:
        raise ValueError(f"{assignment!r}: expected KEY=VALUE")
    *parents, leaf = key.strip().split(".")
    node = c
    for part in parents:
        if part not in node or not isinstance(node[part], ml_collections.ConfigDict):
            raise ValueError(f"{assignment!r}: config has no section {part!r}")
        node = node[part]
    if leaf not in node:
        if key.strip() in RENAMED:  # a key a release moved: its new place, in one line
            raise ValueError(f"{assignment!r}: {key.strip()} moved: set {RENAMED[key.strip()]}")
        close = schema.closest_keys(RunConfig, key.strip())
        raise ValueError(f"{assignment!r}: config has no key {key!r}"
                         + (f"; did you mean {' or '.join(close)}?" if close else ""))
    old = node[leaf]
    try:
        if isinstance(old, bool):
            if text.lower() not in ("true", "false"):
                raise ValueError("expected true or false")
            value = text.lower() == "true"
        elif isinstance(old, int):
            value = int(text)
        elif isinstance(old, float):
            value = float(text)
        elif old is None:  # an unset `X | None` key: its declared type X
            value = None if text.lower() in ("none", "") else schema.read_text(RunConfig, key.strip(), text)
        else:
            value = text
    except ValueError as e:
        what = type(old).__name__ if old is not None else schema.type_name(RunConfig, key.strip())
        raise ValueError(f"{assignment!r}: {key} is a {what}: {e}") from e
    node[leaf] = value


def with_overrides(config: ml_collections.ConfigDict, overrides: dict[str, Any]) -> ml_collections.ConfigDict:
    """A copy of `config` with dotted keys set, each value read as its key's type (`set_key`)."""
    c = config.copy_and_resolve_references()
    for key, value in overrides.items():
        set_key(c, f"{key}={value}")
    return c
