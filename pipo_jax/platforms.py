"""The platform a program is built for (not necessarily the host's).

Every backend-dependent choice in the package (attention kernel, fused log-prob
kernel and its block sizes, Pallas interpret mode) takes one of `PLATFORMS` from its
caller: `Qwen3Config.platform` for the model, sampler and trainer, or an explicit
`platform=` argument of a kernel. Nothing reads the host's backend at trace time, so a
program lowered on a CPU host with `jax.jit(...).trace(...).lower(lowering_platforms=
("tpu",))` / `jax.export(..., platforms=("tpu",))` for a config with `platform="tpu"`
is the program a TPU host builds.

`of_devices` names the platform of concrete devices (the trainer's `model.platform =
"auto"` resolves through it at start-up, from the devices of its mesh).

`simulate_cpu_devices` gives a process several XLA:CPU devices (tests, benchmarks, a laptop's
sharded run) with a thread pool that their collectives cannot exhaust.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

PLATFORMS = ("cpu", "cuda", "tpu")

# jax.Device.platform / jax.export platform names -> ours.
_ALIASES = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda", "tpu": "tpu"}


def check(platform: str, what: str = "platform") -> str:
    """`platform` if it is one of `PLATFORMS`; a ValueError naming `what` otherwise."""
    if platform not in PLATFORMS:
        raise ValueError(f"{what}={platform!r}; expected one of {PLATFORMS}")
    return platform


def of_devices(devices: Sequence) -> str:
    """The platform of `devices` (all must share one), e.g. `of_devices(mesh.devices.flat)`."""
    names = {d.platform for d in devices}
    if len(names) != 1:
        raise ValueError(f"devices span several platforms {sorted(names)}")
    name = names.pop()
    if name not in _ALIASES:
        raise ValueError(f"device platform {name!r} is not supported; expected one of {sorted(_ALIASES)}")
    return _ALIASES[name]


CPU_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
# XLA:CPU runs each device of a multi-device program as a task of one client thread pool, and a task
# blocks its thread at every collective's rendezvous until all the devices of the group arrive. The
# pool's default size is about one thread per device, so two such programs in flight together (the
# next one dispatched before the last finished) can hold every thread with devices of one program
# while the others' devices wait for a thread: a deadlock that XLA aborts after its collective
# timeout. Four threads a device leave room for a few programs in flight (an idle thread costs
# nothing; tests/parallel/test_pipelined_programs.py dispatches 8-device programs back to back).
CPU_POOL_THREADS_PER_DEVICE = 4


def simulated_cpu_devices_env(n: int, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to set in `environ` for `n` simulated XLA:CPU devices: XLA_FLAGS with the device
    count (replacing one given before) and `PJRT_NPROC`, the client pool's size (at least
    `CPU_POOL_THREADS_PER_DEVICE * n`; a larger value in `environ` is kept)."""
    flags = [f for f in environ.get("XLA_FLAGS", "").split() if not f.startswith(CPU_DEVICE_COUNT_FLAG)]
    threads = max(int(environ.get("PJRT_NPROC") or 0), CPU_POOL_THREADS_PER_DEVICE * n)
    return {"XLA_FLAGS": " ".join([*flags, f"{CPU_DEVICE_COUNT_FLAG}={n}"]), "PJRT_NPROC": str(threads)}


def simulate_cpu_devices(n: int) -> None:
    """Makes this process's XLA:CPU client start with `n` devices (`simulated_cpu_devices_env`);
    call it before JAX initialises its backends (before the first array or device query)."""
    os.environ.update(simulated_cpu_devices_env(n, os.environ))


def requested_cpu_devices(environ: Mapping[str, str], default: int = 1) -> int:
    """The simulated CPU device count that `environ`'s XLA_FLAGS asks for (`default` if none)."""
    counts = [f.split("=", 1)[1] for f in environ.get("XLA_FLAGS", "").split() if f.startswith(CPU_DEVICE_COUNT_FLAG + "=")]
    return int(counts[-1]) if counts else default
