"""The main job: supervised warm-up (built-in task) + RL with PIPO, progress, plots, checkpoints.

    python -m experiments.train --config=configs/grpo.py:tiny --config.pipo.enabled=true --workdir=runs/tiny

Any config key can be overridden: `--config.pipo.lam=0.2 --config.iterations=100`.
"""

from __future__ import annotations

import json
import logging
import os

from absl import flags
from ml_collections import config_flags

from experiments import cli
from pipo_jax import platforms
from pipo_jax.config import schema
from pipo_jax.config.sections import RunConfig
from pipo_jax.run.setup import train_spec
from pipo_jax.run.trainer import train

_CONFIG = config_flags.DEFINE_config_file("config", "configs/grpo.py:tiny", "run config file:preset")
_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "output directory (metrics, plots, checkpoints)")
_CHECK = flags.DEFINE_bool("check_config", False,
                            "validate the config, print each key (`key = value  # description`) and exit")


def check_config_listing(config) -> str:
    """One line per key: `key = value  # description` (the value as JSON; the description and
    choices from its declaration in `pipo_jax/config/sections.py`)."""
    return "\n".join(f"{name} = {json.dumps(value)}  # {doc}"
                     for name, value, doc in schema.describe(RunConfig, config))


def main(argv):
    del argv
    devices = platforms.requested_cpu_devices(os.environ)
    if devices > 1:  # simulated CPU devices (docs/scaling.md): the thread pool their collectives need
        platforms.simulate_cpu_devices(devices)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    run = RunConfig.from_config(_CONFIG.value)  # the one parse: below it, only typed sections are read
    if _CHECK.value:
        train_spec(run)
        print(check_config_listing(_CONFIG.value))
        return
    if not _WORKDIR.value.strip():
        raise cli.UsageError("--workdir: empty; give the run's output directory")
    summary = train(run, _WORKDIR.value)
    print(f"\nworkdir: {summary['workdir']}")
    if "initial_accuracy" in summary:
        print(f"held-out accuracy: {summary['initial_accuracy']:.3f} (base model) -> {summary['final_accuracy']:.3f}")
    else:
        print(f"held-out accuracy: {summary['final_accuracy']:.3f} (resumed from iteration {summary['resumed_from']})")
    for path in summary["plots"]:
        print(f"plot: {path}")


if __name__ == "__main__":
    cli.run(main)
