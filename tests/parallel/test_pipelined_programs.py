"""Multi-device programs dispatched back to back on simulated CPU devices finish (the thread pool
of `platforms.simulate_cpu_devices`), and the environment helpers set what they say."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipo_jax import platforms
from tests.xla_flags import sharded_subprocess_env

ROOT = Path(__file__).resolve().parents[2]


def test_programs_in_flight_together_finish_on_8_simulated_devices():
    # 60 s collective abort: a deadlock fails fast; without the pool sizing this one fails every time
    env = sharded_subprocess_env(terminate_timeout_s=60, JAX_PLATFORMS="cpu")
    env.pop("PJRT_NPROC", None)
    proc = subprocess.run([sys.executable, "-m", "tests.parallel.pipelined_programs_case", "100"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr[-3000:]


def test_simulated_devices_env_replaces_the_count_and_keeps_a_larger_pool():
    env = {"XLA_FLAGS": "--xla_cpu_max_isa=AVX2 --xla_force_host_platform_device_count=2", "PJRT_NPROC": "64"}
    assert platforms.simulated_cpu_devices_env(8, env) == {
        "XLA_FLAGS": "--xla_cpu_max_isa=AVX2 --xla_force_host_platform_device_count=8", "PJRT_NPROC": "64"}
    assert platforms.simulated_cpu_devices_env(8, {}) == {
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "PJRT_NPROC": "32"}
    assert platforms.requested_cpu_devices(env) == 2
    assert platforms.requested_cpu_devices({}, default=8) == 8
