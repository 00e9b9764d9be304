"""The registered tasks: `config.task.name` -> the module that builds it, imported only when chosen.

Each entry names a module of `pipo_jax/tasks/` and its constructor `from_config(run) -> Task`
(`run`: the whole typed run config, `config/sections.py:RunConfig`; it raises `protocol.TaskConfigError`
naming the key, or ValueError, which `run/task_config.py:make_task` reports as `config.task: ...`).
Naming the module instead of importing it keeps this table light: choosing the arithmetic task never
loads the math verifier, the code sandbox or reasoning-gym. A task whose module needs an optional dependency names its
extra (a missing package is one line naming it). Each entry also names the config sections of the
task's own keys, declared in light modules beside the task's code: registering the task pushes its
name and those sections into the config schema (`config/registry.py`; `config.task` is the shared keys
plus one section per name, listed by `--check_config` for the runs of the tasks that read it).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from pipo_jax.config import registry as config_registry
from pipo_jax.tasks.protocol import Task, TaskConfigError, missing_members


@dataclasses.dataclass(frozen=True)
class TaskEntry:
    """name: `config.task.name`; module: where `constructor(config) -> Task` lives; task_classes:
    the classes it returns (their abstract members are checked when the task is chosen);
    extra: the `pip install -e ".[extra]"` its dependencies come with ("": none); settings:
    the config sections of the task's own keys, "module:Class" (a `schema.Section` whose `_section`
    is `task.<field>`, in a module beside the task's that imports only the schema), read as
    `config.task.<field>.<key>`; chat: the "module:Class" of its chat renderer
    (`chat_prompts.ChatPrompts`, built as `Class(task, max_prompt_tokens)`) for a task without a
    tokenizer ("": it has none)."""

    name: str
    module: str
    task_classes: tuple[str, ...]
    constructor: str = "from_config"
    extra: str = ""
    settings: tuple[str, ...] = ()
    chat: str = ""


TASKS: dict[str, TaskEntry] = {}


def register_task(entry: TaskEntry) -> TaskEntry:
    """Adds `entry` (a name may be registered once) and pushes its name and its settings sections (their
    modules imported now: each imports only the schema) into the config schema."""
    if entry.name in TASKS:
        raise ValueError(f"task {entry.name!r} is registered twice")
    if not entry.module.startswith("pipo_jax.tasks."):
        raise ValueError(f"task {entry.name!r}: module {entry.module!r} is not under pipo_jax.tasks")
    sections = [settings_class(path) for path in entry.settings]
    for path, cls in zip(entry.settings, sections):
        section = getattr(cls, "_section", "")
        if not section.startswith("task.") or "." in section[len("task."):]:
            raise ValueError(f"task {entry.name!r}: settings {path} declare _section={section!r}, not task.<name>")
    TASKS[entry.name] = entry
    config_registry.register_names("task", entry.name)
    for cls in sections:
        config_registry.register_section(cls, used_when=("task.name", entry.name))
    return entry


def _named_class(path: str, what: str) -> type:
    """The class "module:Class" names, its module (under pipo_jax.tasks) imported now."""
    module, _, name = path.partition(":")
    if not module.startswith("pipo_jax.tasks."):
        raise ValueError(f"{what} {path!r} are not under pipo_jax.tasks")
    return getattr(importlib.import_module(module), name)


def settings_class(path: str) -> type:
    """The settings section "module:Class" names (its module imported now: it imports only the schema)."""
    return _named_class(path, "settings")


_DATASET = "pipo_jax.tasks.dataset_settings:DatasetSettings"
for _entry in (
    TaskEntry("arithmetic", "pipo_jax.tasks.arithmetic", ("ArithmeticTask",),
              settings=("pipo_jax.tasks.arithmetic_settings:ArithmeticSettings",),
              chat="pipo_jax.tasks.arithmetic_chat:ArithmeticPrompts"),
    TaskEntry("countdown", "pipo_jax.tasks.countdown", ("CountdownTask",)),
    TaskEntry("math", "pipo_jax.tasks.dataset", ("DatasetTask",), "math_from_config",
              settings=(_DATASET, "pipo_jax.tasks.dataset_settings:MathSettings")),
    TaskEntry("code", "pipo_jax.tasks.dataset", ("DatasetTask",), "code_from_config",
              settings=(_DATASET, "pipo_jax.tasks.dataset_settings:CodeSettings")),
    TaskEntry("reasoning_gym", "pipo_jax.tasks.reasoning_gym", ("ReasoningGymTask", "ReasoningGymTextTask"),
              extra="rg", settings=("pipo_jax.tasks.reasoning_gym_settings:ReasoningGymSettings", _DATASET)),
    TaskEntry("digit_sum", "pipo_jax.tasks.digit_sum", ("DigitSumTask",),
              settings=("pipo_jax.tasks.digit_sum_settings:DigitSumSettings",)),
):
    register_task(_entry)


def chat_prompts(task: Task, max_prompt_tokens: int | None = None):
    """The chat renderer (`chat_prompts.ChatPrompts`) the entry of `task.name` names, for `task`;
    `TaskConfigError` (one line) for a task with none."""
    entry = TASKS.get(task.name)
    if entry is None or not entry.chat:
        with_chat = [e.name for e in TASKS.values() if e.chat]
        raise TaskConfigError(f"the {task.name} task has no chat rendering (tasks with one: {', '.join(with_chat)}; "
                              "a text policy's chat uses its tokenizer)")
    return _named_class(entry.chat, "chat renderer")(task, max_prompt_tokens)


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
                              f"pip install -e \".[{entry.extra}]\" ({e})") from e
    for class_name in entry.task_classes:
        check_task_class(getattr(module, class_name), f"task {name!r}: {entry.module}.{class_name}")
    return getattr(module, entry.constructor)
