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
"""

from __future__ import annotations

from collections.abc import Sequence

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
