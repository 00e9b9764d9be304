"""The registered tasks: `config.task.name` -> the module that builds it, imported only when chosen.

Each entry names a module of `pipo_jax/tasks/` and its constructor `from_config(config) -> Task`
(the whole run config; it raises `protocol.TaskConfigError` naming the key, or ValueError, which
`rl/task_config.py:make_task` reports as `config.task: ...`). Naming the module instead of
importing it keeps this table light: choosing the arithmetic task never loads the math verifier,
the code sandbox or reasoning-gym. A task whose module needs an optional dependency names its
extra (a missing package is one line naming it).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from pipo_jax.tasks.protocol import Task, TaskConfigError, missing_members


@dataclasses.dataclass(frozen=True)
class TaskEntry:
    """name: `config.task.name`; module: where `constructor(config) -> Task` lives; task_classes:
    the classes it returns (their abstract members are checked when the task is chosen);
    extra: the `pip install 'pipo_jax[extra]'` its dependencies come with ("": none)."""

    name: str
    module: str
    task_classes: tuple[str, ...]
    constructor: str = "from_config"
    extra: str = ""


TASKS: dict[str, TaskEntry] = {}


def register_task(entry: TaskEntry) -> TaskEntry:
    """Adds `entry` (a name may be registered once)."""
    if entry.name in TASKS:
        raise ValueError(f"task {entry.name!r} is registered twice")
    if not entry.module.startswith("pipo_jax.tasks."):
        raise ValueError(f"task {entry.name!r}: module {entry.module!r} is not under pipo_jax.tasks")
    TASKS[entry.name] = entry
    return entry


for _entry in (
    TaskEntry("arithmetic", "pipo_jax.tasks.arithmetic", ("ArithmeticTask",)),
    TaskEntry("countdown", "pipo_jax.tasks.countdown", ("CountdownTask",)),
    TaskEntry("math", "pipo_jax.tasks.dataset", ("DatasetTask",), "math_from_config"),
    TaskEntry("code", "pipo_jax.tasks.dataset", ("DatasetTask",), "code_from_config"),
    TaskEntry("reasoning_gym", "pipo_jax.tasks.reasoning_gym", ("ReasoningGymTask", "ReasoningGymTextTask"),
              extra="rg"),
):
    register_task(_entry)


def check_task_class(cls: type, what: str) -> None:
    """TypeError unless `cls` is a `Task` subclass implementing every required member."""
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TypeError(f"{what} is not a pipo_jax.tasks.protocol.Task")
    missing = missing_members(cls)
    if missing:
        raise TypeError(f"{what} does not implement {missing}")


def constructor(name: str) -> Callable[..., Task]:
    """The registered constructor of task `name` (its module imported now). Raises
    `TaskConfigError` naming `task.name` for an unknown name, a task class with unimplemented
    members or a missing optional dependency."""
    entry = TASKS.get(name)
    if entry is None:
        raise TaskConfigError(f"config.task.name: {name!r} is not a registered task; expected one of "
                              f"{tuple(TASKS)}")
    try:
        module = importlib.import_module(entry.module)
    except ImportError as e:
        if not entry.extra:
            raise
        raise TaskConfigError(f"config.task.name: task.name={name} needs the optional extra: "
                              f"pip install 'pipo_jax[{entry.extra}]' ({e})") from e
    for class_name in entry.task_classes:
        check_task_class(getattr(module, class_name), f"task {name!r}: {entry.module}.{class_name}")
    return getattr(module, entry.constructor)
