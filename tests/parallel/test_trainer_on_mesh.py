"""The main job (`experiments.train`) on 4 simulated devices equals the single-device job.

A subprocess with 4 CPU devices runs GRPO+PIPO on the micro config in two legs: two
iterations on mesh data=1 x fsdp=2 x tensor=2 with the jitted scan loop (log-probs
vocab-parallel), then a resume to four iterations on mesh data=4 with the host loop
(sharded sampler, per-process host reward, sharded learn), so the checkpoint of one
mesh is restored onto another. Its metrics and exported weights must equal four
iterations of the same config run here on one device.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from pipo_jax.models import hf
from pipo_jax.config.sections import RunConfig
from pipo_jax.run.trainer import base_params
from tests.parallel.equivalence import UPDATE_RTOL
from tests.rl.micro_trainer import micro
from tests.xla_flags import sharded_subprocess_env
from tests.typed import spec_of, train_config

pytestmark = pytest.mark.slow  # the main job three times, twice in a 4-device subprocess

REPO = Path(__file__).resolve().parents[2]
FLAGS = ["--config=configs/grpo.py:micro", "--config.pipo.enabled=true", "--config.iterations=4"]
SKIP = ("time", "per_s", "warmup")  # wall clock and the warm-up row (only the first leg has it)


def _run_job(workdir: Path, *flags: str) -> None:
    env = sharded_subprocess_env(4, JAX_PLATFORMS="cpu")  # no persistent compilation cache (tests/xla_flags.py)
    proc = subprocess.run([sys.executable, "-m", "experiments.train", *FLAGS, *flags, f"--workdir={workdir}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1500, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stderr


def _rows(workdir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows}


def test_job_on_two_meshes_with_resume_equals_one_device(tmp_path):
    log1 = _run_job(tmp_path / "mesh", "--config.iterations=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2")
    assert "mesh: data=1 fsdp=2 tensor=2 (4 devices, 1 process)" in log1
    log2 = _run_job(tmp_path / "mesh", "--config.mesh.data=4", "--config.log.jit_loop=false")
    assert "mesh: data=4 fsdp=1 tensor=1 (4 devices, 1 process)" in log2 and "resumed from" in log2

    c = micro("grpo", iterations=4)
    train_config(c, str(tmp_path / "single"))
    single, sharded = _rows(tmp_path / "single"), _rows(tmp_path / "mesh")
    assert sorted(sharded) == sorted(single) == [0, 1, 2, 3, 4]
    compared = 0
    for step, row in single.items():
        for key, value in row.items():
            if any(s in key for s in SKIP) or not isinstance(value, (int, float)):
                continue
            assert key in sharded[step], (step, key)
            np.testing.assert_allclose(sharded[step][key], value, rtol=1e-4, atol=1e-5, err_msg=f"step {step} {key}")
            compared += 1
    assert compared > 100
    assert any(single[s]["pi_step_applied"] == 1.0 for s in (3, 4)), "the PI step must be exercised"

    def weights(run: str) -> dict:
        return load_file(str(tmp_path / run / "hf_export" / "model.safetensors"))

    a, b = weights("single"), weights("mesh")
    assert sorted(a) == sorted(b)
    # The RL starting point (the warm-up's weights), to measure the update against.
    spec = spec_of(c)
    hf.save(str(tmp_path / "base"), spec.model, base_params(spec, RunConfig.from_config(c), []))
    base = load_file(str(tmp_path / "base" / "model.safetensors"))
    # Sharding reorders float32 sums, and AdamW turns an element's rounding-level gradient into a
    # step of about +-lr of either sign (tests/parallel/equivalence.py): element-wise within one such
    # step per optimizer step, and the run's whole update to 1e-3 relative L2.
    steps = sum(int(r["pi_step_applied"]) for r in single.values() if "pi_step_applied" in r) + 4 * c.train.epochs * (
        c.rollout.prompts_per_batch // c.train.mini_batch_prompts)
    lr = max(c.train.lr, c.pipo.lr)
    num = den = 0.0
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=0, atol=steps * lr, err_msg=name)
        num += float(np.sum((b[name].astype(np.float64) - a[name]) ** 2))
        den += float(np.sum((a[name].astype(np.float64) - base[name]) ** 2))
    assert den > 0 and np.sqrt(num / den) < UPDATE_RTOL, np.sqrt(num / den)
