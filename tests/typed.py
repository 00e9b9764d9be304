"""The tests' entry-point parse: an ml-collections config `c` read once into the typed `RunConfig`
(`RunConfig.from_config(c)`, as experiments/train.py does), then handed to the package functions, which
take typed sections only."""

from typing import Any

from pipo_jax.config.sections import RunConfig
from pipo_jax.rl.spec import TrainSpec
from pipo_jax.run.setup import train_spec
from pipo_jax.run.task_config import make_task
from pipo_jax.run.trainer import train
from pipo_jax.tasks.protocol import Task


def spec_of(c) -> TrainSpec:
    """`run.setup.train_spec` of config `c`."""
    return train_spec(RunConfig.from_config(c))


def task_of(c) -> Task:
    """`run.task_config.make_task` of config `c`."""
    return make_task(RunConfig.from_config(c))


def train_config(c, workdir: str) -> dict[str, Any]:
    """`run.trainer.train` of config `c` in `workdir`."""
    return train(RunConfig.from_config(c), workdir)
