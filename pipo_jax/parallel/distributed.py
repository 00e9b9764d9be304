"""Multi-host start-up: `jax.distributed.initialize` from a config node or the environment.

Call `initialize_distributed(run.distributed)` (the typed `config/sections.py:DistributedConfig`)
first thing in the job, before any other JAX call. Where the coordinator, process count and
process id come from, in order:

1. the config: `coordinator_address`, `num_processes`, `process_id`
   (`local_device_ids`, `port` optional);
2. the environment: `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`
   (`JAX_LOCAL_DEVICE_IDS` optional);
3. SLURM (`srun`): `SLURM_NTASKS` > 1 with `SLURM_PROCID`, `SLURM_LOCALID` and
   `SLURM_STEP_NODELIST` (coordinator: the first node, port `config.port`,
   `JAX_COORDINATOR_PORT` or JAX's job-id-derived default);
4. a Cloud TPU pod slice (`TPU_WORKER_HOSTNAMES` lists several hosts): JAX's own
   cluster detection (`jax.distributed.initialize()` with no arguments).

`mode`: "auto" (the default) initialises only when one of these says there are several
processes; "on" always initialises (falling back to JAX's cluster detection); "off"
never does. The CPU client's cross-process collectives are set to
`cpu_collectives` ("gloo") first.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import jax
from jax._src import distributed as jax_distributed  # `_is_initialized`: no public query exists

from pipo_jax.config.sections import DistributedConfig

log = logging.getLogger(__name__)

SLURM_VARS = ("SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NODELIST")


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
    """Arguments for `jax.distributed.initialize`; `source` says where they came from.

    source "tpu": leave everything to JAX's cluster detection (the other fields are None).
    """

    source: str  # "config" | "env" | "slurm" | "tpu" | "jax-auto"
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None


def _device_ids(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None or value == "" or value == ():
        return None
    try:
        if isinstance(value, str):
            return tuple(int(v) for v in value.split(",") if v.strip())
        return tuple(int(v) for v in value)
    except ValueError as e:
        raise ValueError(f"{where}={value!r} must be a comma-separated list of ints") from e


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list: 'gpu[003-005,9],cpu1' -> 'gpu003', 'a1,a2' -> 'a1'."""
    nodelist = nodelist.strip()
    depth = 0
    for i, ch in enumerate(nodelist):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            nodelist = nodelist[:i]
            break
    if not nodelist:
        raise ValueError("SLURM_STEP_NODELIST is empty")
    if "[" not in nodelist:
        return nodelist
    prefix, rest = nodelist.split("[", 1)
    ranges, suffix = rest.split("]", 1) if "]" in rest else (rest, "")
    return prefix + ranges.split(",")[0].split("-")[0] + suffix


def slurm_default_port(job_id: str) -> int:
    """JAX's port for a SLURM job: in the ephemeral range, derived from the job id."""
    return int(job_id) % 2**12 + (65535 - 2**12 + 1)


def _int(value: Any, where: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}={value!r} must be an integer") from e


def _from_config(cfg: DistributedConfig) -> DistributedSettings | None:
    addr, n, pid = cfg.coordinator_address, cfg.num_processes, cfg.process_id
    given = {"coordinator_address": bool(addr), "num_processes": n > 0, "process_id": pid >= 0}
    if not any(given.values()):
        return None
    missing = [k for k, ok in given.items() if not ok]
    if missing:
        raise ValueError(f"config.distributed: {missing} must be set too when any of "
                         f"coordinator_address / num_processes / process_id is set")
    return DistributedSettings("config", addr, n, pid)


def _from_env(env: Mapping[str, str]) -> DistributedSettings | None:
    keys = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
    present = [k for k in keys if env.get(k)]
    if not present or present == ["JAX_COORDINATOR_ADDRESS"] and "SLURM_NTASKS" in env:
        return None  # a bare coordinator address can go with SLURM's process numbering
    missing = [k for k in keys if not env.get(k)]
    if missing:
        raise ValueError(f"environment: {present} set but {missing} missing")
    return DistributedSettings("env", env["JAX_COORDINATOR_ADDRESS"], _int(env["JAX_NUM_PROCESSES"], "JAX_NUM_PROCESSES"),
                               _int(env["JAX_PROCESS_ID"], "JAX_PROCESS_ID"))


def _from_slurm(cfg: DistributedConfig, env: Mapping[str, str]) -> DistributedSettings | None:
    if not all(k in env for k in SLURM_VARS) or _int(env["SLURM_NTASKS"], "SLURM_NTASKS") < 2:
        return None
    addr = env.get("JAX_COORDINATOR_ADDRESS")
    if not addr:
        port = cfg.port or env.get("JAX_COORDINATOR_PORT") or slurm_default_port(
            env.get("SLURM_JOB_ID", "0"))
        addr = f"{first_slurm_host(env['SLURM_STEP_NODELIST'])}:{int(port)}"
    # Several tasks per node that all see every GPU: one GPU each (SLURM_LOCALID). One task
    # per node, or GPUs bound per task by SLURM (one visible), uses every device it sees.
    ntasks = _int(env["SLURM_NTASKS"], "SLURM_NTASKS")
    nodes = _int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1,
                 "SLURM_STEP_NUM_NODES")
    visible = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    local = None
    if ntasks > nodes and len(visible) != 1:
        local = (_int(env["SLURM_LOCALID"], "SLURM_LOCALID"),)
    return DistributedSettings("slurm", addr, ntasks, _int(env["SLURM_PROCID"], "SLURM_PROCID"), local)


def _is_tpu_pod(env: Mapping[str, str]) -> bool:
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    return len(hosts) > 1


def distributed_settings(cfg: DistributedConfig, env: Mapping[str, str] | None = None) -> DistributedSettings | None:
    """What `initialize_distributed` would do with the typed `config.distributed` section `cfg` (None: stay
    single-process). Pure; see the module doc."""
    env = os.environ if env is None else env
    if cfg.mode == "off":
        return None
    settings = _from_config(cfg) or _from_env(env) or _from_slurm(cfg, env)
    if settings is None and _is_tpu_pod(env):
        settings = DistributedSettings("tpu")
    if settings is None and cfg.mode == "on":
        settings = DistributedSettings("jax-auto")
    if settings is None:
        return None
    local = _device_ids(cfg.local_device_ids, "config.distributed.local_device_ids")
    local = local or _device_ids(env.get("JAX_LOCAL_DEVICE_IDS", ""), "JAX_LOCAL_DEVICE_IDS")
    if local is not None:
        settings = dataclasses.replace(settings, local_device_ids=local)
    if settings.num_processes is not None and not 0 <= settings.process_id < settings.num_processes:
        raise ValueError(f"distributed ({settings.source}): process_id={settings.process_id} is not in "
                         f"[0, num_processes={settings.num_processes})")
    return settings


def _is_initialized() -> bool:
    return jax_distributed.global_state.client is not None


def initialize_distributed(cfg: DistributedConfig, env: Mapping[str, str] | None = None) -> DistributedSettings | None:
    """Initialises JAX's multi-controller runtime per `distributed_settings`; returns the settings used.

    Idempotent: a second call (or one after someone else initialised) does nothing. Must
    run before the first JAX computation.
    """
    settings = distributed_settings(cfg, env)
    if settings is None or _is_initialized():
        return settings
    # Only the CPU client reads this; it must be set before the backends start.
    jax.config.update("jax_cpu_collectives_implementation", cfg.cpu_collectives)
    timeout = cfg.initialization_timeout
    if settings.source in ("tpu", "jax-auto"):
        jax.distributed.initialize(local_device_ids=settings.local_device_ids, initialization_timeout=timeout)
    else:
        jax.distributed.initialize(settings.coordinator_address, settings.num_processes, settings.process_id,
                                   local_device_ids=settings.local_device_ids, initialization_timeout=timeout,
                                   cluster_detection_method="deactivate")
    log.info("jax.distributed initialised from %s: process %d of %d, %d local / %d global devices",
             settings.source, jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count())
    return settings
