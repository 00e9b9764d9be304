"""Backend choices follow the target platform, not the host: programs built here for a TPU
carry the TPU kernels (Mosaic, not the Pallas interpreter) and the TPU block sizes."""
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from pipo_jax.kernels import logprobs as lp
from tests.xla_flags import sharded_subprocess_env

ROOT = Path(__file__).resolve().parents[2]


def test_no_host_backend_lookups_in_the_package():
    hits = [str(p.relative_to(ROOT)) for p in (ROOT / "pipo_jax").rglob("*.py") if "default_backend" in p.read_text()]
    assert not hits, hits


@pytest.mark.parametrize("platform,blocks,xla_cpu", [("cpu", (1024, 8192), True), ("tpu", (2048, 8192), False),
                                                      ("cuda", (2048, 8192), False)])
def test_chunked_kernel_config_follows_platform(platform, blocks, xla_cpu):
    cfg = lp.kernel_config(impl="chunked", platform=platform)
    assert (cfg.block_n, cfg.block_v) == blocks and cfg.xla_cpu is xla_cpu and not cfg.interpret


@pytest.mark.parametrize("platform,variant,interpret", [("cpu", "mosaic_tpu", True), ("tpu", "mosaic_tpu", False),
                                                         ("cuda", "triton", False)])
def test_pallas_kernel_config_follows_platform(platform, variant, interpret):
    cfg = lp.kernel_config(impl="pallas", platform=platform)
    assert cfg.variant == variant and cfg.interpret is interpret


def test_pallas_logprobs_exported_for_tpu_from_this_host_are_mosaic():
    """Interpret mode is not left on for a TPU program built on a CPU host."""
    n, d, v = 64, 128, 1024
    args = (jax.ShapeDtypeStruct((n, d), jnp.bfloat16), jax.ShapeDtypeStruct((d, v), jnp.bfloat16),
            jax.ShapeDtypeStruct((n,), jnp.int32))

    def loss(h, w, t):
        return jnp.sum(lp.token_logprobs(h, w, t, lp.kernel_config(impl="pallas", platform="tpu")))

    exported = jax.export.export(jax.jit(jax.grad(loss, (0, 1))), platforms=("tpu",))(*args)
    module = exported.mlir_module()
    assert module.count("tpu_custom_call") == 3  # forward, dh, dw
    # Each kernel tells XLA:TPU's scheduler what it does: the logits' matmul (and the backward passes'
    # cotangent matmul), one exp per logit, h and w read: w once per block of rows (one here), h once
    # per block of vocabulary columns that the dw grid revisits (1024 / 512).
    estimates = [(int(f), int(t), int(b)) for b, f, t in re.findall(
        r'bytes_accessed\\22:(\d+),\\0A\\22flops\\22:(\d+),\\0A\\22remote_bytes_transferred\\22:0,\\0A'
        r'\\22transcendentals\\22:(\d+)', module)]
    h_bytes, w_bytes = n * d * 2, d * v * 2
    assert sorted(estimates) == sorted([
        (2 * n * d * v, n * v, h_bytes + n * 4 + w_bytes + 2 * n * 4),  # forward: lse and the target's logit
        (4 * n * d * v, n * v, h_bytes + 4 * n * 4 + w_bytes + n * d * 4),  # dh: targets, three cotangents
        (4 * n * d * v, n * v, 2 * (h_bytes + 4 * n * 4) + w_bytes + d * v * 2)])  # dw


def test_unknown_platform_is_rejected():
    h, w, t = jnp.zeros((4, 8)), jnp.zeros((8, 16)), jnp.zeros((4,), jnp.int32)
    with pytest.raises(ValueError, match="platform='gpu'"):
        lp.token_logprobs(h, w, t, lp.kernel_config(impl="chunked", platform="gpu"))


@pytest.mark.slow  # ~70 s: a fresh interpreter compiling 6 sharded programs
def test_kernels_that_cannot_be_partitioned_run_under_shard_map_on_4_devices():
    """Pallas log-prob (tensor = 1 and 2), splash attention and the KV cache sharding on a mesh
    (tests/kernels/mesh_kernels_case.py, in a fresh interpreter with 4 host devices)."""
    env = sharded_subprocess_env(4, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.mesh_kernels_case"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(" ok\n") == 6, proc.stdout
