"""XLA flags of the test processes, and the environment of the JAX subprocesses they start.

Most of the suite's time is XLA:CPU compiling many small programs. LLVM's optimisation level 0
compiles them about a third faster (two trainer test files, cold: 33 s -> 23 s on the 2-core
machine) and runs these tiny programs about as fast. XLA:CPU's classic elemental emitters
(`--xla_cpu_use_fusion_emitters=false`) compile them in about half the CPU time of its MLIR
fusion emitters (the micro GRPO + PIPO trainer's two-iteration program: 10.8 s -> 5.4 s and
17.1 s -> 9.1 s in two tries on the 2-core machine), and run them about as fast. One LLVM module a
program (`--xla_cpu_parallel_codegen_split_count=1`) skips splitting it for parallel code generation,
which these small programs do not gain from while the other test worker holds the second core
(`rl/test_trainer.py` and `rl/test_algorithms.py`, cold, one process: 202 s -> 185 s of CPU). None changes
floating-point semantics the tests rely on (no fast-math either way; results may differ in the last
bits, e.g. by FMA contraction or another order of a fused reduction, which every tolerance of the
suite covers: it is derived from float32 error, not from one codegen). Flags the caller set (`XLA_FLAGS=--xla_cpu_max_isa=AVX2 pytest ...`) are kept;
a simulated device count is the one thing a subprocess sets for itself.
"""

import os

from pipo_jax import platforms

# XLA:CPU's collective timeouts are wall-clock: a device thread that is not scheduled for a while
# (the test process paused, or starved on 2 cores by the other test worker's fork / thread bombs)
# makes the others wait at the rendezvous, and after 40 s (XLA's default) the process is aborted
# although nothing is wrong. 600 s keeps a real hang (a participant that never comes) failing.
TERMINATE_TIMEOUT = "--xla_cpu_collective_call_terminate_timeout_seconds"
TEST_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false",
              "--xla_cpu_parallel_codegen_split_count=1", f"{TERMINATE_TIMEOUT}=600")
DEVICE_COUNT = platforms.CPU_DEVICE_COUNT_FLAG

# A subprocess running sharded programs compiles them itself, never loading them from the
# persistent compilation cache (tests/conftest.py): XLA:CPU (jaxlib 0.10.2) orders a program's
# collectives through one shared resource, and deserializing an executable (a cache hit) rebuilds
# that resource once per thunk sequence, so a while loop (a sequence of its own) is no longer
# ordered after the collectives beside it: the devices of one program can reach them in different
# orders and deadlock. The 8-device worker's sharded generate did (the arithmetic task's
# rejection-sampling loop, an all-reduce in its condition, against the sampler's parameter
# all-gathers) in 13 tries of 13 from a warm cache, and never when compiled in the process.
# tests/parallel/test_xla_cpu_cache.py shows the lost order. (The two-process gloo workers also
# hung from a warm cache, idle in their first device-to-host copy; not traced further.)
#
# Two sharded programs in flight together can deadlock too: XLA:CPU runs a program's devices as tasks
# of one shared thread pool, each blocking its thread at a collective's rendezvous, and the pool holds
# about one thread per device, so the 8-device worker once stopped with one program's
# collective-permute waiting while another program's all-reduces held the threads. Every process
# with simulated devices sizes the pool for several programs (`platforms.simulate_cpu_devices`;
# tests/parallel/test_pipelined_programs.py), and the trainer's sharded programs on CPU devices
# return only once finished (`run/sharded_steps.py:ShardedFunction`).
NO_PERSISTENT_CACHE = {"JAX_ENABLE_COMPILATION_CACHE": "false"}

# How long the 8-device workers' devices may wait at one collective before XLA:CPU aborts them (and
# the test fails): minutes, where a starved device thread makes them wait seconds.
SHARDED_WORKER_TERMINATE_S = 180


def xla_flags(*extra: str) -> str:
    """The caller's XLA_FLAGS without a simulated device count, the test flags, then `extra` (a later
    flag replaces the same flag before it, as XLA would read the last)."""
    given = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT)]
    flags = {f.split("=", 1)[0]: f for f in [*given, *TEST_FLAGS, *extra]}
    return " ".join(flags.values())


def sharded_subprocess_env(devices: int | None = None, terminate_timeout_s: int | None = None,
                           **extra: str) -> dict[str, str]:
    """`os.environ` for a JAX subprocess that runs sharded programs on simulated CPU devices:
    XLA_FLAGS (`xla_flags()`; `terminate_timeout_s` for XLA's collective abort instead of 600 s),
    `devices` simulated devices with the thread pool they need (`platforms.simulated_cpu_devices_env`;
    None: the subprocess sets them itself), no persistent compilation cache (`NO_PERSISTENT_CACHE`),
    then `extra`."""
    timeout = () if terminate_timeout_s is None else (f"{TERMINATE_TIMEOUT}={terminate_timeout_s}",)
    env = dict(os.environ, XLA_FLAGS=xla_flags(*timeout), **NO_PERSISTENT_CACHE, **extra)
    if devices is not None:  # the device count, and the thread pool their collectives need
        env.update(platforms.simulated_cpu_devices_env(devices, env))
    return env
