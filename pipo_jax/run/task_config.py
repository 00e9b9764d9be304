"""The task a run config names (`config.task.name`), built by its registered constructor.

`make_task(run)` looks the name up in `pipo_jax/tasks/registry.py:TASKS` (a table of module
paths: only the chosen task's module is imported, so the arithmetic task never loads the math
verifier, the code sandbox or reasoning-gym), checks the task class implements the protocol, and
calls the constructor with the whole typed run config (`RunConfig`). Errors are `ConfigError`s naming the key: an
unknown name lists the registered ones, a missing optional package names its extra.
"""

from __future__ import annotations

from pipo_jax.config.sections import ConfigError, RunConfig
from pipo_jax.tasks import registry
from pipo_jax.tasks.protocol import Task, TaskConfigError, missing_attributes

TASKS = registry.TASKS  # config.task.name -> registry.TaskEntry


def make_task(run: RunConfig) -> Task:
    """The task `run.task.name` names, built from `run`; raises `ConfigError` naming the key."""
    try:
        task = registry.constructor(run.task.name)(run)
    except TaskConfigError as e:
        raise ConfigError(str(e)) from e
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"config.task: {e}") from e
    if not isinstance(task, Task) or missing_attributes(task):
        raise TypeError(f"task {run.task.name!r}: its constructor returned a {type(task).__name__}, not a Task with "
                        f"{missing_attributes(task) or 'the protocol'}")
    return task
