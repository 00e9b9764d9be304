"""The config schema's machinery: a key declared once (type, default, description, constraint).

A section is a frozen dataclass (`config/sections.py`, or a method's or task's settings beside its
code, registered: `config/registry.py`) whose fields are its config keys, each
declared with `key(default, doc, check)`: the field's annotation is the key's type, `default`
its one default, `doc` the description `--check_config` prints, `check` its constraint.
From these declarations alone:

    defaults(cls) -> ml_collections.ConfigDict   what `configs/base.py:base_config` returns
    from_config(cls, mapping) -> cls             the typed section of a config section
    to_config(section) -> dict                   its values again (`from_config(cls, to_config(s)) == s`)
    describe(cls, config) -> [(key, value, doc)] every key a run uses with its value and description

Each takes a section as assembled (`assembled(cls)`): its declared fields and the sections the
learner's registries registered under it (`config/registry.py`), e.g. `config.loss.bapo`.

A section checks itself on construction (`Section.__post_init__`): each field's type, then its
`choices` / `check`, then the section's own `check()` (what ties its fields together). Every error
is one line, `ConfigError("config.<section>.<key>: <message>")`. Nothing here does I/O.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import ml_collections
from ml_collections import config_dict

from pipo_jax.config import registry
from pipo_jax.config.moves import RENAMED, RETIRED

Check = Callable[[Any], "str | None"]  # value -> the error message, or None when it is valid


class ConfigError(ValueError):
    """An invalid run config; the message names the key."""


def need(cond: bool, key: str, message: str) -> None:
    """Raises `ConfigError("config.<key>: <message>")` unless `cond`."""
    if not cond:
        raise ConfigError(f"config.{key}: {message}")


def choice(value, key: str, choices) -> None:
    need(value in choices, key, f"{value!r} is not one of {tuple(choices)}")


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def key(default, doc: str, check: Check | None = None, *, choices: Iterable | Callable[[], Iterable] | None = None):
    """A config key's declaration: `default`, description `doc`, constraint `check` (value ->
    message or None) and / or `choices` (a tuple, or a function returning one: a registry's names).
    A subsection is declared by its class: `key(RolloutConfig, doc)`."""
    meta = {"doc": doc, "check": check, "choices": choices}
    if isinstance(default, type) and issubclass(default, Section):  # a subsection: its defaults, built when used
        return dataclasses.field(default_factory=default, metadata={**meta, "section": default})
    return dataclasses.field(default=default, metadata=meta)


# ----------------------------------------------------------------------------- constraints


def at_least(bound, note: str = "") -> Check:
    """`value >= bound`; message "<value> must be >= <bound><note>"."""
    return lambda v: None if v >= bound else f"{v} must be >= {bound}{note}"


def above(bound, note: str = "") -> Check:
    """`value > bound`."""
    return lambda v: None if v > bound else f"{v} must be > {bound}{note}"


def within(low, high, *, open_low: bool = False, open_high: bool = False) -> Check:
    """`value` in [low, high] (a bound excluded with `open_low` / `open_high`)."""
    text = f"{'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"

    def check(v):
        ok = (v > low if open_low else v >= low) and (v < high if open_high else v <= high)
        return None if ok else f"{v} must be in {text}"
    return check


def choices_of(declared) -> tuple:
    """The choices a `key(..., choices=)` declares (calling a registry function)."""
    return tuple(declared() if callable(declared) else declared)


# ----------------------------------------------------------------------------- sections


@dataclasses.dataclass(frozen=True)
class _Type:
    name: str  # int | float | bool | str | a section class name
    optional: bool  # `X | None`: None is a valid value


def _field_type(f: dataclasses.Field) -> _Type:
    text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    parts = [p.strip() for p in text.split("|")]
    return _Type(next(p for p in parts if p != "None"), "None" in parts)


_TYPE_CHECKS = {
    "int": (is_int, "an integer"),
    "float": (is_number, "a finite number"),
    "bool": (lambda v: isinstance(v, bool), "True or False"),
    "str": (lambda v: isinstance(v, str), "a string"),
}


class Section:
    """Base of a config section (a frozen dataclass of `key(...)` fields). `_section` is the
    section's place in the config ("rollout", "pipo.authors"; "" = the top level)."""

    _section: ClassVar[str] = ""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            check_value(type(self), f, getattr(self, f.name))
        self.check()

    def check(self) -> None:
        """What ties the section's keys together (override); raise with `need`."""

    @classmethod
    def from_config(cls, mapping: Mapping, **resolved):
        """`from_config(cls, mapping, **resolved)`: this section of a config."""
        return from_config(cls, mapping, **resolved)

    @classmethod
    def key_name(cls, name: str) -> str:
        return f"{cls._section}.{name}" if cls._section else name


def check_value(cls, f: dataclasses.Field, value) -> None:
    """One key's type, choices and constraint; raises `ConfigError` naming it."""
    name, kind = cls.key_name(f.name), _field_type(f)
    if value is None and kind.optional:
        return
    if kind.name in _TYPE_CHECKS:
        ok, what = _TYPE_CHECKS[kind.name]
        none = " or None" if kind.optional else ""
        need(ok(value), name, f"{value!r} must be {what}{none}")
    elif not isinstance(value, Section):
        raise ConfigError(f"config.{name}: {value!r} must be a section")
    if f.metadata.get("choices") is not None:
        choice(value, name, choices_of(f.metadata["choices"]))
    if f.metadata.get("check") is not None:
        message = f.metadata["check"](value)
        need(message is None, name, message or "")


def _subsection(f: dataclasses.Field):
    return f.metadata.get("section")


def assembled(cls: type) -> type:
    """`cls` with the sections registered under it (`registry.sections_under(cls._section)`) as further
    fields, and each of its subsections assembled so: a subclass of `cls` (itself when nothing is
    registered below it), one class per registry version (so sections of one version compare equal)."""
    cls = cls.__dict__.get("_assembled_from", cls)  # an assembled class: its declared base
    return _assemble(cls, registry.version())


@functools.cache
def _assemble(cls: type, version: int) -> type:
    fields = []
    for f in dataclasses.fields(cls):
        sub = _subsection(f)
        if sub is not None and assembled(sub) is not sub:
            fields.append((f.name, assembled(sub), key(assembled(sub), f.metadata.get("doc", ""))))
    for name, sub in registry.sections_under(cls._section).items():
        sub = assembled(sub)
        fields.append((name, sub, key(sub, (sub.__doc__ or "").split("\n")[0])))
    if not fields:
        return cls
    return dataclasses.make_dataclass(cls.__name__, fields, bases=(cls,), frozen=True,
                                      namespace={"__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                                 "__doc__": cls.__doc__, "_assembled_from": cls})


def holder_of(tree: dict, dotted: str) -> tuple[dict | None, str]:
    """(the dict of the nested `tree` that holds key `dotted`, the key's last part); None when a part
    above it is missing or not a dict, or the key itself is absent."""
    *parents, leaf = dotted.split(".")
    node = tree
    for p in parents:
        node = node.get(p) if isinstance(node, dict) else None
    return (node if isinstance(node, dict) and leaf in node else None), leaf


def moved_keys(tree: dict) -> dict:
    """A copy of the nested config `tree` with every `RENAMED` key at its new place."""
    out = json_copy(tree)
    for old, new in RENAMED.items():
        node, leaf = holder_of(out, old)
        if node is None:
            continue
        value = node.pop(leaf)
        *new_parents, new_leaf = new.split(".")
        target = out
        for p in new_parents:
            target = target.setdefault(p, {})
        target.setdefault(new_leaf, value)
    return out


def json_copy(tree):
    """A deep copy of nested dicts (leaves shared)."""
    return {k: json_copy(v) for k, v in tree.items()} if isinstance(tree, dict) else tree


def _items(mapping) -> dict:
    return dict(mapping.items()) if hasattr(mapping, "items") else dict(mapping)


def from_config(cls, mapping: Mapping, **resolved):
    """The section `cls` of a config section: each key read into the field of the same name
    (ints where a float is declared become floats; a key the config lacks keeps its default, as in
    a config stored by an older release); `resolved` replaces fields (a value the caller derived).
    An unknown key is a `ConfigError` naming it."""
    cls = assembled(cls)
    items = _items(mapping)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in items:
        if name not in fields:
            full = cls.key_name(name)
            moved = f"moved: set config.{RENAMED[full]}" if full in RENAMED else None
            need(False, full, RETIRED.get(full, moved or f"unknown key; expected one of {tuple(fields)}"))
    values = {}
    for name, f in fields.items():
        if name in resolved:
            values[name] = resolved[name]
        elif name in items:
            sub, value = _subsection(f), items[name]
            if sub is not None:
                need(hasattr(value, "items"), cls.key_name(name), f"{value!r} must be a section")
                value = from_config(sub, value)
            elif _field_type(f).name == "float" and is_int(value):
                value = float(value)
            values[name] = value
    return cls(**values)


def to_config(section: Section) -> dict:
    """The section's keys and values as nested dicts (`from_config` reads them back)."""
    return {f.name: to_config(v) if isinstance(v := getattr(section, f.name), Section) else v
            for f in dataclasses.fields(section)}


_PYTHON_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def defaults(cls) -> ml_collections.ConfigDict:
    """The ml-collections config of `cls`'s defaults. A `X | None` key is a typed reference of
    type X (`FieldReference(default, field_type=X)`), whatever its default: a preset that sets it
    to None keeps the type, so `--config.<key>=value` parses on every preset (a plain None field
    is one ml-collections cannot override)."""
    c = ml_collections.ConfigDict()
    for f in dataclasses.fields(assembled(cls)):
        sub = _subsection(f)
        kind = _field_type(f)
        if sub is not None:
            c[f.name] = defaults(sub)
        elif kind.optional:
            c[f.name] = config_dict.FieldReference(f.default, field_type=_PYTHON_TYPES[kind.name])
        else:
            c[f.name] = f.default
    return c


def doc_of(f: dataclasses.Field) -> str:
    """A key's description, with its choices (read from the registries at call time)."""
    doc = f.metadata.get("doc", "")
    if f.metadata.get("choices") is not None:
        doc += f" [{' | '.join(map(str, choices_of(f.metadata['choices'])))}]"
    return doc


def declarations(cls, prefix: str = "") -> dict[str, dataclasses.Field]:
    """{dotted key: its field} for every key of `cls` and its subsections."""
    out = {}
    for f in dataclasses.fields(assembled(cls)):
        sub = _subsection(f)
        if sub is not None:
            out.update(declarations(sub, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = f
    return out


def type_name(cls, dotted: str) -> str:
    """The declared type of `cls`'s key `dotted` (`int`, `float`, `bool`, `str`), None aside."""
    return _field_type(declarations(cls)[dotted]).name


def read_text(cls, dotted: str, text: str):
    """`text` read as the declared type of `cls`'s key `dotted` (`bool`: true / false); ValueError if it is not one."""
    kind = type_name(cls, dotted)
    if kind == "bool":
        if text.lower() not in ("true", "false"):
            raise ValueError("expected true or false")
        return text.lower() == "true"
    return _PYTHON_TYPES[kind](text)


def closest_keys(cls, dotted: str, n: int = 3) -> list[str]:
    """The declared keys of `cls` closest to the unknown dotted key `dotted`, in full: among its own
    section's keys when it names a section (`pipo.lamb` -> `pipo.lam`), else among every key."""
    keys = list(declarations(cls))
    section, _, leaf = dotted.rpartition(".")
    siblings = [k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == section]
    close = difflib.get_close_matches(leaf, siblings, n=n, cutoff=0.6)
    if close:
        return [f"{section}.{name}" if section else name for name in close]
    return difflib.get_close_matches(dotted, keys, n=n, cutoff=0.6)


def unknown_key(cls, dotted: str, prefix: str = "") -> str | None:
    """None if `dotted` is a key or a section of `cls`; else "unknown key" with the closest declared
    keys in full, each after `prefix` (`did you mean --config.pipo.lam?` for `pipo.lamb`)."""
    keys = declarations(cls)
    if dotted in keys or any(k.startswith(dotted + ".") for k in keys):
        return None
    if dotted in RENAMED:
        return f"moved: set {prefix}{RENAMED[dotted]}"
    if dotted in RETIRED:
        return RETIRED[dotted]
    close = [prefix + k for k in closest_keys(cls, dotted)]
    return "unknown key" + (f"; did you mean {' or '.join(close)}?" if close else "")


def _value(config: Mapping, dotted: str):
    value = config
    for part in dotted.split("."):
        value = value[part]
    return value


def used(section: str, config: Mapping) -> bool:
    """Whether the run of `config` uses the section at dotted `section` and every section above it
    (`registry.uses`: a section with no registered use is every run's)."""
    parts = section.split(".")
    for i in range(1, len(parts) + 1):
        wanted = registry.uses(".".join(parts[:i]))
        if wanted and not any(_value(config, k) in values for k, values in wanted.items()):
            return False
    return True


def describe(cls, config: Mapping) -> list[tuple[str, Any, str]]:
    """(dotted key, value in `config`, description) for every declared key of `cls` that the run of
    `config` uses (`used`: a method's settings only for the runs of that method)."""
    return [(name, _value(config, name), doc_of(f)) for name, f in declarations(cls).items()
            if used(name.rpartition(".")[0], config)]
