"""Subprocess body of tests/parallel/test_pipelined_programs.py (python -m
tests.parallel.pipelined_programs_case N): 8 simulated CPU devices set up as every sharded process
of the project sets them (`platforms.simulate_cpu_devices`), then N executions of one program with
an all-reduce over device pairs and a collective-permute over all 8 devices, each dispatched before
the last finished (up to N in flight together). Prints `ok` once all are done and right.

With XLA:CPU's default pool (about a thread per device) this deadlocked at the first iterations in
every try on the 2-core machine (PJRT_NPROC=8: aborted at XLA's collective timeout; 16: passed).
"""

from __future__ import annotations

import functools
import sys

from pipo_jax import platforms  # imports no jax: the devices are set before JAX starts

platforms.simulate_cpu_devices(8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

STEPS = 20  # collective pairs per execution


def program(mesh: Mesh):
    """`f(x [4 a, 2 b]) -> x` after STEPS of `psum over b / 2 + ppermute one step along a`, which keeps
    an all-ones `x` all ones."""

    @jax.jit
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=P("a", "b"), out_specs=P("a", "b"))
    def f(x):
        for _ in range(STEPS):
            x = jax.lax.psum(x, "b") * 0.25 + jax.lax.ppermute(x, "a", [(i, (i + 1) % 4) for i in range(4)]) * 0.5
        return x

    return f


def main(n: int) -> None:
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b"))
    f = program(mesh)
    x = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P("a", "b")))
    outs = [f(x) for _ in range(n)]  # no wait between dispatches
    for out in outs:
        np.testing.assert_array_equal(np.asarray(out), np.ones((8, 8)))
    print("ok")


if __name__ == "__main__":
    main(int(sys.argv[1]))
