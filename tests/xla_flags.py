"""XLA flags of the test processes and the JAX subprocesses they start.

Most of the suite's time is XLA:CPU compiling many small programs. LLVM's optimisation level 0
compiles them about a third faster (two trainer test files, cold: 33 s -> 23 s on the 2-core
machine) and runs these tiny programs about as fast. It changes no floating-point semantics the
tests rely on (no fast-math at any level; results may differ in the last bits, e.g. by FMA
contraction, which every tolerance of the suite covers: it is derived from float32 error, not
from one codegen). Flags the caller set (`XLA_FLAGS=--xla_cpu_max_isa=AVX2 pytest ...`) are kept;
a simulated device count is the one thing a subprocess sets for itself.
"""

import os

# A collective on simulated CPU devices aborts the process when one device's thread is 40 s late
# at the rendezvous (XLA's default); on a 2-core machine running the other test worker's fork and
# thread bombs beside an 8-device mesh that happens without any fault. 600 s keeps a real hang
# (a missing participant) failing.
TEST_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_collective_call_terminate_timeout_seconds=600")
DEVICE_COUNT = "--xla_force_host_platform_device_count"


def xla_flags(*extra: str) -> str:
    """The caller's XLA_FLAGS without a simulated device count, the test flags, then `extra`."""
    given = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT)]
    return " ".join(dict.fromkeys([*given, *TEST_FLAGS, *extra]))


def device_count_flags(n: int) -> str:
    """`xla_flags` for a subprocess with `n` simulated CPU devices."""
    return xla_flags(f"{DEVICE_COUNT}={n}")
