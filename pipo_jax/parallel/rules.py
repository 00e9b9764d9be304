"""One table from logical axis names to mesh axes, and the PartitionSpec of an array from it.

Parameters carry logical names (`qwen3.param_axes`: `embed`, `vocab`, `heads`,
`kv_heads`, `head_dim`, `mlp`, `layers`); activations and data use `batch`, `length`,
`hidden` (the model dimension of activations, kept whole), `cache_length` and `window`.
A rule maps a name to one mesh axis, a tuple of mesh axes (split over their product) or
None (replicated).

A dimension that a rule would split but whose size is not divisible by the mesh axes
falls back to the longest prefix of those axes that divides it (possibly none:
replicated). Each fallback is logged once, so tiny models run on any mesh and large ones
show where they are not sharded as asked.
"""

from __future__ import annotations

import functools
import logging
import math
from types import MappingProxyType
from typing import Any
from collections.abc import Mapping, Sequence

from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pipo_jax.parallel.mesh import AXES, BATCH_AXES

log = logging.getLogger(__name__)

MeshAxes = str | tuple[str, ...] | None
Rules = Mapping[str, MeshAxes]

DEFAULT_RULES: Rules = MappingProxyType({
    # parameters
    "embed": "fsdp",
    "vocab": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "head_dim": None,
    "layers": None,
    # activations, data, caches
    "batch": BATCH_AXES,
    "length": None,
    "hidden": None,
    "cache_length": None,
    "window": None,
})


def _as_axes(value: Any, name: str) -> MeshAxes:
    if value is None or value == "" or value == "none" or value == ():
        return None
    if isinstance(value, str):
        axes = tuple(a for a in value.replace("+", ",").split(",") if a)
    else:
        axes = tuple(value)
    for a in axes:
        if a not in AXES:
            raise ValueError(f"sharding rule {name}={value!r}: {a!r} is not a mesh axis {AXES}")
    if len(set(axes)) != len(axes):
        raise ValueError(f"sharding rule {name}={value!r} repeats a mesh axis")
    return axes[0] if len(axes) == 1 else axes


def parse_rules(text: str) -> dict[str, MeshAxes]:
    """'embed=fsdp;batch=data+fsdp;mlp=none' -> {"embed": "fsdp", "batch": ("data", "fsdp"), "mlp": None}."""
    out = {}
    for i, item in enumerate(p.strip() for p in text.split(";")):
        if not item:
            continue
        if "=" not in item:
            raise ValueError(f"sharding rules {text!r}: entry {i} {item!r} is not name=axes")
        name, value = (x.strip() for x in item.split("=", 1))
        out[name] = value
    return out


def make_rules(overrides: Mapping[str, Any] | str | None = None) -> Rules:
    """`DEFAULT_RULES` with `overrides` (a mapping or a `parse_rules` string) applied and validated."""
    if isinstance(overrides, str):
        overrides = parse_rules(overrides)
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(DEFAULT_RULES))
    if unknown:
        raise ValueError(f"sharding rules name unknown logical axes {unknown}; known: {sorted(DEFAULT_RULES)}")
    merged = {k: _as_axes(overrides.get(k, v), k) for k, v in DEFAULT_RULES.items()}
    return MappingProxyType(merged)


def without_axis(rules: Rules, mesh_axis: str) -> Rules:
    """`rules` with `mesh_axis` left out of every rule (what it split is then replicated over it)."""
    return make_rules({name: tuple(a for a in _mesh_axes_tuple(axes) if a != mesh_axis)
                       for name, axes in rules.items()})


def rules_key(rules: Rules | None) -> tuple:
    """A hashable form of `rules` (for caches of jitted functions)."""
    return tuple(sorted(make_rules(None if rules is None else dict(rules)).items()))


@functools.cache
def _log_fallback(name: str, size: int, wanted: tuple, kept: tuple) -> None:
    log.warning("sharding: dim %r of size %d is not divisible by mesh axes %s; split over %s instead",
                name, size, wanted, kept or "nothing (replicated)")


def _mesh_axes_tuple(value: MeshAxes) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def spec_for(logical_axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
             rules: Rules | None = None) -> PartitionSpec:
    """PartitionSpec of an array of `shape` whose dims carry `logical_axes` (None = replicated dim).

    Mesh axes already used by an earlier dim, and trailing axes that do not divide the
    dim, are dropped (logged once).
    """
    rules = DEFAULT_RULES if rules is None else rules
    if len(logical_axes) != len(shape):
        raise ValueError(f"logical axes {tuple(logical_axes)} do not match the array rank of shape {tuple(shape)}")
    sizes = dict(mesh.shape)
    used: set[str] = set()
    out = []
    for name, size in zip(logical_axes, shape):
        if name is None:
            out.append(None)
            continue
        if name not in rules:
            raise ValueError(f"logical axis {name!r} has no sharding rule; known: {sorted(rules)}")
        wanted = tuple(a for a in _mesh_axes_tuple(rules[name]) if a not in used)
        kept: tuple[str, ...] = ()
        for a in wanted:
            if size % (math.prod(sizes[x] for x in kept) * sizes[a]):
                break
            kept += (a,)
        if kept != wanted:
            _log_fallback(name, int(size), wanted, kept)
        # Size-1 mesh axes split nothing; leaving them out keeps the specs readable.
        kept = tuple(a for a in kept if sizes[a] > 1)
        used.update(kept)
        out.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return PartitionSpec(*out)


def named_sharding(mesh: Mesh, logical_axes: Sequence[str | None], shape: Sequence[int],
                   rules: Rules | None = None) -> NamedSharding:
    """`NamedSharding(mesh, spec_for(...))`."""
    return NamedSharding(mesh, spec_for(logical_axes, shape, mesh, rules))


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated over `mesh`."""
    return NamedSharding(mesh, PartitionSpec())
