"""Subprocess body of tests/parallel/test_xla_cpu_cache.py (2 simulated CPU devices).

python -m tests.parallel.collective_order_case, with TF_CPP_VMODULE=thunk_executor=6 so that
XLA:CPU logs the thunk graph of each executable it builds.

Compiles one sharded program, an all-gather and beside it (no data between them) a while loop
whose condition is a psum, then serializes and deserializes the executable (what a hit in JAX's
persistent compilation cache does) and runs both. A marker line on stderr precedes each of the
two executables' graphs.
"""

from __future__ import annotations

import functools
import os
import sys

if __name__ == "__main__":  # not when the test imports the markers: its process and children keep their flags
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import serialize_executable  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

FRESH, DESERIALIZED = "== fresh executable", "== deserialized executable"
LOOP_END = 10


def program(mesh: Mesh):
    """`f(x [2n], s [2]) -> (all_gather(x) [2n], s counted up until psum(s) >= LOOP_END [2])`."""

    @jax.jit
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=(P(), P("x")),
                       check_vma=False)
    def f(x, s):
        gathered = jax.lax.all_gather(x, "x", tiled=True)
        counted = jax.lax.while_loop(lambda c: jax.lax.psum(jnp.sum(c), "x") < LOOP_END, lambda c: c + 1, s)
        return gathered, counted

    return f


def main() -> None:
    mesh = Mesh(np.array(jax.devices()), ("x",))
    x, s = jnp.arange(8.0), jnp.zeros((2,), jnp.int32)
    print(FRESH, file=sys.stderr, flush=True)
    fresh = program(mesh).lower(x, s).compile()
    print(DESERIALIZED, file=sys.stderr, flush=True)
    loaded = serialize_executable.deserialize_and_load(*serialize_executable.serialize(fresh))
    for exe in (fresh, loaded):
        gathered, counted = exe(x, s)
        np.testing.assert_array_equal(gathered, x)
        np.testing.assert_array_equal(counted, [LOOP_END // 2] * 2)
    print("ok")


if __name__ == "__main__":
    main()
