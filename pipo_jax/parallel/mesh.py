"""The device mesh: axes (`data`, `fsdp`, `tensor`), sizes from a config, `-1` fills the rest.

`data` replicates the model and splits the batch, `fsdp` splits the batch *and* the
parameters / optimizer state (ZeRO-3 style: weights are all-gathered per use), `tensor`
splits heads, MLP and vocabulary (Megatron style). Devices are laid out row-major, so
`tensor` varies fastest: with devices ordered by process (as `jax.devices()` gives them)
the tensor axis stays inside one host and `data` spans hosts. `dcn_data` / `dcn_fsdp`
name how many of those ways cross the slow network (slices or hosts); with either > 1
the mesh is built by `mesh_utils.create_hybrid_device_mesh`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh

from pipo_jax.config.sections import MeshConfig

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the mesh axes the batch is split over


def resolve_sizes(spec: MeshConfig, num_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) of the requested sizes `spec` (`-1`: whatever is left of the devices; at most one
    -1) whose product is `num_devices`; raises naming the bad field."""
    sizes = {"data": spec.data, "fsdp": spec.fsdp, "tensor": spec.tensor}
    for name, n in sizes.items():
        if n != -1 and n < 1:
            raise ValueError(f"config.mesh.{name}={n} must be >= 1 or -1 (fill)")
    fills = [k for k, n in sizes.items() if n == -1]
    if len(fills) > 1:
        raise ValueError(f"config.mesh: only one of data/fsdp/tensor may be -1, got {fills}")
    fixed = math.prod(n for n in sizes.values() if n != -1)
    if fills:
        if num_devices % fixed:
            raise ValueError(f"config.mesh: {num_devices} devices are not divisible by "
                             f"{' x '.join(f'{k}={n}' for k, n in sizes.items() if n != -1)} = {fixed}")
        sizes[fills[0]] = num_devices // fixed
    elif fixed != num_devices:
        raise ValueError(f"config.mesh: data x fsdp x tensor = {sizes['data']} x {sizes['fsdp']} x {sizes['tensor']} "
                         f"= {fixed}, but there are {num_devices} devices")
    for name in ("data", "fsdp"):
        dcn = getattr(spec, f"dcn_{name}")
        if dcn < 1 or sizes[name] % dcn:
            raise ValueError(f"config.mesh.dcn_{name}={dcn} must be >= 1 and divide mesh.{name}={sizes[name]}")
    return sizes["data"], sizes["fsdp"], sizes["tensor"]


def make_mesh(data: int, fsdp: int = 1, tensor: int = 1, *, dcn_data: int = 1, dcn_fsdp: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A `Mesh` with axes `AXES` over `devices` (default: all devices of all processes), sizes as
    `resolve_sizes` reads them (the run's are `config.mesh`'s: `mesh_from_config`)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_sizes(MeshConfig(data=data, fsdp=fsdp, tensor=tensor, dcn_data=dcn_data, dcn_fsdp=dcn_fsdp),
                          len(devices))
    if dcn_data > 1 or dcn_fsdp > 1:
        dcn = (dcn_data, dcn_fsdp, 1)
        ici = tuple(s // d for s, d in zip(shape, dcn))
        # TPU slices are the granules of a multi-slice job; elsewhere each host (process) is one.
        by_process = devices[0].platform != "tpu"
        grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=by_process)
    elif devices[0].platform == "tpu":
        grid = mesh_utils.create_device_mesh(shape, devices)  # follows the physical ICI torus
    else:
        grid = np.asarray(devices, dtype=object).reshape(shape)
    return Mesh(grid, AXES)


def mesh_from_config(cfg: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The mesh of the typed `config.mesh` section (its sizes data, fsdp, tensor, dcn_data, dcn_fsdp)."""
    return make_mesh(cfg.data, cfg.fsdp, cfg.tensor, dcn_data=cfg.dcn_data, dcn_fsdp=cfg.dcn_fsdp, devices=devices)


def mesh_sizes(mesh: Mesh) -> dict[str, int]:
    """{axis name: size} of `mesh`."""
    return dict(mesh.shape)


def describe(mesh: Mesh) -> str:
    """'data=2 fsdp=2 tensor=2 (8 devices, 1 process)'."""
    sizes = " ".join(f"{k}={v}" for k, v in mesh_sizes(mesh).items())
    procs = len({d.process_index for d in mesh.devices.flat})
    return f"{sizes} ({mesh.devices.size} devices, {procs} process{'es' if procs > 1 else ''})"
