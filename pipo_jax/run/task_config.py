"""The task a run config names (`config.task.name`), built by its registered constructor.

`make_task(config)` looks the name up in `pipo_jax/tasks/registry.py:TASKS` (a table of module
paths: only the chosen task's module is imported, so the arithmetic task never loads the math
verifier, the code sandbox or reasoning-gym), checks the task class implements the protocol, and
calls the constructor with the whole run config. Errors are `ConfigError`s naming the key: an
unknown name lists the registered ones, a missing optional package names its extra.
"""

from __future__ import annotations

import ml_collections

from pipo_jax.config.sections import ConfigError
from pipo_jax.tasks import registry
from pipo_jax.tasks.protocol import Task, TaskConfigError, missing_attributes

TASKS = registry.TASKS  # config.task.name -> registry.TaskEntry


def make_task(c: ml_collections.ConfigDict) -> Task:
    """The task `c.task.name` names, built from `c`; raises `ConfigError` naming the key."""
    try:
        task = registry.constructor(c.task.name)(c)
    except TaskConfigError as e:
        raise ConfigError(str(e)) from e
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"config.task: {e}") from e
    if not isinstance(task, Task) or missing_attributes(task):
        raise TypeError(f"task {c.task.name!r}: its constructor returned a {type(task).__name__}, not a Task with "
                        f"{missing_attributes(task) or 'the protocol'}")
    return task
