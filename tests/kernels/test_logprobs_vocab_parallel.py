"""`token_logprobs_vocab_parallel` under shard_map on 4 host devices equals the reference.

The device count has to be set before jax initialises, so the check runs in a fresh
interpreter (tests/kernels/vocab_parallel_case.py) instead of changing this process.
"""
import subprocess
import sys
from pathlib import Path

import pytest
from tests.xla_flags import sharded_subprocess_env

pytestmark = pytest.mark.slow  # a fresh JAX process with 4 host devices


def test_vocab_parallel_equals_reference_on_4_devices():
    root = Path(__file__).resolve().parents[2]
    env = sharded_subprocess_env(4, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.vocab_parallel_case"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 2 meshes x (4 impls x (logp, entropy, dh, dw) + 2 lowerings), all reported ok.
    assert proc.stdout.count(" ok\n") == 36, proc.stdout
