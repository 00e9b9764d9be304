"""What the learner's registries push into the schema: their names and their settings sections.

The schema imports no learner module. Each registry announces itself instead, when its module is
imported: `rl/algorithms.py` its algorithms, estimators, policy losses and attributions (and the
settings section of each method that has one), `tasks/registry.py` its tasks and their settings,
`models/` its attention kernels and layer forms, `sampling/generator.py` its engines, `losses/`
their modes. A key whose choices are registered names declares `choices=registered(kind)`: the
value is checked against the names registered when the config is validated.

    register_names(kind, *names)             names of one kind (e.g. "algorithm": "grpo", "ppo")
    names(kind) -> tuple                     what is registered of `kind` (RuntimeError: nothing)
    register_section(cls, used_when=)        a settings section at `cls._section` ("loss.bapo"),
                                             a field of its parent section in the run config
    register_use(section, key, value)        `section` is used by a run whose `key` is `value`
                                             (`--check_config` lists only the sections a run uses)

Nothing here imports the package; `configs/base.py` imports every registering module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

_NAMES: dict[str, dict[str, None]] = {}
_SECTIONS: dict[str, type] = {}
_USES: dict[str, dict[str, list[str]]] = {}
_VERSION = [0]  # bumped by each new section or use: an assembled run config of an older version is rebuilt


def register_names(kind: str, *names: str) -> None:
    """Adds `names` to the registered names of `kind` (a name registered again is kept once)."""
    table = _NAMES.setdefault(kind, {})
    for name in names:
        table[name] = None


def names(kind: str) -> tuple[str, ...]:
    """The registered names of `kind`, in registration order."""
    if kind not in _NAMES:
        raise RuntimeError(f"no {kind} is registered: import the module that registers them first "
                           "(configs/base.py imports every registering module)")
    return tuple(_NAMES[kind])


def registered(kind: str) -> Callable[[], tuple[str, ...]]:
    """A key's `choices=`: the names of `kind` registered when the key is checked."""
    return lambda: names(kind)


def register_section(cls: type, used_when: tuple[str, str] | None = None) -> type:
    """Adds the settings section `cls` at `cls._section` ("<parent>.<name>": the field `<name>` of the
    section at `<parent>`); `used_when=(key, value)`: a run uses it when `config.<key>` is `value`."""
    path = getattr(cls, "_section", "")
    if "." not in path:
        raise ValueError(f"settings section {cls.__name__}: _section={path!r} is not <parent>.<name>")
    if _SECTIONS.setdefault(path, cls) is not cls:
        raise ValueError(f"config.{path} is declared by two settings sections: {_SECTIONS[path].__name__} and "
                         f"{cls.__name__}")
    _VERSION[0] += 1
    if used_when is not None:
        register_use(path, *used_when)
    return cls


def register_use(section: str, key: str, value: str) -> None:
    """A run uses the section at `section` when `config.<key>` is `value` (values of one key add up)."""
    values = _USES.setdefault(section, {}).setdefault(key, [])
    if value not in values:
        values.append(value)
        _VERSION[0] += 1


def sections() -> dict[str, type]:
    """{dotted place: section class} of every registered settings section."""
    return dict(_SECTIONS)


def sections_under(parent: str) -> dict[str, type]:
    """{field name: section class} of the sections registered under the section at `parent`."""
    return {path[len(parent) + 1:]: cls for path, cls in _SECTIONS.items()
            if path.rpartition(".")[0] == parent}


def uses(section: str) -> Mapping[str, list[str]]:
    """{key: values} of the runs that use the section at `section`; {}: every run uses it."""
    return _USES.get(section, {})


def version() -> int:
    return _VERSION[0]
