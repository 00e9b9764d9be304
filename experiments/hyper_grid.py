"""Sweep grids declared the big_vision way: a list of points, each a dict of dotted config keys.

    def get_hyper(h):                      # in a study's config file (experiments/studies/*.py)
        return h.product([h.sweep("pipo.lam", [0.05, 0.1, 0.2, 0.4]),
                          h.sweep("train.lr", [1e-4, 3e-4])])

`sweep(key, values)` is one axis; `product(axes)` every combination (the last axis varying fastest);
`zip(axes)` the i-th values of every axis together (equal lengths); a key set for every point belongs
in the study's `get_config`. A 'config.' prefix on a key (big_vision's spelling) is dropped. On the
command line, `--sweep=pipo.lam=0.05,0.1` is `sweep("pipo.lam", ["0.05", "0.1"])` (values as text, read
as the key's type when set).
"""

from __future__ import annotations

import builtins
import itertools
from collections.abc import Iterable
from typing import Any

Point = dict[str, Any]


def _key(key: str) -> str:
    key = key.strip()
    return key[len("config."):] if key.startswith("config.") else key


def sweep(key: str, values: Iterable[Any]) -> list[Point]:
    """One axis: `[{key: v} for v in values]`; ValueError if `values` is empty."""
    values = list(values)
    if not values:
        raise ValueError(f"sweep {key!r}: no values")
    return [{_key(key): v} for v in values]


def _merge(parts: Iterable[Point]) -> Point:
    out: Point = {}
    for part in parts:
        for k, v in part.items():
            if k in out:
                raise ValueError(f"key {k!r} is set by two axes of one sweep")
            out[k] = v
    return out


def product(axes: list[list[Point]]) -> list[Point]:
    """Every combination of one point from each axis (the last axis varies fastest)."""
    return [_merge(parts) for parts in itertools.product(*axes)]


def zip(axes: list[list[Point]]) -> list[Point]:  # noqa: A001 (big_vision's name)
    """The i-th points of every axis merged; ValueError if the axes differ in length."""
    lengths = [len(a) for a in axes]
    if len(set(lengths)) > 1:
        raise ValueError(f"zip: the axes have different lengths {lengths}")
    return [_merge(parts) for parts in builtins.zip(*axes)]


def parse_axis(text: str) -> list[Point]:
    """'--sweep' text 'pipo.lam=0.05,0.1' -> sweep('pipo.lam', ['0.05', '0.1']); ValueError naming the text."""
    key, sep, values = text.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise ValueError(f"--sweep={text}: expected KEY=VALUE[,VALUE...]")
    return sweep(key, [v.strip() for v in values.split(",")])


def from_flags(texts: list[str], mode: str) -> list[Point]:
    """The grid of the `--sweep` flags: their product (mode 'product') or zip (mode 'zip'); [{}] (one
    point, the base config) when there is none."""
    if mode not in ("product", "zip"):
        raise ValueError(f"--sweep_mode={mode}: expected product or zip")
    axes = [parse_axis(t) for t in texts]
    if not axes:
        return [{}]
    try:
        return product(axes) if mode == "product" else zip(axes)
    except ValueError as e:
        raise ValueError(f"--sweep ({mode}): {e}") from None
